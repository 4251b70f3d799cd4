"""``ratchet queues`` (list) and ``ratchet queues set NAME``: queues and their limits, which
hold for the whole fleet (see docs/how-to/queues.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from ratchet.cli._common import (
    DbOption,
    Fail,
    JsonOption,
    ReadableGroup,
    client,
    errors,
    make_console,
)
from ratchet.cli._format import echo_json
from ratchet.store.queues import QueueView

queues_cli = typer.Typer(
    cls=ReadableGroup,
    help="Queues and their limits: list them, or change one's limits for the whole fleet.",
    invoke_without_command=True,
)

NONE = "none"  # an option's value that removes the limit


def _rate(view: QueueView) -> str:
    rate = view.limits.rate
    return "-" if rate is None else f"{rate.limit}/{rate.per_s:g}s"


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


@queues_cli.callback()
def queues(
    ctx: typer.Context,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Every queue the fleet declared: its depth (runs queued), runs in flight and limits."""
    if ctx.invoked_subcommand is not None:
        return
    with client(ctx, db, read_only=True) as app:
        found = app.queues()
    if as_json:
        echo_json([v.as_dict() for v in found])
        return
    console = make_console()
    if not found:
        console.print("no queues; declare one with app.queue(NAME, concurrency=N)")
        return
    table = Table(
        "queue", "depth", "in flight", "concurrency", "per key", "rate", "parked", "set by"
    )
    for v in found:
        table.add_row(
            Text(v.limits.name),
            str(v.depth),
            str(v.in_flight),
            _limit(v.limits.concurrency),
            _limit(v.limits.per_key_concurrency),
            _rate(v),
            "hold" if v.limits.hold_while_parked else "-",
            v.set_by,
        )
    console.print(table)


def _count(value: str, flag: str) -> int | None:
    if value.lower() == NONE:
        return None
    try:
        return int(value)
    except ValueError:
        raise Fail(f"invalid {flag} {value!r}: expected an integer >= 1 or 'none'") from None


def _parse_rate(value: str) -> dict[str, Any] | None:
    if value.lower() == NONE:
        return None
    limit, _, per = value.partition("/")
    try:
        return {"limit": int(limit), "per_s": float(per.removesuffix("s") or 1)}
    except ValueError:
        raise Fail(
            f"invalid --rate {value!r}: expected K/S (K first drives per S seconds, "
            "e.g. 50/60) or 'none'"
        ) from None


@queues_cli.command("set")
def set_(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="A declared queue.")],
    concurrency: Annotated[
        str | None,
        typer.Option("--concurrency", metavar="N", help="Runs in flight at most; none: no limit."),
    ] = None,
    per_key_concurrency: Annotated[
        str | None,
        typer.Option(
            "--per-key-concurrency",
            metavar="M",
            help="Runs in flight per concurrency key at most; none: no limit.",
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            metavar="RATE",
            help="K/S: K first drives per S seconds (50/60); none: no limit.",
        ),
    ] = None,
    hold_while_parked: Annotated[
        bool | None,
        typer.Option(
            "--hold-while-parked/--free-while-parked",
            help="Whether a parked run keeps its slot.",
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Change a queue's limits for the whole fleet, at once (every worker's next claim obeys
    them); the options given, the rest as they are. They stand over the code's declaration
    until changed again."""
    changes: dict[str, Any] = {}
    with errors():
        if concurrency is not None:
            changes["concurrency"] = _count(concurrency, "--concurrency")
        if per_key_concurrency is not None:
            changes["per_key_concurrency"] = _count(per_key_concurrency, "--per-key-concurrency")
        if rate is not None:
            changes["rate"] = _parse_rate(rate)
        if hold_while_parked is not None:
            changes["hold_while_parked"] = hold_while_parked
        if not changes:
            raise Fail(
                "nothing to change: give --concurrency, --per-key-concurrency, --rate or "
                "--hold-while-parked"
            )
    with client(ctx, db) as app:
        limits = app.set_queue_limits(name, **changes)
    rate_text = "-" if limits.rate is None else f"{limits.rate.limit}/{limits.rate.per_s:g}s"
    typer.echo(
        f"queue {limits.name}: concurrency {_limit(limits.concurrency)}, per key "
        f"{_limit(limits.per_key_concurrency)}, rate {rate_text}, "
        f"{'holds' if limits.hold_while_parked else 'frees'} slots while parked"
    )
