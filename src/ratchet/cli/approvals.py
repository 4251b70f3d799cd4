"""``ratchet approvals``, ``ratchet approve`` and ``ratchet reject``: what runs wait for a
person to decide, and deciding it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ratchet.cli._common import (
    DbOption,
    GrantOption,
    JsonOption,
    RunArg,
    client,
    grant_option,
    make_console,
)
from ratchet.cli._format import echo_json, when
from ratchet.model import Approval, Decision, dumps

StepArg = Annotated[
    str,
    typer.Argument(
        metavar="STEP",
        help="The approval's step id, or its name when the run asked only one "
        "pending approval of that name.",
    ),
]
ByOption = Annotated[str, typer.Option("--by", metavar="NAME", help="Who decides.")]
CommentOption = Annotated[
    str | None, typer.Option("--comment", metavar="TEXT", help="Why, for the record.")
]


def _row(a: Approval) -> dict[str, object]:
    return {
        "run_id": a.run_id,
        "step_id": a.step_id,
        "name": a.name,
        "data": a.data,
        "since": a.asked_at,
        "deadline": a.deadline,
        "root_run_id": a.root_run_id,
        "parent_run_id": a.parent_run_id,
    }


def approvals(
    ctx: typer.Context,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run", metavar="RUN_ID", help="Only this run's, and those of the runs under it."
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, metavar="N", help="At most this many, oldest first.")
    ] = 100,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Pending approvals: run, step, what is asked and its data, since when, and for a
    child run's approval the top-level run it belongs to."""
    with client(ctx, db, read_only=True) as app:
        pending = app.approvals(run_id, limit)
    if as_json:
        echo_json([_row(a) for a in pending])
        return
    console = make_console()
    if not pending:
        console.print("no approvals are pending")
        return
    table = Table("run_id", "step", "what", "data", "since", "top-level run")
    table.columns[0].no_wrap = True
    for a in pending:
        table.add_row(
            Text(a.run_id),
            Text(a.step_id),
            Text(a.name),
            Text(dumps(a.data)),
            when(a.asked_at),
            Text(a.root_run_id if a.root_run_id != a.run_id else "-"),
        )
    console.print(table)


def _decided(run_id: str, step: str, decision: Decision) -> None:
    verb = "approved" if decision.approved else "rejected"
    comment = f" ({decision.comment})" if decision.comment else ""
    granted = f", granted {dumps(decision.grant)}" if decision.grant is not None else ""
    typer.echo(f"run {run_id}: approval {step!r} {verb} by {decision.by}{comment}{granted}")


def approve(
    ctx: typer.Context,
    run_id: RunArg,
    step: StepArg,
    by: ByOption,
    comment: CommentOption = None,
    grant: GrantOption = None,
    db: DbOption = None,
) -> None:
    """Approve a run's pending approval; the run wakes and goes on. Recorded once. On a
    guard's pause of a budget or of max_steps, --grant says how far the run may go over
    (without it: a budget rises to what the paused call needed, max_steps is lifted)."""
    granted = grant_option(grant)
    with client(ctx, db) as app:
        decision = app.approve(run_id, step, by=by, comment=comment, grant=granted)
    _decided(run_id, step, decision)


def reject(
    ctx: typer.Context,
    run_id: RunArg,
    step: StepArg,
    by: ByOption,
    comment: CommentOption = None,
    db: DbOption = None,
) -> None:
    """Reject a run's pending approval; the run wakes with the rejection. Recorded once."""
    with client(ctx, db) as app:
        decision = app.reject(run_id, step, by=by, comment=comment)
    _decided(run_id, step, decision)
