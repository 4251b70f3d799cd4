"""``ratchet start NAME``: a run of a code workflow or of a registered graph, started in
the database (a graph needs nothing more; a code workflow needs its app, ``--app``) or
through a running ``ratchet server`` (``--server``), which knows its own workflows."""

from __future__ import annotations

import json
from typing import Annotated, Any

import httpx
import typer

from ratchet.app import Ratchet
from ratchet.cli._common import (
    DbOption,
    Fail,
    app_on_db,
    client,
    die,
    errors,
    given_db,
    json_option,
    tag_option,
)
from ratchet.engine.start_options import parse_start_at, start_options
from ratchet.errors import InvalidInput, UnknownWorkflow

SERVER_TIMEOUT_S = 30.0


def start_cmd(
    ctx: typer.Context,
    name: Annotated[
        str,
        typer.Argument(metavar="NAME", help="A code workflow's or a registered graph's name."),
    ],
    input: Annotated[
        str | None,
        typer.Option(
            "--input",
            metavar="JSON",
            help="The run's input: a code workflow's arguments by name "
            '(\'{"sku": "a-1"}\'), a graph\'s input. Default: {}.',
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option("--run-id", metavar="RUN_ID", help="Choose the run's id (idempotent)."),
    ] = None,
    queue: Annotated[
        str, typer.Option("--queue", metavar="QUEUE", help="The queue to run it on.")
    ] = "default",
    guards: Annotated[
        str | None,
        typer.Option(
            "--guards",
            metavar="JSON",
            help="Guard overrides for this run, e.g. "
            '\'{"max_steps": 50, "actions": {"runaway_loop": "pause"}}\'.',
        ),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(
            "--tag",
            metavar="TAG",
            help="A tag of the run, as KEY=VALUE; repeat it for more "
            "(`ratchet runs --tag` finds runs by them).",
        ),
    ] = None,
    concurrency_key: Annotated[
        str | None,
        typer.Option(
            "--concurrency-key",
            metavar="KEY",
            help="The key its queue's per_key_concurrency counts it under.",
        ),
    ] = None,
    dedup_id: Annotated[
        str | None,
        typer.Option(
            "--dedup-id",
            metavar="ID",
            help="Refused while a run of NAME with this dedup id is not terminal (the "
            "refusal names it).",
        ),
    ] = None,
    delay: Annotated[
        float | None,
        typer.Option(
            "--delay",
            metavar="SECONDS",
            help="Store the run now; no worker claims it before this many seconds.",
        ),
    ] = None,
    start_at: Annotated[
        str | None,
        typer.Option(
            "--start-at",
            metavar="TIME",
            help="Store the run now; no worker claims it before this ISO-8601 time, "
            "given with its offset (2026-05-01T09:30:00+02:00, or Z). Not with --delay.",
        ),
    ] = None,
    app_spec: Annotated[
        str | None,
        typer.Option(
            "--app",
            metavar="APP",
            help="module:attribute of the Ratchet app whose code workflow NAME is; its "
            "arguments are checked against the workflow's signature before anything is "
            "written.",
        ),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            metavar="URL",
            help="Start it through this `ratchet server` (POST /v1/runs), which checks it "
            "against its own workflows, e.g. http://127.0.0.1:8000.",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            metavar="TOKEN",
            envvar="RATCHET_TOKEN",
            show_envvar=False,
            help="With --server: a runs:write token (default: $RATCHET_TOKEN).",
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Start a run of a code workflow or of a registered graph's latest version; print
    its id. A worker serving the workflow drives it (any app's worker, for a graph).

    Input is JSON and is taken as it is written: `true` is no integer, `"3"` no number."""
    value = json_option("--input", input, {})
    overrides = json_option("--guards", guards, None)
    when = {"dedup_id": dedup_id, "start_at": start_at, "delay_s": delay}
    when = {k: v for k, v in when.items() if v is not None}
    labels: dict[str, Any] = {"tags": tag_option(tag)}
    if concurrency_key is not None:
        labels["concurrency_key"] = concurrency_key
    if server is not None:
        if app_spec is not None or given_db(ctx, db) is not None:
            die("--server starts the run through the server: give no --app and no --db with it")
        run = _through_server(server, token, name, value, run_id, queue, overrides, when | labels)
    elif app_spec is not None:
        with errors(), app_on_db(ctx, app_spec, db) as app:
            run = _start(app, name, value, run_id, queue, overrides, when, labels)
    else:
        with client(ctx, db) as app:
            try:
                run = _start(app, name, value, run_id, queue, overrides, when, labels)
            except UnknownWorkflow as e:
                raise Fail(
                    f"{e} (a code workflow starts with --app APP, or through a server with "
                    "--server URL)"
                ) from e
    typer.echo(run)


def _start(
    app: Ratchet,
    name: str,
    value: Any,
    run_id: str | None,
    queue: str,
    guards: dict[str, Any] | None,
    when: dict[str, Any],
    labels: dict[str, Any],
) -> str:
    """Start ``name`` with ``app``: a code workflow's arguments by name, checked strictly
    as the API checks them (they came as JSON); anything else as a graph's input. ``when``:
    the start's ``dedup_id``, ``start_at`` (ISO-8601 text) and ``delay_s``, as given;
    ``labels``: its ``tags`` and ``concurrency_key``."""
    plan = start_options(
        dedup_id=when.get("dedup_id"),
        start_at=None if "start_at" not in when else parse_start_at(when["start_at"]),
        delay_s=when.get("delay_s"),
        run_id=run_id,
    )
    workflow = app.workflows.get(name)
    args: tuple[Any, ...] = (value,)
    kwargs: dict[str, Any] = {}
    if workflow is not None:
        if not isinstance(value, dict):
            raise InvalidInput(
                f"--input for workflow {name} is its arguments by name, a JSON object "
                f"such as {json.dumps({p: '...' for p in workflow.signature.parameters})}"
            )
        workflow.check_json(value)
        args, kwargs = (), value
    rec, _ = app.portal.call(
        app.start_run_async(
            name,
            args,
            kwargs,
            run_id=run_id,
            queue=queue,
            guards=guards,
            plan=plan,
            tags=labels["tags"],
            concurrency_key=labels.get("concurrency_key"),
        )
    )
    return rec.run_id


def _through_server(
    server: str,
    token: str | None,
    name: str,
    value: Any,
    run_id: str | None,
    queue: str,
    guards: dict[str, Any] | None,
    when: dict[str, Any],
) -> str:
    """``POST /v1/runs`` on ``server`` (``when``: the body's start options, tags and
    concurrency key); the run's id, or one line saying why not (the
    server's own message when it refused)."""
    if not token:
        die("--server needs a token with the runs:write scope: --token TOKEN or $RATCHET_TOKEN")
    if not isinstance(value, dict):
        die("--input through a server is a JSON object (a workflow's arguments by name)")
    body: dict[str, Any] = {"workflow": name, "input": value, "queue": queue, **when}
    if run_id is not None:
        body["run_id"] = run_id
    if guards is not None:
        body["guards"] = guards
    url = server.rstrip("/") + "/v1/runs"
    try:
        answer = httpx.post(
            url,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=SERVER_TIMEOUT_S,
        )
    except httpx.HTTPError as e:
        die(f"cannot reach the server at {server}: {e}", 1)
    try:
        said = answer.json()
    except ValueError:
        said = None
    if answer.status_code in (200, 202) and isinstance(said, dict) and "run_id" in said:
        return str(said["run_id"])
    message = said.get("message") if isinstance(said, dict) else None
    die(
        f"the server refused the start ({answer.status_code}): "
        f"{message or answer.text[:200] or answer.reason_phrase}",
        2 if answer.status_code < 500 else 1,
    )
