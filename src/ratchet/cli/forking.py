"""``ratchet fork``, ``resume`` and ``diff``: a run forked from one of its steps, a
cancelled run queued again, two runs side by side."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from ratchet.app import Ratchet
from ratchet.app.base import UNSET
from ratchet.cli._common import (
    DbOption,
    Fail,
    JsonOption,
    RunArg,
    app_on_db,
    client,
    die,
    errors,
    json_option,
    make_console,
)
from ratchet.cli._format import compact, cost_text, echo_json, status_text
from ratchet.errors import UnknownWorkflow
from ratchet.model import StepSide

ByOption = Annotated[
    str | None, typer.Option("--by", metavar="WHO", help="Who does it, for the journal.")
]
DIFF_STYLE = {"same": "dim", "changed": "yellow", "only_a": "red", "only_b": "green"}


def fork(
    ctx: typer.Context,
    run_id: RunArg,
    at: Annotated[
        str,
        typer.Option(
            "--at",
            metavar="STEP",
            help='The fork point: a step id of the run, e.g. "3:summarize" (see ratchet show).',
        ),
    ],
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            metavar="JSON",
            help="Replace the output of the step at --at: the fork goes on after it with "
            "this value.",
        ),
    ] = None,
    input: Annotated[
        str | None,
        typer.Option(
            "--input",
            metavar="JSON",
            help="Other input for the fork: a code workflow's arguments by name, a graph's "
            "input. Default: the run's.",
        ),
    ] = None,
    app_spec: Annotated[
        str | None,
        typer.Option(
            "--app",
            metavar="APP",
            help="module:attribute of the Ratchet app whose workflow the run is (a code "
            "workflow's fork is checked against it).",
        ),
    ] = None,
    by: ByOption = None,
    db: DbOption = None,
) -> None:
    """Fork a run at one of its steps and print the new run's id. The fork starts with
    copies of the run's completed steps before --at (replayed, at no cost) and runs from
    --at on; the run itself is not changed. A worker serving the workflow drives it."""
    if output is not None and input is not None:
        die("give --output (an edited output of the step at --at) or --input, not both")
    edit = None if output is None else {at: json_option("--output", output, UNSET)}
    given = json_option("--input", input, UNSET)
    if app_spec is not None:
        with errors(), app_on_db(ctx, app_spec, db) as app:
            new = _fork(app, run_id, at, given, edit, by)
    else:
        with client(ctx, db) as app:
            try:
                new = _fork(app, run_id, at, given, edit, by)
            except UnknownWorkflow as e:
                raise Fail(f"{e} (a code workflow's run forks with --app APP)") from e
    typer.echo(new)


def _fork(
    app: Ratchet, run_id: str, at: str, given: Any, edit: dict[str, Any] | None, by: str | None
) -> str:
    """The fork, its input checked as it came (JSON, as ``ratchet start`` checks it)."""
    call = app.fork_run_async(run_id, at, input=given, edit=edit, by=by, strict=True)
    return app.portal.call(call).run_id


def resume(ctx: typer.Context, run_id: RunArg, by: ByOption = None, db: DbOption = None) -> None:
    """Queue a cancelled run again, under its own id: it goes on from its last completed
    step. Any other status is refused, and nothing changes."""
    with client(ctx, db) as app:
        app.resume(run_id, by=by)
    typer.echo(f"run {run_id}: resumed (queued)")


def _cell(side: StepSide | None) -> Text:
    if side is None:
        return Text("-", style="dim")
    text = status_text(side.status)
    shown = side.error if side.status == "failed" else compact(side.output, 60)
    text.append(f" {shown}")
    return text


def _spend(side: StepSide | None) -> str:
    if side is None or side.input_tokens is None:
        return "-"
    tokens = f"{(side.input_tokens or 0) + (side.output_tokens or 0):,} tok"
    return tokens if side.cost_usd is None else f"{tokens} {cost_text(side.cost_usd)}"


def _took(side: StepSide | None) -> str:
    if side is None or side.duration_ms is None:
        return "-"
    return f"{side.duration_ms:,.0f} ms"


def diff(
    ctx: typer.Context,
    a: Annotated[str, typer.Argument(metavar="RUN_A", help="A run id.")],
    b: Annotated[str, typer.Argument(metavar="RUN_B", help="Another run id.")],
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Two runs step by step, matched by step id: same, changed (outputs differ, or one
    failed), or only in one of them, with outputs, tokens, cost and duration side by side."""
    with client(ctx, db, read_only=True) as app:
        found = app.diff(a, b)
    if as_json:
        echo_json(found.as_dict())
        return
    table = Table(title=f"{a}  vs  {b}", title_justify="left")
    for column in ("step", "", "A", "A spend", "A time", "B", "B spend", "B time"):
        table.add_column(column, overflow="fold")
    for s in found.steps:
        table.add_row(
            Text(s.step_id),
            Text(s.status, style=DIFF_STYLE.get(s.status, "")),
            _cell(s.a),
            _spend(s.a),
            _took(s.a),
            _cell(s.b),
            _spend(s.b),
            _took(s.b),
        )
    console = make_console()
    console.print(table)
    changed = len(found.changed)
    console.print(f"{changed} of {len(found.steps)} steps differ")
