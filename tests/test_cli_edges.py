"""The ``ratchet`` command's rough edges, on SQLite and PostgreSQL: a server on a taken
port fails before its worker claims a run; ``ratchet start`` starts code workflows (with
``--app``, or through a server) and lists what it knows when a name is unknown; every
parameter has a name a person reads; a waiting run says what for and until when;
``ratchet signal`` says what the signal did; costs are rounded for reading and exact in
JSON; the SDKs' per-request httpx lines stay below INFO in a worker's log."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
import pytest
import typer
from serving import serving
from test_cli import SHOP, invoke, ok, refused
from typer.core import TyperArgument, TyperGroup
from waiting import wait_for

import ratchet
from ratchet.cli._format import cost_text
from ratchet.llm.server import LocalProvider
from ratchet.model import RunStatus
from ratchet.store import tokens

PRICED = "gpt-4.1-mini"


def build(url: str) -> ratchet.Ratchet:
    app = ratchet.Ratchet(url, lease_ttl=3.0, recovery_interval=0.5)

    @app.step(retry=ratchet.Retry(max_attempts=2, backoff_ms=120_000))
    async def down() -> str:
        raise RuntimeError("the pricing tool is down")

    @app.workflow()
    async def backs_off() -> str:
        return await down()

    @app.workflow()
    async def naps() -> None:
        await ratchet.sleep(600)

    @app.workflow()
    async def asks() -> Any:
        return await ratchet.wait_for_signal("approve", timeout_s=900)

    @app.workflow()
    async def order(sku: str, qty: int = 1) -> dict[str, Any]:
        return {"sku": sku, "qty": qty}

    return app


@pytest.fixture
def app(db_url: str) -> Iterator[ratchet.Ratchet]:
    app = build(db_url)
    app.launch()
    try:
        yield app
    finally:
        app.shutdown()


def parked(app: ratchet.Ratchet, workflow: str) -> ratchet.RunRecord:
    run_id = app.start(workflow)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, what=f"{workflow} to park")
    return app.get(run_id)


def utc(ts: float | None) -> str:
    assert ts is not None
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S UTC")


# -- ratchet server on a taken port ---------------------------------------------------------


def test_a_server_on_a_taken_port_fails_before_its_worker_claims_a_run(
    db_url: str, tmp_path: Path
) -> None:
    (tmp_path / "shop.py").write_text(SHOP)
    client = ratchet.Ratchet(db_url)

    @client.workflow(name="checkout")
    async def checkout(sku: str) -> dict[str, Any]:  # only the name and signature matter here
        raise NotImplementedError

    queued = [client.start(checkout, f"sku-{i}") for i in range(5)]
    env = {k: v for k, v in os.environ.items() if k != "RATCHET_DATABASE_URL"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ratchet.cli",
                "server",
                "--app",
                "shop:app",
                "--db",
                db_url,
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    try:
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines() == [
            f"error: cannot listen on 127.0.0.1:{port}: the port is taken; "
            "choose another with --port"
        ], done.stderr
        # The embedded worker never started: every run is still queued, none was claimed.
        assert [client.get(r).status for r in queued] == [RunStatus.QUEUED] * 5
        assert [e.kind for e in client.events(queued[0])] == ["run_queued"]
    finally:
        client.shutdown()


# -- ratchet start ------------------------------------------------------------------------

SHOP_APP = textwrap.dedent("""
    import ratchet

    app = ratchet.Ratchet("sqlite:///not-this-one.db")

    @app.workflow()
    async def order(sku: str, qty: int = 1) -> dict:
        return {"sku": sku, "qty": qty}
""")


@pytest.fixture
def shop_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module ``edges_shop`` with an app of one code workflow, importable by --app."""
    (tmp_path / "edges_shop.py").write_text(SHOP_APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "edges_shop", raising=False)
    return "edges_shop:app"


def test_start_a_code_workflow_with_its_app(db_url: str, shop_module: str) -> None:
    started = ok(
        "start", "order", "--app", shop_module, "--db", db_url, "--input", '{"sku": "a-1"}'
    )
    run_id = started.stdout.strip()
    with ratchet.Ratchet(db_url) as client:
        rec = client.get(run_id)
        assert (rec.workflow, rec.status, rec.input) == (
            "order",
            RunStatus.QUEUED,
            {"args": [], "kwargs": {"sku": "a-1"}},
        )
        # JSON is taken as written: no true for an int, no "3" either; nothing is written.
        for bad in ('{"sku": "a", "qty": true}', '{"sku": "a", "qty": "3"}'):
            line = refused("start", "order", "--app", shop_module, "--db", db_url, "--input", bad)
            assert "invalid argument 'qty' of workflow order: expected int" in line, line
            assert "<class" not in line
        line = refused("start", "order", "--app", shop_module, "--db", db_url, "--input", "[1]")
        assert "arguments by name, a JSON object" in line, line
        line = refused("start", "order", "--app", shop_module, "--db", db_url, "--input", "{x")
        assert "--input is not JSON: Expecting property name" in line and "column 2" in line
        # An unknown name lists the app's code workflows and the registered graphs.
        line = refused("start", "ordr", "--app", shop_module, "--db", db_url)
        assert "unknown workflow 'ordr'" in line and "code workflows: order" in line, line
        assert "registered graphs: none" in line, line
        assert [r.run_id for r in client.runs()] == [run_id]


