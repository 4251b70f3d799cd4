"""``ratchet schedules``: list schedules, ``pause``, ``resume`` and ``trigger`` one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ratchet.app import Ratchet
from ratchet.cli._common import (
    DbOption,
    JsonOption,
    ReadableGroup,
    app_on_db,
    client,
    errors,
    make_console,
)
from ratchet.cli._format import echo_json

schedules_cli = typer.Typer(
    cls=ReadableGroup,
    help="Schedules: list them (the default), pause, resume, trigger one now.",
    invoke_without_command=True,
)

NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The schedule's name.")]
AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        metavar="APP",
        help="module:attribute of the Ratchet app: its declared schedules are written to "
        "the database first (they are once a worker of it starts anyway).",
    ),
]


@contextlib.contextmanager
def _on(ctx: typer.Context, app_spec: str | None, db: str | None) -> Iterator[Ratchet]:
    if app_spec is None:
        with client(ctx, db) as app:
            yield app
    else:
        with errors(), app_on_db(ctx, app_spec, db) as app:
            yield app


@schedules_cli.callback()
def list_(
    ctx: typer.Context,
    as_json: JsonOption = False,
    app_spec: AppOption = None,
    db: DbOption = None,
) -> None:
    """Every schedule: name, workflow, when (cron or every, and its time zone), missed,
    paused, last fired and next tick."""
    if ctx.invoked_subcommand is not None:
        return
    with _on(ctx, app_spec, db) as app:
        found = app.schedules()
    if as_json:
        echo_json(found)
        return
    console = make_console()
    if not found:
        console.print(
            "no schedules; declare one with @app.schedule(every=...) or add one "
            "with POST /v1/schedules"
        )
        return
    table = Table("name", "workflow", "when", "tz", "missed", "paused", "last fired", "next tick")
    for s in found:
        table.add_row(
            Text(s["name"]),
            Text(s["workflow"]),
            Text(s["cron"] or f"every {s['every']}"),
            Text(s["tz"]),
            Text(s["missed"]),
            Text("paused" if s["paused"] else "-"),
            Text(s["last_fired"] or "-"),
            Text(s["next_tick"] or "-"),
        )
    console.print(table)


@schedules_cli.command("pause")
def pause(
    ctx: typer.Context, name: NameArg, app_spec: AppOption = None, db: DbOption = None
) -> None:
    """Stop firing NAME's ticks, on every worker, until it is resumed."""
    with _on(ctx, app_spec, db) as app:
        app.pause_schedule(name)
    typer.echo(f"schedule {name} is paused")


@schedules_cli.command("resume")
def resume(
    ctx: typer.Context, name: NameArg, app_spec: AppOption = None, db: DbOption = None
) -> None:
    """Fire NAME's ticks again from the next one (those that passed while it was paused are
    not fired)."""
    with _on(ctx, app_spec, db) as app:
        app.resume_schedule(name)
    typer.echo(f"schedule {name} is resumed")


@schedules_cli.command("trigger")
def trigger(
    ctx: typer.Context,
    name: NameArg,
    app_spec: Annotated[
        str,
        typer.Option(
            "--app",
            metavar="APP",
            help="module:attribute of the Ratchet app whose workflow NAME runs: its "
            "input is checked against the workflow's signature.",
        ),
    ],
    db: DbOption = None,
) -> None:
    """Run NAME's workflow now, once (paused or not), under a run id of its own; prints it."""
    with _on(ctx, app_spec, db) as app:
        run_id = app.trigger_schedule(name)
    typer.echo(run_id)
