"""The ``ratchet`` command, on SQLite and PostgreSQL: listings and their JSON, acting on
runs, the clear errors it gives, a worker process, and the crash-resume demo."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from typer.testing import CliRunner, Result
from waiting import wait_for

import ratchet
from ratchet.cli import cli
from ratchet.engine import faults
from ratchet.model import RunStatus
from ratchet.store import make_store

# The flaky step fails while armed, once; CALLS counts real invocations per step.
FLAKY = {"armed": False}
CALLS: dict[str, int] = {}


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def ok(*args: str) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def refused(*args: str, env: dict[str, str] | None = None) -> str:
    """Run a command that must fail with exit 2 and one clean line on stderr."""
    result = invoke(*args, env=env)
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def build_app(url: str) -> ratchet.Ratchet:
    app = ratchet.Ratchet(url, lease_ttl=3.0, recovery_interval=0.5)

    @app.step
    async def double(x: int) -> int:
        CALLS["double"] = CALLS.get("double", 0) + 1
        return x * 2

    @app.step
    async def flaky(x: int) -> int:
        CALLS["flaky"] = CALLS.get("flaky", 0) + 1
        if FLAKY["armed"]:
            FLAKY["armed"] = False
            raise RuntimeError("the pricing tool is down")
        return x + 1

    @app.workflow()
    async def compute(x: int) -> dict[str, int]:
        a = await double(x)
        return {"a": a, "b": await flaky(a)}

    @app.workflow()
    async def approval(ticket: str) -> dict[str, Any]:
        decision = await ratchet.wait_for_signal("approve")
        return {"ticket": ticket, "decision": decision}

    return app


@pytest.fixture
def app(db_url: str) -> Iterator[ratchet.Ratchet]:
    """An app on the test's database, with a worker running in this process."""
    FLAKY["armed"] = False
    CALLS.clear()
    app = build_app(db_url)
    app.launch()
    try:
        yield app
    finally:
        app.shutdown()


def create_database(url: str) -> None:
    """An empty Ratchet database at ``url`` (the reading commands never create one)."""
    with ratchet.Ratchet(url) as app:
        assert app.runs() == []


def waiting_run(app: ratchet.Ratchet, ticket: str = "T-1") -> str:
    run_id = app.start("approval", ticket)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
    return run_id


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -- reading ---------------------------------------------------------------------------


def test_runs_show_and_events_describe_a_finished_run(app: ratchet.Ratchet, db_url: str) -> None:
    run_id = app.start("compute", 3, run_id="calc-1")
    assert app.result(run_id, timeout_s=30) == {"a": 6, "b": 7}

    listed = json.loads(ok("--db", db_url, "runs", "--json").stdout)
    [row] = [r for r in listed if r["run_id"] == run_id]
    assert row["workflow"] == "compute" and row["status"] == "succeeded"
    assert [
        r["run_id"]
        for r in json.loads(ok("--db", db_url, "runs", "--status", "succeeded", "--json").stdout)
    ] == [run_id]
    assert json.loads(ok("--db", db_url, "runs", "--status", "queued", "--json").stdout) == []
    table = ok("--db", db_url, "runs").stdout
    assert run_id in table and "succeeded" in table and "compute v1" in table

    shown = json.loads(ok("--db", db_url, "show", run_id, "--json").stdout)
    assert shown["status"] == "succeeded" and shown["output"] == {"a": 6, "b": 7}
    assert shown["input"] == 3  # as it was given: app.start("compute", 3)
    assert [(s["step_id"], s["status"], s["attempts"], s["output"]) for s in shown["steps"]] == [
        ("1:double", "completed", 1, 6),
        ("2:flaky", "completed", 1, 7),
    ]
    assert all(s["duration_s"] is not None and s["duration_s"] >= 0 for s in shown["steps"])
    text = ok("--db", db_url, "show", run_id).stdout
    assert "1:double" in text and "2:flaky" in text and '{"a":6,"b":7}' in text

    events = json_lines(ok("--db", db_url, "events", run_id, "--json").stdout)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["kind"] for e in events] == [e.kind for e in app.events(run_id)]
    assert events[0]["kind"] == "run_queued" and events[-1]["kind"] == "run_succeeded"
    assert events[2]["step_id"] == "1:double" and events[2]["attempt"] == 1
    lines = ok("--db", db_url, "events", run_id).stdout.splitlines()
    assert len(lines) == len(events) and "step_completed" in lines[3]
    # --follow on a finished run prints the journal and returns at once.
    followed = json_lines(ok("--db", db_url, "events", run_id, "--follow", "--json").stdout)
    assert followed == events