def test_start_without_an_app_says_how_to_start_a_code_workflow(
    db_url: str, tmp_path: Path
) -> None:
    graph = tmp_path / "hello.json"
    graph.write_text(
        json.dumps(
            {
                "name": "hello",
                "nodes": [
                    {"id": "start", "type": "trigger"},
                    {"id": "out", "type": "output", "data": {"value": "hi"}},
                ],
                "edges": [{"from": "start", "to": "out"}],
            }
        )
    )
    ok("--db", db_url, "graph", "register", str(graph))
    line = refused("--db", db_url, "start", "order")
    assert "unknown workflow 'order'" in line and "registered graphs: hello" in line, line
    assert "--app APP" in line and "--server URL" in line, line
    # A graph needs no app; with no --input its input is {}.
    run_id = ok("--db", db_url, "start", "hello").stdout.strip()
    with ratchet.Ratchet(db_url) as client:
        assert client.get(run_id).input == {"args": [{}], "kwargs": {}}


def test_start_by_name_through_a_server(db_url: str) -> None:
    served = build(db_url)  # the server's app: it knows workflow order; this process does not
    client = ratchet.Ratchet(db_url)
    try:
        _, token = client.portal.call(tokens.create_token(client.store, "acme", ("runs:write",)))
        with serving(served) as base:
            run_id = ok(
                "start", "order", "--server", base, "--token", token, "--input", '{"sku": "b-2"}'
            ).stdout.strip()
            rec = client.get(f"acme~{run_id}")  # the tenant's id, as the API names it
            assert rec.workflow == "order" and rec.input["kwargs"] == {"sku": "b-2"}
            # A refusal is the server's own message, on one line.
            line = refused(
                "start", "order", "--server", base, "--token", token, "--input", '{"qty": true}'
            )
            assert "the server refused the start (422)" in line, line
            line = refused("start", "ordr", "--server", base, "--token", token)
            assert "unknown workflow 'ordr'" in line and "code workflows: asks" in line, line
            line = refused("start", "order", "--server", base, env={"RATCHET_TOKEN": ""})
            assert "--server needs a token" in line
            line = refused("start", "order", "--server", base, "--token", "rt_nope")
            assert "(401)" in line
            line = refused("start", "order", "--server", base, "--token", token, "--db", "x")
            assert "give no --app and no --db" in line
        assert [r.workflow for r in client.runs()] == ["order"]
    finally:
        client.shutdown()
        served.shutdown()


# -- what a person reads ------------------------------------------------------------------


def _every_command() -> Iterator[tuple[str, Any, typer.Context]]:
    from ratchet.cli import cli

    root = typer.main.get_command(cli)
    assert isinstance(root, TyperGroup)
    todo: list[tuple[str, Any, typer.Context]] = [
        ("ratchet", root, typer.Context(root, info_name="ratchet"))
    ]
    while todo:
        path, command, ctx = todo.pop()
        yield path, command, ctx
        if isinstance(command, TyperGroup):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                todo.append((f"{path} {name}", sub, typer.Context(sub, info_name=name, parent=ctx)))


NAMED = re.compile(r"\[?[A-Z][A-Z0-9_]*(\.jsonl)?\]?")


def test_every_parameter_shows_a_name_a_person_reads() -> None:
    seen = 0
    for path, command, ctx in _every_command():
        for param in command.get_params(ctx):
            if param.name == "help":
                continue
            seen += 1
            where = f"{path} {param.opts[0] if param.opts else param.name}"
            shown = param.display_type_rich(ctx=ctx)
            if isinstance(param, TyperArgument):
                # Its metavar is its name; no Python type beside it.
                assert NAMED.fullmatch(param.metavar or ""), (where, param.metavar)
                assert shown is None, (where, shown)
            elif param.is_flag:
                assert shown is None, (where, shown)  # a flag takes no value to name
            else:
                assert NAMED.fullmatch(shown or ""), (where, shown)
    assert seen > 80
    for verb in ("signal", "runs", "start", "server", "worker", "tokens create", "graph list"):
        text = invoke(*verb.split(), "--help").stdout
        assert not re.search(r"<[a-z][\w\[\], |]*>", text), (verb, text)  # <str>, <bool>
    text = invoke("signal", "--help").stdout
    assert "RUN_ID" in text and "NAME" in text


