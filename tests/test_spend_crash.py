"""Spend and deadlines across crashes, with real worker processes killed with SIGKILL, on
SQLite and PostgreSQL: a model call in flight when its worker died still counts against the
budget in the re-drive (once: it is re-sent under its key and billed once), a retry after a
dropped connection reads its key back from the journal, and a run's deadline fails it on
time whether its worker died in a step or it was parked with no worker at all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import spend_app
from proc import Harness
from waiting import wait_for

from ratchet.llm.server import LocalProvider, serve
from ratchet.model import EventKind, fold, idempotency_key

pytestmark = pytest.mark.crash
WORKER = "w-spend"  # each worker reclaims the last one's runs at once
CALL = "openai.chat.completions.create"


@pytest.fixture
def h(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, spend_app)
    try:
        yield harness
    finally:
        harness.close()


def test_a_call_in_flight_when_its_worker_died_counts_against_the_budget_once(h: Harness) -> None:
    server = LocalProvider()
    with serve(server) as base:
        env = {"CRASH_LLM_URL": base}
        # The first call is held by the provider while the other branch waits at its gate.
        server.fail("slow", times=1, delay_s=10.0, endpoint="chat")
        run_id = h.app.start("pair")
        a = h.spawn("a", worker_id=WORKER, env_extra=env)
        wait_for(lambda: server.stats()["received"] >= 1, what="the first call at the provider")
        h.wait_invoked("2:held")
        a.kill()
        # What a re-drive starts from: the journal holds the call as in flight, its worst
        # case reserved.
        state = fold(run_id, h.app.events(run_id))
        assert list(state.reserved) == [f"1:{CALL}"]
        assert state.reserved[f"1:{CALL}"]["tokens"] > spend_app.BUDGET // 2
        h.open_gate("b")
        b = h.spawn("b", worker_id=WORKER, env_extra=env)
        rec = h.wait_status(run_id, "failed", timeout=30)
        b.terminate()
        requests = server.requests()
    assert rec.error is not None and "tokens budget of 1500" in rec.error, rec.error
    events = h.app.events(run_id)
    [found] = [e.payload for e in events if e.kind == EventKind.ANOMALY_DETECTED]
    assert found["in_flight"] == state.reserved[f"1:{CALL}"]["tokens"]
    # The call in flight was re-sent under its own key (counted once: it does not trip on
    # its own reservation); the other call was never sent.
    started = [
        (e.step_id, e.attempt, e.payload["idempotency_key"])
        for e in events
        if e.kind == EventKind.STEP_STARTED and e.step_id and CALL in e.step_id
    ]
    key = idempotency_key(run_id, f"1:{CALL}", 1)
    assert started == [(f"1:{CALL}", 1, key), (f"1:{CALL}", 1, key)]
    assert {r["idempotency_key"] for r in requests} <= {key}
    assert [r["billed"] for r in requests].count(True) <= 1


def test_a_retry_after_a_dropped_connection_reads_its_key_back_after_a_crash(h: Harness) -> None:
    server = LocalProvider()
    with serve(server) as base:
        env = {"CRASH_LLM_URL": base}
        server.fail("drop", times=1, endpoint="chat")
        run_id = h.app.start("dropped")
        a = h.spawn("a", worker_id=WORKER, env_extra=env)
        h.wait_parked(run_id, "backoff:")  # between the attempts, released
        a.kill()
        b = h.spawn("b", worker_id=WORKER, env_extra=env)
        rec = h.wait_status(run_id, "succeeded", timeout=30)
        b.terminate()
        requests = server.requests()
    assert rec.output == "echo: question d"
    key = idempotency_key(run_id, f"1:{CALL}", 1)
    started = [e for e in h.app.events(run_id) if e.kind == EventKind.STEP_STARTED]
    assert [
        (e.attempt, e.payload["idempotency_key"], e.payload.get("key_attempt")) for e in started
    ] == [(1, key, None), (2, key, 1)]
    assert [(r["idempotency_key"], r["billed"], r["replayed"]) for r in requests] == [
        (key, True, False),
        (key, False, True),
    ]


def test_a_parked_run_fails_at_its_deadline_after_its_worker_was_killed(h: Harness) -> None:
    run_id = h.app.start("parent_with_deadline")
    a = h.spawn("a", worker_id="w-a")
    h.wait_invoked("1:held")
    h.open_gate("p")
    h.wait_parked(run_id, "child:")
    a.kill()
    # No worker holds the run; another one, started now, fails it when its deadline comes.
    h.spawn("b", worker_id="w-b")
    rec = h.wait_status(run_id, "failed", timeout=30)
    assert rec.error is not None and rec.error.startswith("RunTimeout: "), rec.error
    assert [d.reason for d in h.app.dead_letters() if d.run_id == run_id] == ["timeout"]
    assert h.app.get(f"{run_id}/2").status == "cancelled"
    events = h.app.events(run_id)
    started = next(e.at for e in events if e.kind == EventKind.RUN_STARTED)
    assert events[-1].kind == EventKind.RUN_FAILED
    assert events[-1].at - started >= spend_app.DEADLINE_S


def test_a_run_whose_worker_died_in_a_step_fails_at_its_deadline(h: Harness) -> None:
    run_id = h.app.start("step_with_deadline")
    a = h.spawn("a", worker_id="w-a", lease_ttl=2.0)
    h.wait_invoked("1:held")
    a.kill()
    h.spawn("b", worker_id="w-b", lease_ttl=2.0, recovery_interval=0.5)  # sweeps the run
    rec = h.wait_status(run_id, "failed", timeout=30)
    assert rec.error is not None and rec.error.startswith("RunTimeout: "), rec.error
    assert [d.reason for d in h.app.dead_letters() if d.run_id == run_id] == ["timeout"]
    events = h.app.events(run_id)
    assert not any(e.kind == EventKind.STEP_COMPLETED for e in events)
    started = next(e.at for e in events if e.kind == EventKind.RUN_STARTED)
    assert events[-1].at - started >= spend_app.DEADLINE_S
