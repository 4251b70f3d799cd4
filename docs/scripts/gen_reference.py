"""The CLI and HTTP API reference pages, generated from the code at every site build.

MkDocs runs this file through the ``gen-files`` plugin (see mkdocs.yml), which writes
``reference/cli.md`` from the typer app behind the ``ratchet`` command and
``reference/http.md`` from the OpenAPI spec of ``ratchet server``'s FastAPI app. Nothing
is checked in, so neither page can fall behind a new command, flag or route. The tests
import :func:`cli_markdown` and :func:`http_markdown` to check what the pages cover.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

# typer carries its own copy of click: its commands are reached through typer's names
# (typer.Context, TyperGroup) and the methods ``--help`` itself calls.
Command = Any


def _cell(text: object) -> str:
    """Text fit for one Markdown table cell."""
    # Docstrings quote code reST-style (``x``); Markdown wants one backtick.
    return " ".join(str(text).split()).replace("``", "`").replace("|", "\\|")


def _commands(group: TyperGroup, ctx: typer.Context) -> list[tuple[str, Command]]:
    """Every command under ``group``, depth first, as (full name, command)."""
    out: list[tuple[str, Command]] = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub = typer.Context(command, info_name=name, parent=ctx)
        out.append((sub.command_path, command))
        if isinstance(command, TyperGroup):
            out.extend(_commands(command, sub))
    return out


def root_command() -> TyperGroup:
    """The click group the ``ratchet`` console script runs."""
    from ratchet.cli import cli  # assembled with every verb group in ratchet.cli.root

    command = typer.main.get_command(cli)
    assert isinstance(command, TyperGroup)
    return command


def _param_row(param: Any, ctx: typer.Context) -> str:
    """One parameter as ``--help`` shows it: names with the value's form, then its help
    with default and bounds."""
    names, help_text = param.get_help_record(ctx) or (param.name, "")
    return f"| `{_cell(names)}` | {_cell(help_text)} |"


def cli_markdown() -> str:
    """The CLI reference page: every command with its usage, help and parameters."""
    root = root_command()
    ctx = typer.Context(root, info_name="ratchet")
    overview = (Path(__file__).parent / "cli_overview.md").read_text(encoding="utf-8")
    lines = [
        "# CLI reference",
        "",
        overview.split("-->", 1)[-1].strip(),
        "",
        "## Every command",
        "",
        "Generated from the commands themselves when the site is built (the same text "
        "as `ratchet COMMAND --help`). Options of the `ratchet` group itself (`--db`, "
        "`--version`) go before the command.",
        "",
    ]
    for path, command in [("ratchet", root), *_commands(root, ctx)]:
        sub = typer.Context(
            command, info_name=path.split(" ")[-1], parent=None if path == "ratchet" else ctx
        )
        pieces = " ".join(command.collect_usage_pieces(sub))
        lines += [f"### `{path}`", "", f"```text\nUsage: {path} {pieces}\n```", ""]
        if command.help:
            lines += [command.help.strip(), ""]
        params = [
            p
            for p in command.get_params(sub)
            if not getattr(p, "hidden", False) and p.name != "help"
        ]
        if params:
            lines += [
                "| parameter | meaning |",
                "|---|---|",
                *(_param_row(p, sub) for p in params),
                "",
            ]
        if isinstance(command, TyperGroup):
            subs = [
                n
                for n in command.list_commands(sub)
                if not (c := command.get_command(sub, n)) or not c.hidden
            ]
            lines += ["Commands: " + ", ".join(f"`{path} {n}`" for n in subs), ""]
    return "\n".join(lines)


def openapi_spec() -> dict[str, Any]:
    """The OpenAPI spec ``ratchet server`` serves at ``/openapi.json``."""
    from ratchet.app import Ratchet
    from ratchet.server import create_app

    # The spec depends on the routes, not on the database: nothing is opened here.
    with tempfile.TemporaryDirectory() as tmp:
        return create_app(Ratchet(f"sqlite:///{tmp}/spec.db")).openapi()


def _schema_name(schema: dict[str, Any]) -> str:
    """A schema as a short type: a link to a component, or its JSON type."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_name(s) for s in schema[key])
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items', {}))}"
    return str(schema.get("type", "any"))


def http_markdown(spec: dict[str, Any] | None = None) -> str:
    """The HTTP API reference page: every route, its parameters, body and responses, and
    the schemas they use."""
    spec = spec if spec is not None else openapi_spec()
    info = spec["info"]
    lines = [
        "# HTTP API reference",
        "",
        f"{info.get('description', '')} Generated from the OpenAPI spec "
        f"({spec['openapi']}) of `ratchet server` {info['version']} when the site is "
        "built; a running server serves the same spec at `/openapi.json`.",
        "",
        "Routes under `/v1` take `Authorization: Bearer <token>` "
        "(see [The server and tokens](../how-to/server.md)). Every error has one "
        'shape: `{"error": code, "message": ..., "details": ...}`.',
        "",
    ]
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            lines += [f"## `{method.upper()} {path}`", ""]
            if op.get("summary"):
                lines += [f"**{op['summary']}**", ""]
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| parameter | in | type | required | meaning |", "|---|---|---|---|---|"]
                lines += [
                    f"| `{p['name']}` | {p['in']} | "
                    f"{_cell(_schema_name(p.get('schema', {})))} | "
                    f"{'yes' if p.get('required') else ''} | "
                    f"{_cell(p.get('description', ''))} |"
                    for p in params
                ]
                lines.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                lines += [f"Body ({media}): {_schema_name(content.get('schema', {}))}", ""]
            lines += ["| status | meaning | body |", "|---|---|---|"]
            for status, response in op.get("responses", {}).items():
                shapes = [
                    _schema_name(c.get("schema", {})) if c.get("schema") else media
                    for media, c in response.get("content", {}).items()
                ]
                lines.append(
                    f"| {status} | {_cell(response.get('description', ''))} | "
                    f"{_cell(', '.join(shapes))} |"
                )
            lines.append("")
    schemas = spec.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
    for name, schema in schemas.items():
        lines += [f"### {name}", ""]
        if schema.get("description"):
            lines += [schema["description"].strip(), ""]
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        if props:
            lines += ["| field | type | required | meaning |", "|---|---|---|---|"]
            lines += [
                f"| `{field}` | {_cell(_schema_name(p))} | "
                f"{'yes' if field in required else ''} | "
                f"{_cell(p.get('description', ''))} |"
                for field, p in props.items()
            ]
            lines.append("")
        elif "enum" in schema:
            lines += ["One of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"]), ""]
    return "\n".join(lines)


def write_pages() -> None:
    """Write both pages into the site being built."""
    import mkdocs_gen_files

    for name, render in (("cli.md", cli_markdown), ("http.md", http_markdown)):
        with mkdocs_gen_files.open(Path("reference") / name, "w") as f:
            f.write(render())
        mkdocs_gen_files.set_edit_path(Path("reference") / name, Path("scripts/gen_reference.py"))


# mkdocs-gen-files runs this file with runpy, as "<run_path>"; an import only defines.
if __name__ in ("<run_path>", "__main__"):
    write_pages()
