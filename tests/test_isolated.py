"""The isolated tier end to end, with real bubblewrap sandboxes: a sandbox killed
mid-step resumes, a workload that always crashes fails after exactly three sandboxes, an
out-of-memory kill counts as a crash, the escape attempts fail from inside, and an owner
worker killed is taken over by the sweep without a second live sandbox."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import isolated_app as iso
import pytest
from sandboxes import kill_sandbox, live_sandboxes
from serving import serving
from typer.testing import CliRunner
from waiting import wait_for

import ratchet
from ratchet.cli import cli
from ratchet.engine.definitions import WorkflowDef
from ratchet.errors import InvalidInput
from ratchet.model import Event, dumps
from ratchet.receipts import verify
from ratchet.store import retention, tokens
from ratchet.store.sandboxes import SandboxRecord

# Real sandboxes: bubblewrap must be there (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("bwrap")

RESULT_S = 90.0


def _app(make_app: Callable[..., ratchet.Ratchet]) -> ratchet.Ratchet:
    app = make_app()
    # The isolated workflows (and tools) of the module the harness imports inside each
    # sandbox.
    app.workflows.update(iso.app.workflows)
    app.tools.update(iso.app.tools)
    return app


def _ended(app: ratchet.Ratchet, run_id: str, count: int) -> list[SandboxRecord]:
    """The run's sandboxes once ``count`` of them have ended (the run's end is journaled
    before its last sandbox's process is gone)."""
    return wait_for(
        lambda: (
            rows
            if len(rows := app.sandboxes(run_id)) == count
            and all(r.status == "terminated" for r in rows)
            else None
        ),
        timeout=30,
        what=f"{count} ended sandboxes of {run_id}",
        detail=lambda: str(app.sandboxes(run_id)),
    )


def _out_of_sandboxes(
    make_app: Callable[..., ratchet.Ratchet], workflow: WorkflowDef | str
) -> tuple[ratchet.Ratchet, str, list[SandboxRecord]]:
    """A run of ``workflow`` (one that never finishes) failed after its three sandboxes."""
    app = _app(make_app)
    app.launch()
    run_id = app.start(workflow)
    with pytest.raises(ratchet.RunFailed):
        app.result(run_id, timeout_s=RESULT_S)
    return app, run_id, _ended(app, run_id, 3)


def _started(events: list[Event], step_id: str) -> list[Event]:
    return [e for e in events if e.kind == "step_started" and e.step_id == step_id]


