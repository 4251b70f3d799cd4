"""``ratchet receipt``, ``export``, ``verify`` and ``keys show``: signed run receipts, the
journal as JSON lines, and offline verification.

``ratchet receipt`` (one signed receipt over a run's journal) is not ``ratchet receipts``
(the delivery receipts of a run's side effects, :mod:`ratchet.cli.delivery_receipts`)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated

import typer

from ratchet.cli._common import DbOption, Fail, ReadableGroup, RunArg, client, db_url, errors
from ratchet.config import data_dir
from ratchet.errors import JournalPruned
from ratchet.model import dumps
from ratchet.receipts import VerificationFailed, load_public_key, load_signer, verify
from ratchet.store import retention

EXPORT_PAGE = 1000

keys_cli = typer.Typer(
    cls=ReadableGroup, help="The key that signs run receipts.", no_args_is_help=True
)


@contextlib.contextmanager
def _output(path: Path | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    try:
        f = path.open("w", encoding="utf-8")
    except OSError as e:
        raise Fail(f"cannot write {str(path)!r}: {e.strerror or e}") from e
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
    with errors():
        signer = load_signer(data_dir(db_url(ctx, db)))
        with _output(output) as out:
            out.write(f"# key id {signer.key_id} ({signer.path})\n{signer.public_pem}")


def receipt(
    ctx: typer.Context, run_id: RunArg, output: OutputOption = None, db: DbOption = None
) -> None:
    """A finished run's signed receipt (a DSSE envelope over its journal's hash chain),
    as JSON; signed now if it has none. For delivery receipts, see `ratchet receipts`."""
    with client(ctx, db) as app:
        envelope = app.run_receipt(run_id)
        with _output(output) as out:
            out.write(json.dumps(envelope) + "\n")


def export(
    ctx: typer.Context,
    run_id: RunArg,
    output: OutputOption = None,
    db: DbOption = None,
) -> None:
    """Write a run's journal as JSON lines, one event per line with its hashes: what
    `ratchet verify` checks a receipt against."""
    with client(ctx, db, read_only=True) as app:
        app.get(run_id)
        store = app.store
        if app.portal.call(retention.pruned_at(store, run_id)) is not None:
            raise Fail(
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
    with errors():
        key = load_public_key(public_key)
        try:
            envelope = json.loads(receipt_file.read_text("utf-8"))
            lines = events.open(encoding="utf-8")
        except OSError as e:
            raise Fail(f"cannot read {e.filename!r}: {e.strerror or e}") from e
        except ValueError as e:
            raise Fail(f"{str(receipt_file)!r} is not JSON: {e}") from e
        with lines:
            try:
                ok = verify(envelope, lines, key)
            except VerificationFailed as e:
                raise Fail(f"verification failed: {e}", code=1) from e
    typer.echo(
        f"ok: run {ok.run_id} ({ok.status}), {ok.event_count} events, chain head "
        f"{ok.head}, signed by key {ok.key_id}"
    )
