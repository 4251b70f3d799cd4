"""Several versions of a workflow in one app, on SQLite and PostgreSQL: new runs take the
newest, a run keeps its version to the end (across a worker killed and restarted with the
new code), ``name@version`` starts one version (Python, CLI, API), and ``@`` in a name is
refused at registration."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import upgrade_app
from proc import Harness
from serving import serving
from typer.testing import CliRunner

import ratchet
from ratchet.cli import cli
from ratchet.engine.versions import WorkflowRegistry, version_key
from ratchet.model import EventKind
from ratchet.store import tokens

KILLED = -signal.SIGKILL


def test_version_key_sorts_versions_naturally() -> None:
    versions = ["10", "1.10", "2", "1.9", "9", "1", "1.2.0", "1.rc1", "01"]
    assert sorted(versions, key=version_key) == [
        "01",
        "1",
        "1.rc1",
        "1.2.0",
        "1.9",
        "1.10",
        "2",
        "9",
        "10",
    ]
    assert version_key("10") > version_key("9") > version_key("2")
    assert version_key("1.10") > version_key("1.9")
    assert version_key("v2") > version_key("v1") and version_key("v10") > version_key("v9")


async def _wf(x: int = 0) -> str:
    return "x"


def test_the_registry_gives_the_newest_by_name_and_one_version_by_name_at_version() -> None:
    registry = WorkflowRegistry()
    for version in ("2", "10", "9"):
        registry.add(ratchet.WorkflowDef(_wf, "checkout", version))
    assert registry["checkout"].version == "10"
    assert registry["checkout@9"].version == "9"
    assert "checkout@3" not in registry and list(registry) == ["checkout"]
    assert [wd.version for wd in registry.versions("checkout")] == ["2", "9", "10"]
    with pytest.raises(ratchet.UnknownWorkflow, match=r"has no version '3'; its versions: 2, 9"):
        registry.resolve("checkout@3")
    other = WorkflowRegistry()
    other["checkout"] = ratchet.WorkflowDef(_wf, "checkout", "11")
    registry.update(other)  # every version of another app's workflows
    assert registry["checkout"].version == "11"
    del registry["checkout@11"]
    assert registry["checkout"].version == "10"


@pytest.fixture
def app(db_url: str) -> Iterator[ratchet.Ratchet]:
    made = upgrade_app.build(db_url)
    yield made
    made.shutdown()


def test_two_versions_in_one_app_new_runs_take_the_newest_and_name_at_version_picks(
    app: ratchet.Ratchet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASH_LOG", str(tmp_path / "invocations.jsonl"))
    monkeypatch.setenv("CRASH_GATES", str(tmp_path))
    newest = app.start("checkout", "o-new")
    pinned = app.start("checkout@1", "o-old")
    assert (app.get(newest).workflow, app.get(newest).workflow_version) == ("checkout", "2")
    assert (app.get(pinned).workflow, app.get(pinned).workflow_version) == ("checkout", "1")
    app.launch()  # one worker serves both versions
    assert app.result(newest, timeout_s=30) == "v2: reserved o-new, charged o-new"
    assert app.result(pinned, timeout_s=30) == "v1: reserved o-old"
    # A fork keeps its source's version, though the app's newest is another.
    fork = app.fork(pinned, at="1:reserve", input={"order": "o-fork"})
    assert app.get(fork).workflow_version == "1"
    assert app.result(fork, timeout_s=30) == "v1: reserved o-fork"
    # A version the app lacks is refused, naming those it has; nothing is written.
    before = len(app.runs())
    with pytest.raises(ratchet.UnknownWorkflow, match=r"'checkout' has no version '7'.*1, 2"):
        app.start("checkout@7", "o")
    assert len(app.runs()) == before


def test_at_in_a_workflow_name_is_refused_at_registration(app: ratchet.Ratchet) -> None:
    async def pay() -> None:
        return None

    with pytest.raises(ratchet.InvalidInput, match=r"invalid workflow name 'pay@2': '@' sep"):
        app.workflow(name="pay@2")(pay)
    with pytest.raises(ratchet.InvalidInput, match="version 1 is already registered|'1' is"):
        app.workflow(name="checkout", version="1")(pay)
    assert "pay@2" not in app.workflows and app.workflows["checkout"].version == "2"


def test_name_at_version_starts_through_the_cli_and_the_api_and_every_version_is_listed(
    app: ratchet.Ratchet, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --app loads module:attribute from the current folder; --db points it at this database.
    (tmp_path / "upgrade_cli.py").write_text(
        "import upgrade_app\n\napp = upgrade_app.build('sqlite:///unused.db')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "upgrade_cli", raising=False)
    args = ["start", "checkout@1", "--app", "upgrade_cli:app", "--db", db_url]
    started = CliRunner().invoke(cli, [*args, "--input", '{"order": "c"}'])
    assert started.exit_code == 0, started.output
    assert app.get(started.stdout.strip()).workflow_version == "1"
    cli_refused = CliRunner().invoke(cli, ["start", "checkout@7", "--app", "upgrade_cli:app"])
    assert cli_refused.exit_code == 2, cli_refused.output
    assert "has no version '7'" in cli_refused.output
    _, secret = app.portal.call(tokens.create_token(app.store, "acme", ("runs:read", "runs:write")))
    auth = {"Authorization": f"Bearer {secret}"}
    with serving(app) as base, httpx.Client(base_url=base, headers=auth) as client:
        answer = client.post("/v1/runs", json={"workflow": "checkout@1", "input": {"order": "a"}})
        assert answer.status_code == 202, answer.text
        run = client.get(f"/v1/runs/{answer.json()['run_id']}").json()
        assert (run["workflow"], run["workflow_version"]) == ("checkout", "1")
        latest = client.post("/v1/runs", json={"workflow": "checkout", "input": {"order": "b"}})
        run = client.get(f"/v1/runs/{latest.json()['run_id']}").json()
        assert run["workflow_version"] == "2"
        refused = client.post("/v1/runs", json={"workflow": "checkout@7", "input": {}})
        assert refused.status_code == 422 and "no version '7'" in refused.json()["message"]
        assert refused.json()["details"] == {"workflow": "checkout@7"}
        listed = {w["name"]: w for w in client.get("/v1/workflows").json()}
        assert listed["checkout"]["version"] == "2"  # what a start of the name takes
        assert listed["checkout"]["versions"] == ["2", "1"]
        assert listed["refund"]["versions"] == ["1"]


def test_a_run_in_flight_on_v1_finishes_on_v1_after_its_worker_restarts_with_v2(
    db_url: str, tmp_path: Path
) -> None:
    h = Harness(db_url, tmp_path, upgrade_app)
    try:
        old = upgrade_app.build(db_url, code="old")  # the client of the old deploy
        try:
            in_flight = old.start("checkout", "o1", block=True)
        finally:
            old.shutdown()
        assert h.app.get(in_flight).workflow_version == "1"
        a = h.spawn("old", worker_id="w-up", env_extra={"UPGRADE_CODE": "old"})
        h.wait_invoked("1:reserve")  # v1's step runs, held at its gate
        a.kill()
        assert a.wait_exit() == KILLED
        b = h.spawn("new", worker_id="w-up", env_extra={"UPGRADE_CODE": "new"})
        fresh = h.app.start("checkout", "o2")  # the new deploy's start: version 2
        h.open_gate("reserve-o1")
        h.wait_status(in_flight, "succeeded", timeout=30)
        h.wait_status(fresh, "succeeded", timeout=30)
        assert h.app.result(in_flight) == "v1: reserved o1"  # v1's code, to the end
        assert h.app.result(fresh) == "v2: reserved o2, charged o2"
        assert h.app.get(fresh).workflow_version == "2"
        steps = [e.step_id for e in h.app.events(in_flight) if e.kind == EventKind.STEP_COMPLETED]
        assert steps == ["1:reserve"]  # v2's charge step never ran for it
        pids = [r["pid"] for r in h.invocations() if r["run_id"] == in_flight]
        assert pids == [a.pid, b.pid]  # started by the old worker, finished by the new one
    finally:
        h.close()


def test_a_drive_of_a_version_the_worker_lacks_fails_it_and_runs_no_other_versions_code(
    app: ratchet.Ratchet, db_url: str
) -> None:
    from ratchet.engine.control import Control
    from ratchet.engine.driver import drive

    run_id = app.start("checkout@1", "o")
    only_v2 = ratchet.Ratchet(db_url)
    try:

        @only_v2.workflow(name="checkout", version="2")
        async def checkout_v2(order: str, block: bool = False) -> str:
            raise AssertionError("version 2's code drove a run of version 1")

        # Its worker would never claim the run (it serves ("checkout", "2") only); a drive
        # that reaches it anyway fails it as a run of an unknown workflow, naming both.
        store = only_v2.store
        [claimed] = only_v2.portal.call(store.claim("w", 10.0, 1, ["default"], [("checkout", "1")]))
        outcome = only_v2.portal.call(drive(store, claimed, only_v2.workflows, Control()))
        assert outcome == "failed"
        rec = only_v2.get(run_id)
        assert rec.error == (
            "RatchetError: workflow 'checkout' version '1' is not registered with this "
            "worker (it has version 2)"
        )
        assert [e.kind for e in only_v2.events(run_id)] == [
            "run_queued",
            "run_started",
            "run_failed",
        ]
    finally:
        only_v2.shutdown()
