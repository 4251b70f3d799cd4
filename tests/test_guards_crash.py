"""Guards across crashes, with real worker processes killed with SIGKILL, on SQLite and
PostgreSQL: an anomaly journaled before the crash is not raised again by the re-drive that
replays the steps it was found at, and a pause asked before the crash is asked once."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import guards_app
import pytest
from proc import Harness
from waiting import wait_for

import ratchet
from ratchet.model import EventKind

pytestmark = pytest.mark.crash
WORKER = "w-guards"  # each worker reclaims the last one's runs at once


@pytest.fixture
def h(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, guards_app)
    try:
        yield harness
    finally:
        harness.close()


def anomalies(h: Harness, run_id: str) -> list[str]:
    return [e.payload["key"] for e in h.app.events(run_id) if e.kind == EventKind.ANOMALY_DETECTED]


def test_an_anomaly_journaled_before_a_crash_is_not_raised_again(h: Harness) -> None:
    run_id = h.app.start("watcher", 6)
    # The third poll's step_completed and the anomaly it trips are committed with the
    # fourth poll's step_started; the worker dies right after that commit.
    a = h.spawn("a", worker_id=WORKER, crash_at="after_step_completed:3")
    assert a.wait_exit() == -signal.SIGKILL
    assert anomalies(h, run_id) == ["runaway_loop:1:poll"]
    h.spawn("b", worker_id=WORKER)
    h.wait_status(run_id, "succeeded")
    assert h.app.result(run_id) == 6
    # The re-drive replayed polls 1-3 (the streak that tripped) and went on: nothing new.
    assert anomalies(h, run_id) == ["runaway_loop:1:poll"]
    assert any(e.kind == EventKind.RUN_RESUMED for e in h.app.events(run_id))
    assert h.calls() == {f"{i}:poll": 1 for i in range(1, 7)}


def paused_killed_approved(h: Harness, workflow: str, n: int) -> tuple[str, ratchet.Approval]:
    """Start the run; once it parks on a guard's approval, SIGKILL its worker, approve, and
    let a new worker finish it."""
    run_id = h.app.start(workflow, n)
    a = h.spawn("a", worker_id=WORKER)
    h.wait_parked(run_id, "approval:")
    a.kill()
    [asked] = h.app.approvals(run_id)
    h.app.approve(run_id, asked.step_id, by="ops")
    h.spawn("b", worker_id=WORKER)
    h.wait_status(run_id, "succeeded")
    return run_id, asked


def test_a_pause_survives_a_killed_worker_and_is_decided_once(h: Harness) -> None:
    run_id, asked = paused_killed_approved(h, "careful", 5)
    assert asked.name == "guard:runaway_loop"
    events = h.app.events(run_id)
    assert anomalies(h, run_id) == ["runaway_loop:1:poll"]
    assert [e.step_id for e in events if e.kind == EventKind.APPROVAL_DECIDED] == [
        "4:approval:guard:runaway_loop"
    ]
    assert h.calls() == {f"{i}:poll": 1 for i in (1, 2, 3, 5, 6)}


def test_a_pause_before_a_step_is_asked_again_in_its_place_after_a_kill(h: Harness) -> None:
    run_id, asked = paused_killed_approved(h, "long_run", 5)
    # Step 4 was allocated and never started: the pause came first, as step 5.
    assert (asked.name, asked.step_id) == (
        "guard:excessive_steps",
        "5:approval:guard:excessive_steps",
    )
    assert anomalies(h, run_id) == ["excessive_steps"]
    assert h.calls() == {f"{i}:poll": 1 for i in (1, 2, 3, 4, 6)}


def test_pauses_of_parallel_branches_keep_their_decisions_when_replayed_in_another_order(
    h: Harness,
) -> None:
    run_id = h.app.start("branches")
    h.spawn("a", worker_id=WORKER)
    # right finishes (and pauses) first, then left: the replay meets them in the other order.
    h.open_gate("right")
    wait_for(lambda: h.app.approvals(run_id), what="right's pause", detail=h.worker_logs)
    h.open_gate("left")
    wait_for(lambda: len(h.app.approvals(run_id)) == 2, what="left's pause", detail=h.worker_logs)
    h.wait_parked(run_id, "any:")  # on both approvals at once
    for proc in h.procs:
        proc.kill()
    asked = {a.data["anomaly"]["key"]: a for a in h.app.approvals(run_id)}
    assert set(asked) == {"runaway_loop:1:left", "runaway_loop:2:right"}
    h.app.approve(run_id, asked["runaway_loop:1:left"].step_id, by="ops")
    h.app.reject(run_id, asked["runaway_loop:2:right"].step_id, by="ops", comment="stop")
    h.spawn("b", worker_id=WORKER)
    rec = h.wait_status(run_id, "failed")
    # The rejection stopped right's anomaly, though left replayed first.
    assert rec.error is not None and "step right ran" in rec.error, rec.error
    assert "ops declined to continue: stop" in rec.error
    events = h.app.events(run_id)
    named = {
        e.payload["key"]: e.payload["approval_step_id"]
        for e in events
        if e.kind == EventKind.ANOMALY_DETECTED
    }
    decided = {
        e.step_id: e.payload["approved"] for e in events if e.kind == EventKind.APPROVAL_DECIDED
    }
    # left's approval may not be read back before right's rejection ends the run; if it
    # was, it was the approval.
    assert decided[named["runaway_loop:2:right"]] is False
    assert decided.get(named["runaway_loop:1:left"], True) is True
    assert h.calls() == {"1:left": 1, "2:right": 1}
