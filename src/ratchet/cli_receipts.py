"""``ratchet receipt``, ``export``, ``verify``, ``keys show`` and ``prune``: signed run
receipts, the journal as JSON lines, offline verification, and retention. Registered on
:data:`ratchet.cli.cli`.

``ratchet receipt`` (one signed receipt over a run's journal) is not ``ratchet receipts``
(the delivery receipts of a run's side effects)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated

import typer

from ratchet.cli import DbOption, RunArg, _client, _db_url, _errors, _Fail, cli
from ratchet.config import data_dir, parse_age
from ratchet.engine.retention import DEFAULT_STATUSES, parse_statuses
from ratchet.errors import JournalPruned
from ratchet.model import dumps
from ratchet.receipts import VerificationFailed, load_public_key, load_signer, verify
from ratchet.store import retention

EXPORT_PAGE = 1000

keys_cli = typer.Typer(help="The key that signs run receipts.", no_args_is_help=True)
cli.add_typer(keys_cli, name="keys")


@contextlib.contextmanager
def _output(path: Path | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    try:
        f = path.open("w", encoding="utf-8")
    except OSError as e:
        raise _Fail(f"cannot write {str(path)!r}: {e.strerror or e}") from e
    with f:
        yield f


OutputOption = Annotated[
    Path | None,
    typer.Option("--output", "-o", metavar="FILE", help="Write here instead of to stdout."),
]


@keys_cli.command("show")
def keys_show(ctx: typer.Context, output: OutputOption = None, db: DbOption = None) -> None:
    """Print the receipt signing key's public half (PEM) after a line with its id.

    The key is RATCHET_SIGNING_KEY (a PEM file), else signing_key.pem in the data
    directory (RATCHET_DATA_DIR, else the SQLite database's folder, else ./.ratchet),
    made there the first time."""
    with _errors():
        signer = load_signer(data_dir(_db_url(ctx, db)))
        with _output(output) as out:
            out.write(f"# key id {signer.key_id} ({signer.path})\n{signer.public_pem}")


@cli.command()
def receipt(
    ctx: typer.Context, run_id: RunArg, output: OutputOption = None, db: DbOption = None
) -> None:
    """A finished run's signed receipt (a DSSE envelope over its journal's hash chain),
    as JSON; signed now if it has none. For delivery receipts, see `ratchet receipts`."""
    with _client(ctx, db) as app:
        envelope = app.run_receipt(run_id)
        with _output(output) as out:
            out.write(json.dumps(envelope) + "\n")


@cli.command()
def export(
    ctx: typer.Context,
    run_id: RunArg,
    output: OutputOption = None,
    db: DbOption = None,
) -> None:
    """Write a run's journal as JSON lines, one event per line with its hashes: what
    `ratchet verify` checks a receipt against."""
    with _client(ctx, db, read_only=True) as app:
        app.get(run_id)
        store = app.store
        if app.portal.call(retention.pruned_at(store, run_id)) is not None:
            raise _Fail(
                str(
                    JournalPruned(
                        f"the journal of run {run_id} was pruned; its "
                        "receipt was kept (ratchet receipt)"
                    )
                )
            )
        with _output(output) as out:
            after = 0
            while batch := app.portal.call(store.load_events(run_id, after, EXPORT_PAGE)):
                out.writelines(dumps(ev.export_dict()) + "\n" for ev in batch)
                after = batch[-1].seq


@cli.command("verify")
def verify_cmd(
    receipt_file: Annotated[
        Path,
        typer.Argument(metavar="RECEIPT", help="The receipt, as `ratchet receipt` printed it."),
    ],
    events: Annotated[
        Path,
        typer.Option(
            "--events", metavar="EVENTS.jsonl", help="The journal, as `ratchet export` wrote it."
        ),
    ],
    public_key: Annotated[
        Path,
        typer.Option(
            "--public-key",
            metavar="KEY",
            help="The signer's public key (PEM), as `ratchet keys show` printed it.",
        ),
    ],
) -> None:
    """Check a receipt offline, with no database: its signature with KEY, then the journal's
    hash chain event by event. Exit 0 if it holds; else 1, naming the first bad seq or the
    reason."""
    with _errors():
        key = load_public_key(public_key)
        try:
            envelope = json.loads(receipt_file.read_text("utf-8"))
            lines = events.open(encoding="utf-8")
        except OSError as e:
            raise _Fail(f"cannot read {e.filename!r}: {e.strerror or e}") from e
        except ValueError as e:
            raise _Fail(f"{str(receipt_file)!r} is not JSON: {e}") from e
        with lines:
            try:
                ok = verify(envelope, lines, key)
            except VerificationFailed as e:
                raise _Fail(f"verification failed: {e}", code=1) from e
    typer.echo(
        f"ok: run {ok.run_id} ({ok.status}), {ok.event_count} events, chain head "
        f"{ok.head}, signed by key {ok.key_id}"
    )


@cli.command("prune")
def prune_cmd(
    ctx: typer.Context,
    finished_before: Annotated[
        str,
        typer.Option(
            "--finished-before",
            metavar="AGE",
            help="Prune runs that finished longer ago than this: 30d, 12h, 90m.",
        ),
    ],
    status: Annotated[
        str,
        typer.Option(
            "--status", metavar="LIST", help="Only runs with these statuses (comma-separated)."
        ),
    ] = ",".join(DEFAULT_STATUSES),
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be pruned; change nothing.")
    ] = False,
    db: DbOption = None,
) -> None:
    """Delete the journals of runs that finished more than AGE ago, in small batches. Their
    signed receipts stay (one is signed first where missing), as do the runs themselves."""
    with _errors():
        age = parse_age(finished_before)
        statuses = parse_statuses(status)
    with _client(ctx, db) as app:
        report = app.prune(age, statuses=statuses, dry_run=dry_run)
    verb = "would prune" if dry_run else "pruned"
    line = (
        f"{verb} {report.runs} runs ({report.events} events) that finished more than "
        f"{finished_before} ago"
    )
    if report.skipped:
        line += f"; {report.skipped} left alone (no receipt could be signed)"
    typer.echo(line)