def test_a_sandbox_killed_mid_step_resumes_and_the_run_succeeds_once(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = _app(make_app)
    app.launch()
    run_id = app.start(iso.pipeline, 1)
    wait_for(
        lambda: _started(app.events(run_id), "2:slow"),
        timeout=60,
        what="step 2 to start in the first sandbox",
    )
    [(first, pids)] = live_sandboxes(run_id).items()
    # The sandbox's token reaches it through the environment, not a readable command line.
    assert all(b"RATCHET_REPORT_TOKEN" not in Path(f"/proc/{p}/cmdline").read_bytes() for p in pids)
    kill_sandbox(pids)
    out = app.result(run_id, timeout_s=RESULT_S)
    events = app.events(run_id)
    assert out["n"] == 20
    assert len(_started(events, "1:first")) == 1  # completed before the kill: skipped
    again = _started(events, "2:slow")
    assert len(again) == 2  # interrupted: run again, same attempt, same key
    assert again[0].payload["idempotency_key"] == again[1].payload["idempotency_key"]
    assert again[1].payload.get("resumed") is True and again[0].attempt == again[1].attempt
    assert [e.kind for e in events].count("run_succeeded") == 1
    resumed = [e for e in events if e.kind == "run_resumed"]
    assert [e.payload["reason"] for e in resumed] == ["resume"]  # RATCHET_RESUME=1
    rows = _ended(app, run_id, 2)
    assert [(r.attempt, r.end_reason) for r in rows] == [(1, "crashed"), (2, "finished")]
    assert rows[0].sandbox_id == first and rows[0].signal == 9
    assert rows[0].epoch < rows[1].epoch  # each sandbox writes under an epoch of its own
    assert not live_sandboxes(run_id)


def test_a_workload_that_always_crashes_fails_after_exactly_three_sandboxes(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = _app(make_app)
    app.launch()
    run_id = app.start(iso.always_crashes)
    with pytest.raises(ratchet.RunFailed):
        app.result(run_id, timeout_s=RESULT_S)
    end = app.events(run_id)[-1]
    assert end.kind == "run_failed"
    assert end.payload["code"] == "sandbox_resume_exhausted"
    assert end.payload["attempts"] == 3
    rows = _ended(app, run_id, 3)
    assert [(r.attempt, r.end_reason) for r in rows] == [
        (1, "crashed"),
        (2, "crashed"),
        (3, "crashed"),
    ]
    assert len(_started(app.events(run_id), "1:crash")) == 3
    [dead] = app.dead_letters()
    assert dead.run_id == run_id and dead.reason == "sandbox_resume_exhausted"
    # A retry gives the run three sandboxes more, no more.
    app.retry(run_id)
    with pytest.raises(ratchet.RunFailed):
        app.result(run_id, timeout_s=RESULT_S)
    assert [r.attempt for r in _ended(app, run_id, 6)] == [1, 2, 3, 4, 5, 6]
    assert app.events(run_id)[-1].payload["attempts"] == 3


def test_escape_attempts_fail_from_inside(
    make_app: Callable[..., ratchet.Ratchet], tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    code = Path(iso.__file__).read_bytes()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    app = _app(make_app)
    app.launch()
    run_id = app.start(iso.escape, str(secret), [5432, port])
    out = app.result(run_id, timeout_s=RESULT_S)
    assert out["read"] == "denied FileNotFoundError"  # not mounted: not there at all
    assert out["etc"] == "denied FileNotFoundError"
    # Not its user's file (EACCES: a worker running as root makes its sandboxes nobody),
    # and a read-only mount besides (EROFS).
    assert out["write"] in ("denied PermissionError", "denied OSError")
    assert all(t.startswith("denied") for t in out["tcp"]), out["tcp"]
    assert out["fork"].startswith("denied BlockingIOError after ")
    assert int(out["fork"].rsplit(" ", 1)[1]) < 48  # the process limit, not the loop's end
    # The host is unharmed: the file, the code, the listener that nothing reached.
    assert secret.read_text() == "host secret"
    assert Path(iso.__file__).read_bytes() == code
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    _ended(app, run_id, 1)
    assert not live_sandboxes(run_id)  # the fork bomb's children went with their sandbox


@pytest.fixture
def shown() -> Iterator[Path]:
    """The folder isolated_app.peek's sandbox is shown, empty, removed afterwards (after
    the test's apps, set up after it, are shut down)."""
    folder = Path(iso.SHOWN)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_file_kept_private_is_closed_to_a_sandbox_even_in_a_folder_it_is_shown(
    shown: Path, make_app: Callable[..., ratchet.Ratchet], monkeypatch: pytest.MonkeyPatch
) -> None:
    (shown / "open.txt").write_text("anyone")
    (shown / "open.txt").chmod(0o644)
    (shown / "private.txt").write_text("owner only")
    (shown / "private.txt").chmod(0o600)
    # Ratchet's data directory inside the shown folder: its key is masked there.
    monkeypatch.setenv("RATCHET_DATA_DIR", str(shown / "data"))
    app = _app(make_app)
    app.launch()
    key = shown / "data" / "signing_key.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    run_id = app.start(iso.peek, [str(shown / "open.txt"), str(shown / "private.txt"), str(key)])
    out = app.result(run_id, timeout_s=RESULT_S)
    assert out[0] == "READ anyone"
    # The second fence: the sandbox's user is not the file's owner (as root, a worker
    # makes its sandboxes nobody); the first: the data directory is masked.
    expected = "denied PermissionError" if os.geteuid() == 0 else "READ owner only"
    assert out[1:] == [expected, "denied FileNotFoundError"]


def test_the_worker_judges_an_isolated_runs_guards(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = _app(make_app)
    app.launch()
    run_id = app.start(iso.too_many, 1)
    with pytest.raises(ratchet.RunFailed, match="excessive_steps"):
        app.result(run_id, timeout_s=RESULT_S)
    events = app.events(run_id)
    assert [e.kind for e in events][-2:] == ["anomaly_detected", "run_failed"]
    assert events[-2].payload["kind"] == "excessive_steps"
    assert events[-1].payload["reason"] == "excessive_steps"
    # The third step never started: the worker refused it and ended the run.
    assert [e.step_id for e in events if e.kind == "step_started"] == ["1:quick", "2:quick"]
    assert [d.reason for d in app.dead_letters()] == ["excessive_steps"]
    [row] = _ended(app, run_id, 1)
    assert row.end_reason == "finished"


def test_a_cancel_kills_the_sandbox_and_the_cli_lists_it(
    make_app: Callable[..., ratchet.Ratchet], db_url: str
) -> None:
    app = _app(make_app)
    app.launch()
    run_id = app.start(iso.pipeline, 3)
    wait_for(lambda: _started(app.events(run_id), "2:slow"), timeout=60, what="step 2 to start")
    app.cancel(run_id, by="ana")
    with pytest.raises(ratchet.RunCancelled):
        app.result(run_id, timeout_s=RESULT_S)
    [row] = _ended(app, run_id, 1)
    assert row.end_reason == "killed" and row.signal == 9
    assert not live_sandboxes(run_id)
    ended = app.events(run_id)[-1]
    assert ended.kind == "run_cancelled" and ended.payload["by"] == "ana"
    listed = CliRunner().invoke(cli, ["--db", db_url, "sandboxes", run_id, "--json"])
    assert listed.exit_code == 0, listed.output
    assert [(r["sandbox_id"], r["end_reason"]) for r in json.loads(listed.output)] == [
        (row.sandbox_id, "killed")
    ]
    table = CliRunner().invoke(cli, ["--db", db_url, "sandboxes"])
    assert table.exit_code == 0 and row.sandbox_id in table.output
    unknown = CliRunner().invoke(cli, ["--db", db_url, "sandboxes", "no-such-run"])
    assert unknown.exit_code != 0 and "no-such-run" in unknown.output


def test_short_sleeps_and_retries_run_in_the_sandbox_and_a_park_is_refused(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = _app(make_app)
    app.launch()
    quick = app.start(iso.napping, False)
    assert app.result(quick, timeout_s=RESULT_S) == 2
    kinds = [e.kind for e in app.events(quick)]
    assert "step_waiting" in kinds and "step_retrying" in kinds
    parked = app.start(iso.napping, True)
    with pytest.raises(ratchet.RunFailed, match="not available in the isolated tier"):
        app.result(parked, timeout_s=RESULT_S)


def test_report_only_network_reaches_the_report_endpoint_and_nothing_else(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = _app(make_app)
    app.launch()
    run_id = app.start(iso.reporting, 5432)
    # 401: the endpoint answered (a token is needed); the database port stays shut.
    assert app.result(run_id, timeout_s=RESULT_S) == ["401", "denied ConnectionRefusedError"]


def test_memory_past_the_limit_is_killed_and_counted_as_a_crash(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, run_id, rows = _out_of_sandboxes(make_app, iso.hungry)
    assert [r.end_reason for r in rows] == ["oom", "oom", "oom"], rows
    limit = 128 * 1024 * 1024
    assert all(r.peak_memory is not None and r.peak_memory <= limit for r in rows)
    assert app.events(run_id)[-1].payload["code"] == "sandbox_resume_exhausted"


def test_a_workflow_the_sandbox_cannot_import_fails_its_run_saying_why(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    async def nested() -> int:  # not a module-level name: no sandbox can import it
        return 1

    app.workflow("nested", tier="isolated")(nested)
    app.launch()
    run_id = app.start("nested")
    with pytest.raises(ratchet.RunFailed, match="no sandbox could be started.*module-level"):
        app.result(run_id, timeout_s=RESULT_S)
    assert app.events(run_id)[-1].payload["reason"] == "sandbox_unavailable"


def test_an_isolated_graph_runs_its_nodes_in_a_sandbox(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = _app(make_app)
    version = app.graph(iso.GRAPH)
    app.launch()
    run_id = app.start("iso-graph", {"n": 3})
    out = app.result(run_id, timeout_s=RESULT_S)
    # Each tool node ran inside bubblewrap: its hostname and user, not the worker's.
    inside = {"host": "sandbox", "uid": 65534}
    assert out == {"first": {"n": 6, **inside}, "again": {"n": 12, **inside}}
    [row] = _ended(app, run_id, 1)
    assert (row.attempt, row.end_reason) == (1, "finished")
    assert app.get(run_id).workflow_version == version
    events = app.events(run_id)
    assert [e.step_id for e in events if e.kind == "step_completed"] == [
        "1:first",
        "2:again",
    ]  # the condition is pure: no step


def test_a_worker_that_cannot_make_sandboxes_leaves_isolated_runs_to_one_that_can(
    make_app: Callable[..., ratchet.Ratchet],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("RATCHET_BWRAP", str(tmp_path / "no-such-bwrap"))
    unable = _app(make_app)
    unable.graph(iso.GRAPH)

    async def plain() -> str:
        return "in-process"

    unable.workflow("plain")(plain)
    isolated = unable.start(iso.simple, 4)
    graph_run = unable.start("iso-graph", {"n": 3})
    after = unable.start("plain")  # queued after both: claimed once they were passed over
    worker = unable.launch()
    assert unable.result(after, timeout_s=RESULT_S) == "in-process"
    assert worker.can_isolate is False
    for run_id in (isolated, graph_run):
        assert unable.get(run_id).status == "queued"
        assert [e.kind for e in unable.events(run_id)] == ["run_queued"]
        assert unable.sandboxes(run_id) == []
    [me] = [w for w in unable.live_workers() if w.worker_id == worker.worker_id]
    assert ("simple", "1") not in me.serves and ("plain", "1") in me.serves
    why = [
        r.getMessage() for r in caplog.records if "action=isolation_unavailable" in r.getMessage()
    ]
    assert len(why) == 1 and "no-such-bwrap" in why[0]

    monkeypatch.delenv("RATCHET_BWRAP")
    able = _app(make_app)
    able.launch()
    assert able.result(isolated, timeout_s=RESULT_S) == 16
    assert able.result(graph_run, timeout_s=RESULT_S)["first"]["host"] == "sandbox"
    assert [r.end_reason for r in _ended(able, isolated, 1)] == ["finished"]
    assert len([r for r in caplog.records if "action=isolation_unavailable" in r.getMessage()]) == 1


def test_a_run_a_sandbox_ends_is_signed_in_the_commit_that_ends_it(
    make_app: Callable[..., ratchet.Ratchet], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RATCHET_DATA_DIR", str(tmp_path / "keys"))
    app = _app(make_app)
    app.launch()
    ok = app.start(iso.simple, 3)
    assert app.result(ok, timeout_s=RESULT_S) == 12
    # Out of sandboxes: ended by the worker, not by a report; signed all the same.
    crashed = app.start(iso.always_crashes)
    with pytest.raises(ratchet.RunFailed):
        app.result(crashed, timeout_s=RESULT_S)
    for run_id, end in ((ok, "run_succeeded"), (crashed, "run_failed")):
        # Stored with the run's end, not signed on demand: nobody has asked for it yet.
        stored = app.portal.call(retention.get_receipt(app.store, run_id))
        events = app.events(run_id)
        assert stored is not None and stored.seq == len(events) == events[-1].seq
        assert events[-1].kind == end
        lines = [dumps(e.export_dict()) for e in events]
        assert verify(stored.envelope, lines, app.signer.public).event_count == len(events)


def test_the_waterfall_api_shows_each_sandbox_of_an_isolated_run(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, run_id, rows = _out_of_sandboxes(make_app, iso.always_crashes)
    _, secret = app.portal.call(
        tokens.create_token(app.store, app.get(run_id).tenant_id, ("runs:read",))
    )
    with serving(app, workers=0) as base:
        wf = httpx.get(
            f"{base}/v1/runs/{run_id}/waterfall",
            timeout=30,
            headers={"Authorization": f"Bearer {secret}"},
        ).json()
    assert [
        (s["sandbox_id"], s["attempt"], s["end_reason"], s["signal"], s["status"])
        for s in wf["sandboxes"]
    ] == [(r.sandbox_id, r.attempt, "crashed", 9, "terminated") for r in rows]
    assert all(s["start"] <= s["end"] for s in wf["sandboxes"])


def test_sandbox_settings_are_checked_when_declared() -> None:
    app = ratchet.Ratchet("sqlite:///unused.db")
    bad = [
        dict(memory_mb=0),
        dict(cpus=-1),
        dict(timeout_s=0),
        dict(network="host"),
        dict(mounts=["relative/path"]),
        dict(mounts="/one/path"),
        dict(max_processes=1),
    ]
    for kwargs in bad:
        with pytest.raises(InvalidInput, match="Sandbox"):
            ratchet.Sandbox(**kwargs)  # type: ignore[arg-type]

    async def wf() -> None:
        return None

    with pytest.raises(InvalidInput, match="tier must be one of"):
        app.workflow(tier="vm")(wf)
    with pytest.raises(InvalidInput, match='needs tier="isolated"'):
        app.workflow(sandbox=ratchet.Sandbox())(wf)
    assert app.workflow("iso", tier="isolated")(wf).sandbox == ratchet.Sandbox()
    assert app.workflow("plain")(wf).sandbox is None


# -- the owner worker killed -------------------------------------------------------------


@pytest.fixture
def worker_procs(db_url: str, tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "ISO_DB_URL": db_url,
            "ISO_WORKER_ID": name,
            "ISO_LEASE_TTL": "3",
            "ISO_RECOVERY_INTERVAL": "0.5",
        }
        with (tmp_path / f"{name}.log").open("wb") as out:  # the child keeps its own fd
            proc = subprocess.Popen(
                [sys.executable, str(Path(iso.__file__))],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.crash
def test_owner_worker_killed_the_sweep_takes_over_without_a_second_live_sandbox(
    make_app: Callable[..., ratchet.Ratchet], worker_procs: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    app = _app(make_app)  # starts runs and reads them; drives nothing
    owner = worker_procs("owner")
    run_id = app.start(iso.pipeline, 2)
    wait_for(
        lambda: _started(app.events(run_id), "2:slow"),
        timeout=60,
        what="step 2 to start under the owner",
    )
    [first] = live_sandboxes(run_id)
    owner.kill()
    owner.wait()
    # bwrap --die-with-parent: the owner's sandbox goes with it.
    wait_for(lambda: not live_sandboxes(run_id), timeout=10, what="the owner's sandbox to die")
    worker_procs("heir")
    most = 0

    def finished() -> bool:
        nonlocal most
        most = max(most, len(live_sandboxes(run_id)))
        return app.get(run_id).status == "succeeded"

    wait_for(finished, timeout=RESULT_S, what="the heir to finish the run")
    assert most <= 1
    rows = _ended(app, run_id, 2)
    assert [(r.attempt, r.end_reason, r.worker_id) for r in rows] == [
        (1, "orphaned", "owner"),
        (2, "finished", "heir"),
    ]
    assert rows[0].sandbox_id == first
    events = app.events(run_id)
    # The owner's death is seen: the heir takes the run over at once.
    assert [e.payload["reason"] for e in events if e.kind == "run_resumed"] == ["takeover"]
    assert len(_started(events, "1:first")) == 1 and len(_started(events, "2:slow")) == 2
    assert app.result(run_id)["n"] == 30


def test_an_isolated_run_fails_at_its_deadline_and_its_sandbox_is_killed(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    """The run's deadline (``timeout_s``) holds in the isolated tier as in-process: the
    worker kills the sandbox there, long before the sandbox's own time limit, and ends
    the run with ``RunTimeout`` (dead letter ``timeout``)."""
    app = _app(make_app)
    app.launch()
    began = time.monotonic()
    run_id = app.start(iso.past_its_deadline)
    with pytest.raises(ratchet.RunTimeout, match="passed its deadline"):
        app.result(run_id, timeout_s=RESULT_S)
    assert time.monotonic() - began < 60  # the sandbox's own limit is 120 s
    [row] = _ended(app, run_id, 1)
    assert row.end_reason == "timeout", row
    [dead] = [d for d in app.dead_letters() if d.run_id == run_id]
    assert dead.reason == "timeout"
    events = app.events(run_id)
    assert [e.kind for e in events][-1] == "run_failed"
    assert events[-1].payload == {"error": dead.error, "reason": "timeout"}
    assert _started(events, "1:quick") and _started(events, "2:hang")
    # The sandbox journals a step's arguments as a worker does (what it was called with).
    assert [e.payload["args"] for e in _started(events, "1:quick")] == [{"n": 1}]
    assert _started(events, "2:hang")[0].payload["args"] == {}
