"""``ratchet sandboxes [RUN]``: the sandboxes of isolated runs."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ratchet.cli._common import DbOption, JsonOption, client, make_console
from ratchet.cli._format import echo_json, status_text, when


def _memory(n: int | None) -> str:
    return "-" if n is None else f"{n / (1024 * 1024):.0f} MiB"


def sandboxes(
    ctx: typer.Context,
    run_id: Annotated[
        str | None,
        typer.Argument(metavar="[RUN_ID]", help="Only this run's sandboxes, by attempt."),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, metavar="N", help="At most this many, newest first.")
    ] = 100,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Sandboxes of isolated runs: run, attempt, status, started and ended, exit code or
    signal, peak memory and why each ended (finished, crashed, oom, timeout, killed,
    orphaned, shutdown)."""
    with client(ctx, db, read_only=True) as app:
        found = app.sandboxes(run_id, limit)
    if as_json:
        echo_json([s.as_dict() for s in found])
        return
    console = make_console()
    if not found:
        console.print(f"run {run_id} has no sandboxes" if run_id else "no sandboxes yet")
        return
    table = Table(
        "sandbox", "run_id", "attempt", "status", "started", "ended", "exit", "peak memory", "why"
    )
    for s in found:
        exit = (
            f"signal {s.signal}"
            if s.signal is not None
            else "-"
            if s.exit_code is None
            else str(s.exit_code)
        )
        table.add_row(
            Text(s.sandbox_id),
            Text(s.run_id),
            str(s.attempt),
            status_text(s.status),
            when(s.started_at),
            when(s.ended_at),
            exit,
            _memory(s.peak_memory),
            Text(s.end_reason or "-"),
        )
    console.print(table)