def test_show_tells_the_story_of_a_failed_run_retried_by_a_person(
    app: ratchet.Ratchet, db_url: str
) -> None:
    FLAKY["armed"] = True
    run_id = app.start("compute", x=2)
    with pytest.raises(ratchet.RunFailed):
        app.result(run_id, timeout_s=30)
    shown = json.loads(ok("--db", db_url, "show", run_id, "--json").stdout)
    assert shown["input"] == {"x": 2}
    assert shown["failed_step"] == "2:flaky" and "in flaky" in shown["traceback"]
    assert shown["duration_s"] > 0 and shown["drives"] == 1
    [drive] = shown["drive_log"]
    assert drive["ended"] == "failed, dead-lettered (step_failed)"
    [flaky] = [s for s in shown["steps"] if s["step_id"] == "2:flaky"]
    assert flaky["traceback"] == shown["traceback"]
    text = ok("--db", db_url, "show", run_id).stdout
    assert '{"x":2}' in text
    assert "duration" in text
    assert f"drive 1 by {drive['worker_id']}: failed, dead-lettered (step_failed)" in text
    assert "traceback of step 2:flaky:" in text
    assert "RuntimeError: the pricing tool is down" in text and "in flaky" in text

    ok("--db", db_url, "retry", run_id, "--by", "ana")
    assert app.result(run_id, timeout_s=30) == {"a": 4, "b": 5}
    text = ok("--db", db_url, "show", run_id, "--full").stdout
    assert "failed, dead-lettered (step_failed), retried by ana" in text
    assert ": succeeded" in text and "traceback" not in text


def test_the_database_comes_from_the_command_option_or_the_environment(
    app: ratchet.Ratchet, db_url: str, tmp_path: Path
) -> None:
    run_id = app.start("compute", 1)
    app.result(run_id, timeout_s=30)
    by_option = json.loads(ok("runs", "--json", "--db", db_url).stdout)
    result = invoke("runs", "--json", env={"RATCHET_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.stderr
    assert [r["run_id"] for r in by_option] == [r["run_id"] for r in json.loads(result.stdout)]
    # The command's own --db wins over the global one.
    other = tmp_path / "other.db"
    line = refused("--db", db_url, "runs", "--json", "--db", f"sqlite:///{other}")
    assert line.startswith(f"error: no Ratchet database at '{other}'")


def test_events_follow_streams_until_the_run_finishes(app: ratchet.Ratchet, db_url: str) -> None:
    run_id = waiting_run(app)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ratchet.cli",
            "--db",
            db_url,
            "events",
            run_id,
            "--follow",
            "--json",
            "--interval",
            "0.05",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen: list[dict[str, Any]] = []
        while not seen or seen[-1]["kind"] != "step_waiting":
            seen.append(json.loads(proc.stdout.readline()))
        assert proc.poll() is None  # the run is parked, so the follower keeps following
        app.signal(run_id, "approve", {"by": "ada"})
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    seen += json_lines(out)
    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    assert seen[-1]["kind"] == "run_succeeded"
    assert seen[-1]["payload"]["output"] == {"ticket": "T-1", "decision": {"by": "ada"}}


# -- acting ----------------------------------------------------------------------------


def test_a_signal_with_invalid_json_is_refused_and_nothing_is_sent(
    app: ratchet.Ratchet, db_url: str
) -> None:
    run_id = waiting_run(app)
    line = refused("--db", db_url, "signal", run_id, "approve", "--data", "{yes")
    assert "--data is not valid JSON" in line and "nothing was sent" in line

    async def pending() -> Any:
        store = make_store(db_url)
        await store.open()
        try:
            return await store.pending_signal(run_id, "approve")
        finally:
            await store.close()

    assert asyncio.run(pending()) is None
    assert app.get(run_id).status == RunStatus.WAITING

    out = ok("--db", db_url, "signal", run_id, "approve", "--data", '{"by": "ada"}').stdout
    assert f"signal 'approve' sent to run {run_id}" in out
    assert app.result(run_id, timeout_s=30) == {"ticket": "T-1", "decision": {"by": "ada"}}


def test_cancel_prints_the_status_after_the_request(app: ratchet.Ratchet, db_url: str) -> None:
    run_id = waiting_run(app)
    assert ok("--db", db_url, "cancel", run_id).stdout.strip() == f"run {run_id}: cancelled"
    assert app.get(run_id).status == RunStatus.CANCELLED
    again = ok("--db", db_url, "cancel", run_id).stdout
    assert "already cancelled" in again


def test_a_dead_lettered_run_is_listed_and_retried(app: ratchet.Ratchet, db_url: str) -> None:
    FLAKY["armed"] = True
    run_id = app.start("compute", 5)
    with pytest.raises(ratchet.RunFailed):
        app.result(run_id, timeout_s=30)

    [dead] = json.loads(ok("--db", db_url, "dlq", "--json").stdout)
    assert dead["run_id"] == run_id and dead["workflow"] == "compute"
    assert dead["reason"] == "step_failed" and "the pricing tool is down" in dead["error"]
    table = ok("--db", db_url, "dlq").stdout
    assert run_id in table and "step_failed" in table

    assert ok("--db", db_url, "retry", run_id).stdout.strip() == (
        f"run {run_id}: re-queued (status: queued)"
    )
    assert app.result(run_id, timeout_s=30) == {"a": 10, "b": 11}
    assert CALLS == {"double": 1, "flaky": 2}  # the completed step was not run again
    assert json.loads(ok("--db", db_url, "dlq", "--json").stdout) == []
    assert "not dead-lettered" in refused("--db", db_url, "retry", run_id)


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["show", "nope"],
        ["show", "nope", "--json"],
        ["events", "nope"],
        ["events", "nope", "-f"],
        ["signal", "nope", "go"],
        ["cancel", "nope"],
        ["retry", "nope"],
    ],
)
def test_an_unknown_run_id_is_a_clear_error(db_url: str, command: list[str]) -> None:
    create_database(db_url)
    assert refused("--db", db_url, *command) == "error: unknown run id 'nope'"


