"""``ratchet.patched`` and ``ratchet.deprecate_patch`` on SQLite and PostgreSQL: a run that
reaches a patch first under the new code takes the new path (a marker journaled, no step
position taken), a run that went past it the old way keeps the old path, across SIGKILLs
and any number of replays; the non-determinism error of code changed the wrong way."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import isolated_app as iso
import pytest
import upgrade_app
from proc import Harness
from waiting import wait_for

import ratchet
from ratchet.errors import ValueRefused
from ratchet.model import Event, EventKind, RunStatus, fold
from ratchet.sandbox.report_check import Proposal, ReportCheck

KILLED = -signal.SIGKILL
PATCH = upgrade_app.PATCH


def markers(events: list[Event]) -> list[dict[str, object]]:
    return [e.payload for e in events if e.kind == EventKind.PATCH_MARKED]


def completed(events: list[Event]) -> list[str | None]:
    return [e.step_id for e in events if e.kind == EventKind.STEP_COMPLETED]


@pytest.fixture
def h(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, upgrade_app)
    try:
        yield harness
    finally:
        harness.close()


def test_patched_is_false_for_a_run_past_it_the_old_way_and_true_for_a_new_one_across_kills(
    h: Harness, db_url: str
) -> None:
    old_client = upgrade_app.build(db_url, code="old")
    try:
        old_run = old_client.start("refund", "r1", block=True)
    finally:
        old_client.shutdown()
    a = h.spawn("old", worker_id="w-patch", env_extra={"UPGRADE_CODE": "old"})
    h.wait_invoked("2:refund_v1")  # the old code went past the patch's point
    a.kill()
    assert a.wait_exit() == KILLED

    b = h.spawn("new", worker_id="w-patch", env_extra={"UPGRADE_CODE": "new"})
    # Re-driven under the new code: patched() is False, the old step goes on.
    wait_for(
        lambda: len([r for r in h.invocations() if r["step_id"] == "2:refund_v1"]) == 2,
        what="the old step to be resumed by the new code",
        detail=h.worker_logs,
    )
    new_run = h.app.start("refund", "r2", block=True)
    h.wait_invoked("2:refund_v2")  # a new run takes the new path
    b.kill()  # both runs die mid-step, under the new code
    assert b.wait_exit() == KILLED

    c = h.spawn("new-again", worker_id="w-patch", env_extra={"UPGRADE_CODE": "new"})
    wait_for(
        lambda: (
            len([r for r in h.invocations() if r["step_id"] == "2:refund_v1"]) == 3
            and len([r for r in h.invocations() if r["step_id"] == "2:refund_v2"]) == 2
        ),
        what="both runs to be replayed by the restarted worker",
        detail=h.worker_logs,
    )
    h.open_gate("refund-r1")
    h.open_gate("refund-r2")
    h.wait_status(old_run, "succeeded", timeout=30)
    h.wait_status(new_run, "succeeded", timeout=30)
    assert h.app.result(old_run) == "refunded r1 with the old prompt"
    assert h.app.result(new_run) == "refunded r2 with the fixed prompt"

    old_events, new_events = h.app.events(old_run), h.app.events(new_run)
    assert markers(old_events) == []  # the old way journals nothing, on every replay
    # One marker however many replays and kills; it takes no step position, so the step
    # after the patch keeps its id in both runs.
    assert markers(new_events) == [{"patch": PATCH, "taken": True, "after": 1}]
    assert completed(old_events) == ["1:look", "2:refund_v1", "3:notify"]
    assert completed(new_events) == ["1:look", "2:refund_v2", "3:notify"]
    assert [r["pid"] for r in h.invocations() if r["step_id"] == "2:refund_v1"] == [
        a.pid,
        b.pid,
        c.pid,
    ]
    marked = next(e for e in new_events if e.kind == EventKind.PATCH_MARKED)
    started = [e for e in new_events if e.kind == EventKind.STEP_STARTED]
    # Journaled before the new path's step started, with it (one commit).
    assert started[0].seq < marked.seq < started[1].seq


# -- in one process: runs parked at a signal while the code changes under them -------------


def _refund_app(db_url: str, code: str) -> ratchet.Ratchet:
    app = ratchet.Ratchet(db_url, lease_ttl=5.0)

    @app.step
    async def look() -> str:
        return "looked"

    @app.step
    async def refund_v1() -> str:
        return "old"

    @app.step
    async def refund_v2() -> str:
        return "new"

    @app.step
    async def notify(text: str) -> str:
        return text

    @app.workflow(name="refund")
    async def refund() -> str:
        await look()
        if code == "old":
            done = await refund_v1()
        elif code == "new":
            done = await (refund_v2() if ratchet.patched(PATCH) else refund_v1())
        else:
            ratchet.deprecate_patch(PATCH)
            done = await refund_v2()
        await ratchet.wait_for_signal("go")
        return await notify(done)

    return app


@pytest.fixture
def deploys(db_url: str) -> Iterator[dict[str, ratchet.Ratchet]]:
    apps = {code: _refund_app(db_url, code) for code in ("old", "new", "deprecated")}
    yield apps
    for app in apps.values():
        app.shutdown()


def _parked(app: ratchet.Ratchet, run_id: str) -> None:
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, what=f"{run_id} to park")


def test_deprecate_patch_keeps_marked_runs_and_marks_new_ones_and_old_ones_fail_clearly(
    deploys: dict[str, ratchet.Ratchet],
) -> None:
    old, new, deprecated = deploys["old"], deploys["new"], deploys["deprecated"]
    old.launch()
    past_it = old.start("refund")
    _parked(old, past_it)
    old.shutdown()
    new.launch()
    marked = new.start("refund")
    _parked(new, marked)
    new.shutdown()  # the deploy that deprecates the patch: no old run should remain...

    deprecated.launch()
    fresh = deprecated.start("refund")
    _parked(deprecated, fresh)
    for run_id in (marked, fresh, past_it):
        deprecated.signal(run_id, "go", None)
    assert deprecated.result(marked, timeout_s=30) == "new"
    assert markers(deprecated.events(marked)) == [{"patch": PATCH, "taken": True, "after": 1}]
    assert deprecated.result(fresh, timeout_s=30) == "new"
    assert markers(deprecated.events(fresh)) == [
        {"patch": PATCH, "taken": True, "after": 1, "deprecated": True}
    ]
    # ...but one did: the code calls another step where its journal holds the old one.
    with pytest.raises(ratchet.RunFailed) as failed:
        deprecated.result(past_it, timeout_s=30)
    error = str(failed.value)
    assert "NonDeterminismError: non-deterministic workflow refund version 1" in error
    assert "at step position 2 the journal holds step '2:refund_v1' (completed)" in error
    assert "but the code now calls step '2:refund_v2'" in error
    assert error.endswith("see docs/how-to/upgrading.md")
    [dead] = [d for d in deprecated.dead_letters() if d.run_id == past_it]
    assert dead.reason == "non_determinism"


def test_patched_outside_a_workflow_or_inside_a_step_is_refused(
    deploys: dict[str, ratchet.Ratchet],
) -> None:
    with pytest.raises(ratchet.RatchetError, match=r"ratchet.patched\(\) must be called in a wo"):
        ratchet.patched(PATCH)
    with pytest.raises(ratchet.InvalidInput, match="invalid patch name ''"):
        ratchet.patched("")
    app = deploys["new"]

    @app.step
    async def inside() -> str:
        ratchet.patched(PATCH)
        return "never"

    @app.workflow(name="misuse")
    async def misuse() -> str:
        return await inside()

    app.launch()
    with pytest.raises(ratchet.RunFailed, match=r"patched\(\) must be called in a workflow's co"):
        app.result(app.start("misuse"), timeout_s=30)


def test_an_isolated_runs_report_may_carry_a_patch_marker_once() -> None:
    state = fold("r", [])
    check = ReportCheck("r", state, {}, set())

    def marker(payload: dict[str, object], step_id: str | None = None) -> Proposal:
        return Proposal(EventKind.PATCH_MARKED, step_id, None, payload, "{}")

    good = {"patch": PATCH, "taken": True, "after": 1}
    check.check([marker(good)], finish=False)
    for bad, why in [
        ([marker(good), marker(good)], "is marked already"),
        ([marker({**good, "taken": False})], "new path only"),
        ([marker(good, "1:look")], "belongs to no step"),
        ([marker({**good, "by": "me"})], "has no field 'by'"),
    ]:
        with pytest.raises(ValueRefused, match=why):
            check.check(bad, finish=False)


@pytest.mark.usefixtures("bwrap")
def test_patched_in_an_isolated_run_is_reported_by_the_sandbox_and_journaled_by_the_host(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    app.workflows.update(iso.app.workflows)  # the module the harness imports in a sandbox
    app.tools.update(iso.app.tools)
    app.launch()
    run_id = app.start(iso.patched_in_sandbox, 3)
    assert app.result(run_id, timeout_s=90) == 12
    events = app.events(run_id)
    assert markers(events) == [{"patch": "double-twice", "taken": True, "after": 1}]
    assert completed(events) == ["1:quick", "2:quick"]
