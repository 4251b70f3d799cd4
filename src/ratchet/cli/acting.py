"""``ratchet signal``, ``cancel`` and ``retry``: acting on a run."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ratchet.cli._common import DbOption, GrantOption, RunArg, client, die, grant_option
from ratchet.cli._format import waiting_text
from ratchet.model import RunRecord, RunStatus, dumps


def signal_(
    ctx: typer.Context,
    run_id: RunArg,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The signal's name.")],
    data: Annotated[
        str | None, typer.Option("--data", metavar="JSON", help="The signal's data, as JSON.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Send a signal to a run and print its status after it: a run waiting for it wakes
    up (queued again); otherwise the run gets it when it asks for it."""
    payload: Any = None
    if data is not None:
        try:
            payload = json.loads(data)
        except json.JSONDecodeError as e:
            die(f"--data is not valid JSON ({e}); nothing was sent")
    with client(ctx, db) as app:
        before = app.get(run_id)
        app.signal(run_id, name, payload)
        after = app.get(run_id)
    if before.status == RunStatus.WAITING and after.status != RunStatus.WAITING:
        why = "it waited for it and woke"
    elif after.status == RunStatus.WAITING:
        waits = waiting_text(after) or "waiting"
        why = f"{waits}; the signal is kept until the run asks for it"
    else:
        why = "the signal is kept until the run asks for it"
    typer.echo(f"signal {name!r} sent to run {run_id}; status now {after.status} ({why})")


def cancel(
    ctx: typer.Context,
    run_id: RunArg,
    by: Annotated[
        str | None,
        typer.Option("--by", metavar="NAME", help="Who cancels it, for the journal."),
    ] = None,
    db: DbOption = None,
) -> None:
    """Cancel a run and print its status after the request."""
    with client(ctx, db) as app:
        before = app.get(run_id).status
        status = before if before.terminal else app.cancel(run_id, by=by)
    if before.terminal:
        typer.echo(f"run {run_id}: already {status}; nothing to cancel")
    elif status == RunStatus.CANCELLED:
        typer.echo(f"run {run_id}: cancelled")
    else:
        typer.echo(
            f"run {run_id}: {status}, cancel requested (its worker will finish it as cancelled)"
        )


def retry(
    ctx: typer.Context,
    run_id: RunArg,
    grant: GrantOption = None,
    by: Annotated[
        str | None,
        typer.Option("--by", metavar="NAME", help="Who retries it (needed with --grant)."),
    ] = None,
    db: DbOption = None,
) -> None:
    """Re-queue a dead-lettered run; it resumes after its last completed step. It keeps
    its limits (a budget it crossed stops it again) unless --grant moves them."""
    granted = grant_option(grant)
    with client(ctx, db) as app:
        rec: RunRecord = app.retry(run_id, grant=granted, by=by)
    moved = f", granted {dumps(granted)} by {by}" if granted else ""
    typer.echo(f"run {run_id}: re-queued (status: {rec.status}){moved}")
