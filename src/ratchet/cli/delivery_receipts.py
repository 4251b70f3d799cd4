"""``ratchet receipts RUN`` and ``ratchet receipts settle KEY``: a run's delivery receipts
(one per side effect it sent), and settling one by hand. For the signed receipt over a
run's journal, see :mod:`ratchet.cli.run_receipts`."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from ratchet.cli._common import (
    DbOption,
    JsonOption,
    ReadableGroup,
    RunArg,
    client,
    die,
    make_console,
)
from ratchet.cli._format import STATUS_STYLE, compact, echo_json, when
from ratchet.model import RunStatus


class _ReceiptsGroup(ReadableGroup):
    """``ratchet receipts RUN`` lists (the ``list`` command); ``ratchet receipts settle
    KEY`` settles. A first word that names no command is a run id."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # ctx: a click Context
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["list", *args]
        return super().parse_args(ctx, args)


receipts_cli = typer.Typer(
    cls=_ReceiptsGroup,
    no_args_is_help=True,
    help="A run's delivery receipts (one per side effect it sent), and settling one by "
    "hand. For the signed receipt over a run's journal, see `ratchet receipt`.\n\n"
    "`ratchet receipts RUN` lists them (same as `ratchet receipts list RUN`); "
    "`ratchet receipts settle KEY --response JSON | --failed` resolves one a crash "
    "left claimed.",
)


@receipts_cli.command("list")
def receipts_list(
    ctx: typer.Context, run_id: RunArg, as_json: JsonOption = False, db: DbOption = None
) -> None:
    """A run's receipts: key, step, delivery, status, response, times."""
    with client(ctx, db, read_only=True) as app:
        found = app.receipts(run_id)
    if as_json:
        echo_json([r.as_dict() for r in found])
        return
    console = make_console()
    if not found:
        console.print(Text(f"run {run_id} has no receipts"))
        return
    table = Table("key", "step", "delivery", "attempt", "status", "response", "claimed", "settled")
    table.columns[0].no_wrap = True
    for r in found:
        status = r.status + (" (by hand)" if r.settled_by == "hand" else "")
        response = compact(r.response) if r.status == "settled" else "-"
        table.add_row(
            Text(r.idempotency_key),
            Text(r.step_id),
            Text(r.delivery),
            str(r.attempt) if r.attempt is not None else "-",
            Text(status, style=STATUS_STYLE.get(r.status, "")),
            Text(response),
            when(r.claimed_at),
            when(r.settled_at),
        )
    console.print(table)


@receipts_cli.command("settle")
def receipts_settle(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(metavar="KEY", help="The receipt's idempotency key.")],
    response: Annotated[
        str | None,
        typer.Option(
            "--response",
            metavar="JSON",
            help="What the receiver answered, as JSON: the step returns it without dispatching.",
        ),
    ] = None,
    failed: Annotated[
        bool,
        typer.Option(
            "--failed",
            help="The delivery did not happen: the step's deliver raises "
            "DeliveryFailed instead of dispatching.",
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Settle a receipt left claimed (by a crash between dispatch and settle) by hand.

    Give exactly one of --response JSON and --failed. The run then goes on without
    dispatching the delivery again; a dead-lettered run after `ratchet retry RUN`.
    """
    if (response is None) == (not failed):
        die(
            "give either --response JSON or --failed, not "
            + ("both" if failed else "neither")
            + "; nothing was settled"
        )
    value: Any = None
    if response is not None:
        try:
            value = json.loads(response)
        except json.JSONDecodeError as e:
            die(f"--response is not valid JSON ({e}); nothing was settled")
    with client(ctx, db) as app:
        if failed:
            r = app.settle_receipt(key, failed=True)
        else:
            r = app.settle_receipt(key, response=value)
        status = app.get(r.run_id).status
    what = "failed (not delivered)" if failed else f"settled with {compact(value)}"
    typer.echo(f"receipt {key} (run {r.run_id}, step {r.step_id}, delivery {r.delivery}): {what}")
    if status == RunStatus.FAILED:
        typer.echo(
            f"run {r.run_id} is dead-lettered: `ratchet retry {r.run_id}` resumes it "
            "without dispatching this delivery again"
        )
    elif not status.terminal:
        typer.echo(f"run {r.run_id} ({status}) uses it when its step runs again")
