"""``ratchet graph validate|schema|register|list``: graph workflows from the command line
(``ratchet start`` starts them, see :mod:`ratchet.cli.start`)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from ratchet.cli._common import (
    DbOption,
    Fail,
    JsonOption,
    ReadableGroup,
    client,
    die,
    errors,
    load_app,
    make_console,
)
from ratchet.cli._format import echo_json, when
from ratchet.errors import InvalidInput
from ratchet.graphs import json_schema, load_document, validate

graph_cli = typer.Typer(
    cls=ReadableGroup,
    help="Graph workflows: validate, register and list them.",
    no_args_is_help=True,
)

FileArg = Annotated[str, typer.Argument(metavar="FILE", help="A graph file (YAML or JSON).")]
AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        metavar="APP",
        help="module:attribute of a Ratchet app whose tools and "
        "workflows the graph may name (checked when given).",
    ),
]


def _check(path: str, app_spec: str | None) -> tuple[Any, list[Any]]:
    tools = workflows = None
    if app_spec is not None:
        app = load_app(app_spec)
        tools, workflows = app.tools, app.workflows
    try:
        doc = load_document(path)
    except InvalidInput as e:
        raise Fail(str(e)) from e
    return validate(doc, tools, workflows)


@graph_cli.command("validate")
def validate_cmd(path: FileArg, app_spec: AppOption = None, as_json: JsonOption = False) -> None:
    """Check a graph; list every problem (node and field) and exit 1 if there are any.
    Writes nothing."""
    with errors():
        graph, problems = _check(path, app_spec)
    if as_json:
        echo_json(
            {
                "valid": graph is not None,
                "version": graph.version if graph else None,
                "problems": [
                    {"node": p.node, "field": p.field, "message": p.message} for p in problems
                ],
            }
        )
    elif graph is not None:
        typer.echo(
            f"graph {graph.name} is valid (version {graph.version}, {len(graph.nodes)} nodes)"
        )
    else:
        for p in problems:
            typer.echo(f"{path}: {p}", err=True)
        typer.echo(f"{len(problems)} problem(s)", err=True)
    if graph is None:
        raise typer.Exit(1)


@graph_cli.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of the graph format (for editors)."""
    typer.echo(json.dumps(json_schema(), indent=2))


@graph_cli.command("register")
def register_cmd(
    ctx: typer.Context, path: FileArg, app_spec: AppOption = None, db: DbOption = None
) -> None:
    """Validate a graph and store it, versioned by its content. Runs already started keep
    the version they started with."""
    with errors():
        graph, problems = _check(path, app_spec)
    if graph is None:
        for p in problems:
            typer.echo(f"{path}: {p}", err=True)
        die(f"graph not registered: {len(problems)} problem(s)", 1)
    with client(ctx, db) as app:
        stored = app.portal.call(
            app.store.register_graph(graph.name, graph.version, graph.definition)
        )
    typer.echo(f"graph {stored.name} registered: version {stored.version}")


@graph_cli.command("list")
def list_cmd(ctx: typer.Context, as_json: JsonOption = False, db: DbOption = None) -> None:
    """Registered graphs: every version, newest first within a name."""
    with client(ctx, db, read_only=True) as app:
        graphs = app.portal.call(app.store.list_graphs())
    if as_json:
        echo_json(
            [
                {
                    "name": g.name,
                    "version": g.version,
                    "registered_at": g.registered_at,
                    "nodes": len(g.definition.get("nodes", [])),
                }
                for g in graphs
            ]
        )
        return
    table = Table("name", "version", "registered", "nodes")
    for g in graphs:
        table.add_row(
            g.name, g.version, when(g.registered_at), str(len(g.definition.get("nodes", [])))
        )
    make_console().print(table)
