"""``ratchet prune``: retention, deleting the journals of runs finished long ago (their
signed receipts stay)."""

from __future__ import annotations

from typing import Annotated

import typer

from ratchet.cli._common import DbOption, client, errors
from ratchet.config import parse_age
from ratchet.engine.retention import DEFAULT_STATUSES, parse_statuses


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
        bool,
        typer.Option("--dry-run", help="Count what would be pruned; change nothing."),
    ] = False,
    db: DbOption = None,
) -> None:
    """Delete the journals of runs that finished more than AGE ago, in small batches. Their
    signed receipts stay (one is signed first where missing), as do the runs themselves."""
    with errors():
        age = parse_age(finished_before)
        statuses = parse_statuses(status)
    with client(ctx, db) as app:
        report = app.prune(age, statuses=statuses, dry_run=dry_run)
    verb = "would prune" if dry_run else "pruned"
    line = (
        f"{verb} {report.runs} runs ({report.events} events) that finished more than "
        f"{finished_before} ago"
    )
    if report.skipped:
        line += f"; {report.skipped} left alone (no receipt could be signed)"
    typer.echo(line)