def test_a_waiting_run_says_what_for_and_until_when(app: ratchet.Ratchet, db_url: str) -> None:
    napping = parked(app, "naps")
    asking = parked(app, "asks")
    backing = parked(app, "backs_off")
    shown = ok("--db", db_url, "show", napping.run_id).stdout
    assert f"sleeping until {utc(napping.not_before)}" in shown, shown
    shown = ok("--db", db_url, "show", asking.run_id).stdout
    assert f"waiting for signal approve (times out at {utc(asking.not_before)})" in shown, shown
    shown = ok("--db", db_url, "show", backing.run_id).stdout
    assert f"backing off until {utc(backing.not_before)}" in shown, shown
    listed = ok("--db", db_url, "runs").stdout
    assert f"waiting (sleeping until {utc(napping.not_before)})" in listed, listed
    assert f"waiting (backing off until {utc(backing.not_before)})" in listed, listed
    # JSON keeps the fields as stored.
    rows = {r["run_id"]: r for r in json.loads(ok("--db", db_url, "runs", "--json").stdout)}
    assert rows[napping.run_id]["not_before"] == napping.not_before
    assert rows[napping.run_id]["waiting_for"] == napping.waiting_for


def test_signal_says_whether_the_run_woke(app: ratchet.Ratchet, db_url: str) -> None:
    asking = parked(app, "asks")
    other = ok("--db", db_url, "signal", asking.run_id, "later").stdout
    assert other.strip() == (
        f"signal 'later' sent to run {asking.run_id}; status now waiting (waiting for signal "
        f"approve (times out at {utc(asking.not_before)}); the signal is kept until the run "
        "asks for it)"
    ), other
    woke = ok("--db", db_url, "signal", asking.run_id, "approve", "--data", "1").stdout
    assert woke.startswith(f"signal 'approve' sent to run {asking.run_id}; status now "), woke
    assert "(it waited for it and woke)" in woke, woke
    assert app.result(asking.run_id, timeout_s=30) == 1


@pytest.mark.usefixtures("collect_clients")
def test_costs_are_rounded_for_reading_and_exact_in_json(
    make_app: Callable[..., ratchet.Ratchet], db_url: str, provider: tuple[LocalProvider, str]
) -> None:
    assert [cost_text(v) for v in (0, 0.001234567, 0.05, 0.5, 1, 12.345, 1234.5)] == [
        "$0.00",
        "$0.00123",
        "$0.05",
        "$0.50",
        "$1.00",
        "$12.35",
        "$1,234.50",
    ]
    _, base = provider
    oai = ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test"))
    app = make_app()

    @app.workflow()
    async def chat() -> str:
        said = await oai.chat.completions.create(
            model=PRICED, messages=[{"role": "user", "content": "a long question " * 40}]
        )
        return said.choices[0].message.content or ""

    app.launch()
    run_id = app.start(chat)
    app.result(run_id, timeout_s=30)
    exact = app.llm_totals([run_id])[run_id].cost_usd
    assert 0 < exact < 0.01
    [row] = [
        r for r in json.loads(ok("--db", db_url, "runs", "--json").stdout) if r["run_id"] == run_id
    ]
    assert row["llm"]["cost_usd"] == exact
    assert (
        json.loads(ok("--db", db_url, "show", run_id, "--json").stdout)["llm"]["cost_usd"] == exact
    )
    assert cost_text(exact) in ok("--db", db_url, "runs").stdout
    assert cost_text(exact) in ok("--db", db_url, "show", run_id).stdout
    assert len(cost_text(exact).rstrip("0").split(".")[1].lstrip("0")) <= 3


# -- the worker's log ------------------------------------------------------------------------

LLM_APP = textwrap.dedent("""
    import os

    import openai

    import ratchet

    app = ratchet.Ratchet()
    oai = ratchet.llm.wrap(
        openai.AsyncOpenAI(base_url=os.environ["EDGES_LLM_BASE"] + "/v1", api_key="sk-test")
    )

    @app.workflow()
    async def chat() -> str:
        said = await oai.chat.completions.create(
            model="gpt-4.1-mini", messages=[{"role": "user", "content": "hello"}]
        )
        return said.choices[0].message.content or ""
""")


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_the_sdks_request_lines_stay_below_info_in_a_workers_log(
    level: str, sqlite_url: str, tmp_path: Path, provider: tuple[LocalProvider, str]
) -> None:
    _, base = provider
    (tmp_path / "llm_app.py").write_text(LLM_APP)
    env = {k: v for k, v in os.environ.items() if k != "RATCHET_DATABASE_URL"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ratchet.cli",
            "worker",
            "llm_app:app",
            "--db",
            sqlite_url,
            "--log-level",
            level,
        ],
        cwd=tmp_path,
        env=env | {"EDGES_LLM_BASE": base},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = ratchet.Ratchet(sqlite_url)

    @client.workflow(name="chat")
    async def chat() -> str:
        raise NotImplementedError

    try:
        run_id = client.start(chat)
        assert "hello" in client.result(run_id, timeout_s=60)
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        client.shutdown()
    assert proc.returncode == 0, err
    assert "action=worker_started" in err
    requests = [line for line in err.splitlines() if "HTTP Request: POST http" in line]
    if level == "INFO":
        assert requests == [], err
    else:
        assert len(requests) == 1, err