def test_an_unknown_status_is_refused(sqlite_url: str) -> None:
    line = refused("--db", sqlite_url, "runs", "--status", "done")
    assert line.startswith("error: unknown status 'done'") and "succeeded" in line


@pytest.mark.parametrize(
    "url", ["mysql://localhost/x", "sqlite://relative.db", "sqlite:///", "postgresql://"]
)
def test_a_malformed_database_url_is_a_clear_error(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    line = refused("--db", url, "runs")
    assert line.startswith(f"error: malformed database URL {url!r}")
    assert refused("runs", env={"RATCHET_DATABASE_URL": url}) == line
    assert list(tmp_path.iterdir()) == []


BAD_APPS = {
    "cli_no_colon": "invalid APP 'cli_no_colon': expected module:attribute",
    "cli_missing_module:app": "cannot import module 'cli_missing_module'",
    "cli_plain:nope": "module 'cli_plain' has no attribute 'nope'",
    "cli_plain:value": "APP 'cli_plain:value' is a int, not a ratchet.Ratchet app",
    "cli_broken:app": "importing module 'cli_broken' failed: ZeroDivisionError",
    "cli_needs_dep:app": "importing module 'cli_needs_dep' failed: ModuleNotFoundError",
}


@pytest.mark.parametrize("spec", list(BAD_APPS))
def test_a_worker_with_a_bad_app_is_a_clear_error(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cli_plain.py").write_text("value = 3\n")
    (tmp_path / "cli_broken.py").write_text("app = 1 / 0\n")
    (tmp_path / "cli_needs_dep.py").write_text("import cli_not_installed_anywhere\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("cli_plain", "cli_broken", "cli_needs_dep"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    line = refused("worker", spec, "--db", f"sqlite:///{tmp_path}/w.db")
    assert BAD_APPS[spec] in line
    assert not (tmp_path / "w.db").exists()


@pytest.mark.parametrize("grace", ["soon", "-1s", "0"])
def test_a_bad_grace_period_is_a_clear_error(
    grace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cli_grace.py").write_text("import ratchet\napp = ratchet.Ratchet()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "cli_grace", raising=False)
    line = refused(
        "worker", "cli_grace:app", "--grace", grace, "--db", f"sqlite:///{tmp_path}/w.db"
    )
    assert "invalid --grace" in line and repr(grace) in line
    assert not (tmp_path / "w.db").exists()


# -- processes -------------------------------------------------------------------------

SHOP = textwrap.dedent("""
    import ratchet

    app = ratchet.Ratchet("sqlite:///not-this-one.db")

    @app.step
    async def price(sku: str) -> int:
        return len(sku) * 100

    @app.workflow()
    async def checkout(sku: str) -> dict:
        return {"sku": sku, "cents": await price(sku)}
""")


def test_a_worker_process_runs_the_app_and_stops_on_sigterm(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "shop.py").write_text(SHOP)
    client = ratchet.Ratchet(db_url)

    @client.workflow(name="checkout")
    async def checkout(sku: str) -> dict[str, Any]:  # only the name and signature matter here
        raise NotImplementedError

    env = {k: v for k, v in os.environ.items() if k != "RATCHET_DATABASE_URL"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ratchet.cli",
            "worker",
            "shop:app",
            "--db",
            db_url,
            "--worker-id",
            "shop-1",
            "--concurrency",
            "2",
            "--grace",
            "5s",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_id = client.start(checkout, "sku-42")
        assert client.result(run_id, timeout_s=60) == {"sku": "sku-42", "cents": 600}
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        client.shutdown()
    assert proc.returncode == 0, err
    assert "action=worker_started worker_id=shop-1 concurrency=2" in err
    assert "grace=5.0s" in err
    assert "action=shutdown_requested signal=SIGTERM" in err
    assert "action=worker_stopped worker_id=shop-1" in err
    assert not (tmp_path / "not-this-one.db").exists()  # --db replaced the app's own URL


@pytest.mark.crash
def test_the_demo_kills_a_worker_mid_step_and_the_run_resumes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RATCHET_DATABASE_URL"}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ratchet.cli", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "SIGKILL → worker 1" in out and "in the middle of step 4" in out
    assert "is still running: its lease (epoch 1, unexpired) is still held by demo-worker" in out
    assert "✓ steps 1\N{EN DASH}3 ran once each, before the crash — not again after it" in out
    assert "✓ step 4 ran twice with the same idempotency key " in out
    assert "✓ the provider billed the model call once (1 billed call)" in out
    assert "provider: #1 billed, #2 answered from its store" in out
    assert "✓ steps 5\N{EN DASH}6 ran once each, after the restart, in worker 2" in out
    assert '"reason":"reclaim"' in out
    assert "✓ run_succeeded written 1 time" in out
    assert '"approved":true' in out and "✗" not in out
    assert elapsed < 30
    with sqlite3.connect(tmp_path / ".ratchet" / "demo.db") as conn:  # no guard tripped
        kinds = {k for (k,) in conn.execute("SELECT DISTINCT kind FROM journal_events")}
    assert "step_completed" in kinds and "anomaly_detected" not in kinds


# -- user data is printed as typed ---------------------------------------------------------

# Rich markup and emoji codes: each would be rendered (or crash `show`) if taken as markup.
WF_NAME = "[bold]flow:child:"
STEP_NAME = "[/bold] oops"
SIGNAL = "[b]go:thumbs_up:"
NOTE = "[/red] :id: [link=x]y"
ERROR = "[/red] :fire: boom"
EMOJI = ("🧒", "🆔", "👍", "🔥")


def markup_app(url: str) -> ratchet.Ratchet:
    app = ratchet.Ratchet(url, lease_ttl=3.0, recovery_interval=0.5)

    @app.step(name=STEP_NAME)
    async def oops(note: str) -> dict[str, str]:
        return {"echo": note}

    @app.step(name=":child:summarize")
    async def summarize(note: str) -> str:
        if FLAKY["armed"]:
            FLAKY["armed"] = False
            raise RuntimeError(ERROR)
        return note

    @app.workflow(name=WF_NAME)
    async def flow(note: str) -> dict[str, Any]:
        first = await oops(note)
        decision = await ratchet.wait_for_signal(SIGNAL)
        return {"first": first, "decision": decision, "summary": await summarize(note)}

    return app


def assert_plain(text: str, *expected: str) -> None:
    for part in expected:
        assert part in text, (part, text)
    for emoji in EMOJI:
        assert emoji not in text, (emoji, text)


def test_user_strings_are_printed_as_typed_not_as_markup(db_url: str) -> None:
    FLAKY["armed"] = True
    app = markup_app(db_url)
    app.launch(queues=["[red]q:fire:"])
    try:
        run_id = app.start(WF_NAME, NOTE, run_id="order:id:42", queue="[red]q:fire:")
        wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
        out = ok("--db", db_url, "signal", run_id, SIGNAL, "--data", json.dumps({"by": NOTE}))
        assert_plain(out.stdout, f"signal {SIGNAL!r} sent to run order:id:42")
        with pytest.raises(ratchet.RunFailed):
            app.result(run_id, timeout_s=30)

        assert_plain(ok("--db", db_url, "runs").stdout, "order:id:42", f"{WF_NAME} v1")
        assert_plain(ok("--db", db_url, "dlq").stdout, "order:id:42", WF_NAME, ERROR)
        shown = ok("--db", db_url, "show", run_id).stdout
        assert_plain(
            shown,
            "order:id:42",
            WF_NAME,
            "[red]q:fire:",
            f"1:{STEP_NAME}",
            f"2:signal:{SIGNAL}",
            "3::child:summarize",
            ERROR,
            NOTE,
        )
        events = ok("--db", db_url, "events", run_id).stdout
        assert_plain(
            events, f"1:{STEP_NAME}", f"2:signal:{SIGNAL}", "3::child:summarize", ERROR, NOTE
        )

        assert_plain(ok("--db", db_url, "retry", run_id).stdout, "run order:id:42: re-queued")
        assert app.result(run_id, timeout_s=30)["summary"] == NOTE
        assert_plain(ok("--db", db_url, "show", run_id, "--full").stdout, NOTE)

        other = app.start(WF_NAME, NOTE, run_id="cancel:id:1", queue="[red]q:fire:")
        wait_for(lambda: app.get(other).status == RunStatus.WAITING)
        assert_plain(ok("--db", db_url, "cancel", other).stdout, "run cancel:id:1: cancelled")
    finally:
        app.shutdown()


# -- listings say when there is more ---------------------------------------------------------


def test_listings_say_when_more_rows_exist_than_shown(db_url: str) -> None:
    app = ratchet.Ratchet(db_url, lease_ttl=3.0, recovery_interval=0.5)

    @app.workflow()
    async def doomed(n: int) -> None:
        raise RuntimeError(f"doomed {n}")

    try:
        app.launch()
        for n in range(3):
            with pytest.raises(ratchet.RunFailed):
                app.result(app.start(doomed, n), timeout_s=30)
    finally:
        app.shutdown()

    table = ok("--db", db_url, "runs", "--limit", "2").stdout
    assert "showing 2 of 3 runs; --limit to see more" in table
    assert (
        "showing 2 of 3 runs with status failed"
        in ok("--db", db_url, "runs", "--limit", "2", "--status", "failed").stdout
    )
    assert "showing" not in ok("--db", db_url, "runs", "--limit", "3").stdout
    listed = invoke("--db", db_url, "runs", "--limit", "2", "--json")
    assert len(json.loads(listed.stdout)) == 2  # stdout stays pure JSON
    assert "showing 2 of 3 runs; --limit to see more" in listed.stderr

    assert (
        "showing 1 of 3 dead-lettered runs; --limit to see more"
        in ok("--db", db_url, "dlq", "--limit", "1").stdout
    )
    assert "showing" not in ok("--db", db_url, "dlq").stdout


def test_show_shortens_long_values_and_full_prints_them_whole(
    app: ratchet.Ratchet, db_url: str
) -> None:
    long_ticket = "T-" + "x" * 3000
    run_id = waiting_run(app, long_ticket)
    app.signal(run_id, "approve", {"by": "y" * 500})
    app.result(run_id, timeout_s=30)
    short = ok("--db", db_url, "show", run_id).stdout
    assert long_ticket not in short and "y" * 500 not in short and "…" in short
    assert "--full prints them whole" in short
    full = ok("--db", db_url, "show", run_id, "--full").stdout.splitlines()
    assert f'input       "{long_ticket}"' in full
    assert 'output      {"decision":{"by":"' + "y" * 500 + f'"}},"ticket":"{long_ticket}"}}' in full
    assert '  output  {"by":"' + "y" * 500 + '"}' in full


# -- opening the database --------------------------------------------------------------------

READERS = [["runs"], ["show", "r1"], ["events", "r1"], ["dlq"]]


@pytest.mark.parametrize("command", READERS)
def test_reading_commands_never_create_a_database(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "not" / "here.db"
    line = refused("--db", f"sqlite:///{path}", *command)
    assert line.startswith(f"error: no Ratchet database at '{path}': the file does not exist")
    assert list(tmp_path.iterdir()) == []


def test_a_tilde_in_a_sqlite_url_means_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    line = refused("--db", "sqlite:///~/r.db", "runs")
    assert f"no Ratchet database at '{home}/r.db'" in line
    create_database("sqlite:///~/r.db")
    assert (home / "r.db").exists()
    assert ok("--db", "sqlite:///~/r.db", "runs").stdout.strip() == "no runs"
    assert list(cwd.iterdir()) == []  # no literal "~" folder


@pytest.mark.parametrize("command", [*READERS, ["cancel", "r1"]])
def test_a_file_that_is_not_sqlite_is_one_clear_line(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 200)
    line = refused("--db", f"sqlite:///{path}", *command)
    assert line == f"error: cannot open SQLite database '{path}': file is not a database"


@contextlib.contextmanager
def write_protected(path: Path) -> Iterator[None]:
    """``path`` made read-only for this process; root ignores file modes, so for root the
    file is made immutable instead."""
    mode = path.stat().st_mode
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        path.chmod(0o444)
    try:
        yield
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


def test_a_read_only_database_file_is_read_and_writes_fail_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    with ratchet.Ratchet(url) as app:

        @app.workflow()
        async def idle() -> None: ...

        run_id = app.start(idle, run_id="r-1")
    with write_protected(tmp_path / "r.db"):
        [row] = json.loads(ok("--db", url, "runs", "--json").stdout)
        assert row["run_id"] == run_id and row["status"] == "queued"
        assert "r-1" in ok("--db", url, "show", run_id).stdout
        assert "run_queued" in ok("--db", url, "events", run_id).stdout
        line = refused("--db", url, "cancel", run_id)
        assert "readonly database" in line and str(tmp_path / "r.db") in line


def test_an_unreachable_postgresql_fails_fast_with_the_reason() -> None:
    started = time.monotonic()
    line = refused("--db", "postgresql://nobody@127.0.0.1:1/x", "runs")
    assert time.monotonic() - started < 5
    assert line.startswith("error: cannot connect to PostgreSQL: ") and "refused" in line


def test_a_missing_postgresql_database_fails_fast_with_the_servers_words(pg_url: str) -> None:
    # Whatever database RATCHET_TEST_POSTGRES_URL names: the same server, another database.
    missing = urlunsplit(urlsplit(pg_url)._replace(path="/ratchet_no_such_db"))
    assert urlsplit(missing).path != urlsplit(pg_url).path
    for command in (["runs"], ["cancel", "r1"]):
        started = time.monotonic()
        line = refused("--db", missing, *command)
        assert time.monotonic() - started < 5
        assert 'database "ratchet_no_such_db" does not exist' in line, line


def test_reading_an_empty_postgresql_database_says_so(pg_url: str) -> None:
    line = refused("--db", pg_url, "runs")
    assert line == (
        "error: no Ratchet tables in this PostgreSQL database (nothing has run against it yet?)"
    )


# -- fault-injection settings ----------------------------------------------------------------


def test_a_malformed_crash_point_is_one_line_and_client_commands_ignore_it(tmp_path: Path) -> None:
    (tmp_path / "shop.py").write_text(SHOP)
    url = f"sqlite:///{tmp_path}/c.db"
    create_database(url)
    env = {**os.environ, "RATCHET_CRASH_AT": "bogus"}
    env.pop("RATCHET_DATABASE_URL", None)

    def cli_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ratchet.cli", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = cli_run("--db", url, "runs")
    assert listed.returncode == 0 and listed.stdout.strip() == "no runs", listed.stderr
    worker = cli_run("worker", "shop:app", "--db", url)
    assert worker.returncode == 2
    assert worker.stderr.strip().splitlines() == [
        "error: RATCHET_CRASH_AT='bogus': unknown crash point 'bogus'; expected point:nth "
        "with point one of " + ", ".join(faults.POINTS)
    ]
