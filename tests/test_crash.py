"""Crash tests with real worker processes, on SQLite and PostgreSQL.

A worker process (``tests/support/crash_app.py``) is killed with SIGKILL — from outside while a
step's code runs, or by the engine's own crash points (``RATCHET_CRASH_AT``) at a precise
line — or frozen with SIGSTOP, and another worker finishes the run. Each test then checks
the invariants of docs/concepts/invariants.md from what the processes left: the journal
(gapless, chained, one terminal event), the invocation log every step appends to before
doing anything (how often each step's code ran, under which key and attempt), the receipts
a delivery wrote and what an HTTP receiver saw.
"""

from __future__ import annotations

import json
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from proc import Harness, WorkerProc
from typer.testing import CliRunner
from waiting import wait_for

from ratchet import Event
from ratchet.cli import cli
from ratchet.model import EventKind, idempotency_key

pytestmark = pytest.mark.crash

KILLED = -signal.SIGKILL
TERMINAL = {EventKind.RUN_SUCCEEDED, EventKind.RUN_FAILED, EventKind.RUN_CANCELLED}
FIVE = ["out-1", "out-2", "out-3", "out-4", "out-5"]


# -- journal checks ------------------------------------------------------------------------


def check_journal(events: list[Event]) -> None:
    """seq is 1..N without gaps, each event chains to the one before, and exactly one
    terminal event exists: the last."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    prev = "0" * 64
    for e in events:
        assert e.prev_hash == prev, f"event {e.seq} ({e.kind}) does not chain to {e.seq - 1}"
        prev = e.hash
    terminal = [e for e in events if e.kind in TERMINAL]
    assert len(terminal) == 1, f"terminal events: {[(e.seq, e.kind) for e in terminal]}"
    assert events[-1].kind in TERMINAL, f"events after the terminal one: {events[-1]}"


def of_kind(events: list[Event], kind: str, step_id: str | None = None) -> list[Event]:
    return [e for e in events if e.kind == kind and (step_id is None or e.step_id == step_id)]


def one(events: list[Event], kind: str, step_id: str | None = None) -> Event:
    found = of_kind(events, kind, step_id)
    assert len(found) == 1, f"expected one {kind} {step_id or ''}, got {found}"
    return found[0]


# -- (a) SIGKILL while a step's code runs --------------------------------------------------


def test_kill_mid_step_rerun_reuses_the_key_and_runs_every_other_step_once(h: Harness) -> None:
    run_id = h.app.start("chain", n=5, block_at=[3])
    a = h.spawn("a", worker_id="w-a")
    h.wait_invoked("3:work")  # step 3's code is running, blocked on its gate
    a.kill()
    h.open_gate("step-3")
    b = h.spawn("a-restarted", worker_id="w-a")

    h.wait_status(run_id, "succeeded")
    assert h.app.result(run_id) == FIVE
    events = h.app.events(run_id)
    check_journal(events)
    assert h.calls() == {"1:work": 1, "2:work": 1, "3:work": 2, "4:work": 1, "5:work": 1}
    first, second = [r for r in h.invocations() if r["step_id"] == "3:work"]
    assert (first["pid"], second["pid"]) == (a.pid, b.pid)
    assert first["attempt"] == second["attempt"] == 1
    assert (
        first["idempotency_key"]
        == second["idempotency_key"]
        == idempotency_key(run_id, "3:work", 1)
    )
    # The re-run announced itself as the interrupted attempt, not a new one.
    starts = of_kind(events, EventKind.STEP_STARTED, "3:work")
    assert [(e.attempt, e.payload.get("resumed", False)) for e in starts] == [(1, False), (1, True)]
    for step in ("1:work", "2:work", "4:work", "5:work"):
        one(events, EventKind.STEP_STARTED, step)
        one(events, EventKind.STEP_COMPLETED, step)
    one(events, EventKind.RUN_SUCCEEDED)


# -- (b) crash points between the journal's commits ----------------------------------------


@pytest.mark.parametrize(
    ("crash_at", "calls", "started_twice"),
    [
        # step 2's step_completed is committed (with step 3's step_started): nothing before
        # step 3 runs again, and step 3's code never ran before the crash.
        pytest.param("after_step_completed:2", {}, "3:work", id="after_step_completed"),
        # step 5 returned but its step_completed was still pending with run_succeeded: it
        # was never durable, so step 5 runs again, under the same key.
        pytest.param("before_terminal:1", {"5:work": 2}, "5:work", id="before_terminal"),
        # the run finished: re-driving it is a no-op.
        pytest.param("after_terminal:1", {}, None, id="after_terminal"),
    ],
)
def test_crash_point_then_restart_never_reruns_a_completed_step(
    h: Harness, crash_at: str, calls: dict[str, int], started_twice: str | None
) -> None:
    run_id = h.app.start("chain", n=5)
    a = h.spawn("a", worker_id="w-b", crash_at=crash_at)
    assert a.wait_exit() == KILLED
    before = h.app.events(run_id)
    b = h.spawn("a-restarted", worker_id="w-b")
    h.wait_status(run_id, "succeeded")
    b.wait_started()  # its reclaim is done: a no-op re-drive would have happened by now

    assert h.app.result(run_id) == FIVE
    events = h.app.events(run_id)
    check_journal(events)
    expected = {f"{i}:work": 1 for i in range(1, 6)} | calls
    assert h.calls() == expected
    assert events[: len(before)] == before  # the journal only grew
    if started_twice is None:
        assert events == before
        assert of_kind(events, EventKind.RUN_RESUMED) == []
    else:
        # The crash left the step started, and its code had not finished.
        assert (before[-1].kind, before[-1].step_id) == (EventKind.STEP_STARTED, started_twice)
        starts = of_kind(events, EventKind.STEP_STARTED, started_twice)
        assert [e.attempt for e in starts] == [1, 1]
        assert starts[0].payload["idempotency_key"] == starts[1].payload["idempotency_key"]
        keys = {r["idempotency_key"] for r in h.invocations() if r["step_id"] == started_twice}
        assert keys == {idempotency_key(run_id, started_twice, 1)}
        assert one(events, EventKind.RUN_RESUMED).payload["reason"] == "reclaim"
    for i in range(1, 6):
        one(events, EventKind.STEP_COMPLETED, f"{i}:work")


# -- (c) SIGKILL while the run is parked ---------------------------------------------------


def test_kill_while_sleeping_then_a_new_worker_finishes_after_the_timer(h: Harness) -> None:
    run_id = h.app.start("napper", seconds=3)
    a = h.spawn("a")
    h.wait_parked(run_id, "sleep:")
    a.kill()
    h.spawn("b")

    h.wait_status(run_id, "succeeded")
    assert h.app.result(run_id) == ["out-1", "out-3"]
    events = h.app.events(run_id)
    check_journal(events)
    assert h.calls() == {"1:work": 1, "3:work": 1}
    # The timer was journaled once and kept across the crash, not restarted.
    until = one(events, EventKind.STEP_WAITING, "2:sleep").payload["until"]
    assert one(events, EventKind.STEP_COMPLETED, "2:sleep").at >= until
    resumed = one(events, EventKind.RUN_RESUMED)
    assert resumed.payload["worker_id"] == "b"
    assert resumed.at >= until


def test_kill_while_waiting_for_a_signal_then_signal_and_a_new_worker_finishes(h: Harness) -> None:
    run_id = h.app.start("listener")
    a = h.spawn("a")
    h.wait_parked(run_id, "signal:go")
    a.kill()
    h.app.signal(run_id, "go", {"n": 7})
    h.spawn("b")

    h.wait_status(run_id, "succeeded")
    assert h.app.result(run_id) == ["out-1", {"n": 7}, "out-3"]
    events = h.app.events(run_id)
    check_journal(events)
    assert h.calls() == {"1:work": 1, "3:work": 1}
    one(events, EventKind.STEP_WAITING, "2:signal:go")
    one(events, EventKind.SIGNAL_RECEIVED, "2:signal:go")
    assert one(events, EventKind.STEP_COMPLETED, "2:signal:go").payload["output"] == {"n": 7}
    assert one(events, EventKind.RUN_RESUMED).payload["worker_id"] == "b"


# -- (d) a restarted worker reclaims its own runs at once ----------------------------------


def test_restarted_worker_reclaims_its_runs_before_the_lease_expires(h: Harness) -> None:
    def spawn(name: str) -> WorkerProc:
        return h.spawn(name, worker_id="w-fixed", lease_ttl=60.0, recovery_interval=60.0)

    run_id = h.app.start("chain", n=5, block_at=[3])
    a = spawn("a")
    h.wait_invoked("3:work")
    a.kill()
    holder, epoch, expires_at = h.lease(run_id)
    assert holder == "w-fixed"
    h.open_gate("step-3")
    spawn("a-restarted")

    # 60 s of lease left and no sweep for 60 s: finishing now is only possible by reclaim.
    h.wait_status(run_id, "succeeded", timeout=15)
    events = h.app.events(run_id)
    check_journal(events)
    resumed = one(events, EventKind.RUN_RESUMED)
    assert resumed.payload["reason"] == "reclaim"
    assert resumed.payload["worker_id"] == "w-fixed"
    assert resumed.payload["epoch"] == epoch + 1
    assert resumed.at < expires_at  # taken while the dead process's lease was still live
    assert h.calls() == {"1:work": 1, "2:work": 1, "3:work": 2, "4:work": 1, "5:work": 1}


# -- (e) another worker takes over once the lease expires ----------------------------------


def test_other_worker_sweeps_up_a_dead_workers_run_after_its_lease_expires(h: Harness) -> None:
    # The sweep is the backstop for a death no worker sees (tests/test_takeover.py has the
    # deaths they see): a's is hidden.
    run_id = h.app.start("chain", n=5, block_at=[3])
    a = h.spawn("a", lease_ttl=2.0, recovery_interval=60.0)
    h.wait_invoked("3:work")
    h.unseen("a")
    b = h.spawn("b", lease_ttl=2.0, recovery_interval=0.3)
    b.wait_started()  # b sweeps every 0.3 s while a is alive and renewing: no steal
    a.kill()
    holder, epoch, expires_at = h.lease(run_id)
    assert holder == "a"
    h.open_gate("step-3")

    h.wait_status(run_id, "succeeded")
    events = h.app.events(run_id)
    check_journal(events)
    resumed = one(events, EventKind.RUN_RESUMED)
    assert resumed.payload["reason"] == "sweep"
    assert resumed.payload["worker_id"] == "b"
    assert resumed.payload["epoch"] == epoch + 1
    assert resumed.at >= expires_at - 0.05  # not before the dead worker's lease ran out
    assert h.lease(run_id)[1] == epoch + 1
    assert h.calls() == {"1:work": 1, "2:work": 1, "3:work": 2, "4:work": 1, "5:work": 1}
    pids = [r["pid"] for r in h.invocations()]
    assert pids == [a.pid] * 3 + [b.pid] * 3


# -- (f) a frozen worker's lease is stolen; when it thaws, nothing it writes lands ---------


def test_frozen_worker_is_fenced_off_after_a_steal(h: Harness) -> None:
    run_id = h.app.start("chain", n=5, block_at=[3])
    # a freezes itself right after its second lease renewal, with step 3 blocked on its
    # gate. Frozen there, it has no transaction open (its only other loop, the claim loop,
    # is idle at concurrency 1), and its next renewal is a full ttl/3 away once it thaws,
    # so the blocked step, not the renewal, is what a touches first.
    a = h.spawn("a", lease_ttl=1.5, recovery_interval=60.0, concurrency=1, pause_at="after_renew:2")
    a.wait_stopped()
    a_call = h.wait_invoked("3:work", timeout=1)
    assert a_call["pid"] == a.pid
    assert h.app.events(run_id)[-1].kind == EventKind.STEP_STARTED

    h.open_gate("step-3")
    b = h.spawn("b", lease_ttl=5.0, recovery_interval=0.3)
    h.wait_status(run_id, "succeeded")
    events = h.app.events(run_id)
    resumed = one(events, EventKind.RUN_RESUMED)
    assert resumed.payload["reason"] == "sweep"
    assert resumed.payload["worker_id"] == "b"
    assert resumed.payload["epoch"] == a_call["epoch"] + 1
    assert a.state() == "T"  # a was frozen throughout

    a.cont()
    # Its step returns, and the next write (step 4's step_started) is refused.
    a.wait_log(f"action=lease_lost run_id={run_id} epoch={a_call['epoch']}")
    assert h.app.events(run_id) == events  # nothing from a landed
    check_journal(events)
    one(events, EventKind.RUN_SUCCEEDED)
    assert h.app.result(run_id) == FIVE
    # a's last event is step 3's step_started; every event after b's run_resumed is b's
    # drive, from its re-run of step 3 to the one terminal event, and nothing follows it.
    started, completed = EventKind.STEP_STARTED, EventKind.STEP_COMPLETED
    assert [(e.kind, e.step_id) for e in events] == [
        (EventKind.RUN_QUEUED, None),
        (EventKind.RUN_STARTED, None),
        (started, "1:work"),
        (completed, "1:work"),
        (started, "2:work"),
        (completed, "2:work"),
        (started, "3:work"),
        (EventKind.RUN_RESUMED, None),
        (started, "3:work"),
        (completed, "3:work"),
        (started, "4:work"),
        (completed, "4:work"),
        (started, "5:work"),
        (completed, "5:work"),
        (EventKind.RUN_SUCCEEDED, None),
    ]
    assert events[resumed.seq].payload.get("resumed") is True

    calls = h.invocations()
    assert Counter(r["step_id"] for r in calls) == {
        "1:work": 1,
        "2:work": 1,
        "3:work": 2,
        "4:work": 1,
        "5:work": 1,
    }
    a_calls = [r for r in calls if r["pid"] == a.pid]
    b_calls = [r for r in calls if r["pid"] == b.pid]
    assert [r["step_id"] for r in a_calls] == ["1:work", "2:work", "3:work"]
    assert [r["step_id"] for r in b_calls] == ["3:work", "4:work", "5:work"]
    assert (
        b_calls[0]["idempotency_key"]
        == a_call["idempotency_key"]
        == idempotency_key(run_id, "3:work", 1)
    )
    assert b_calls[0]["attempt"] == a_call["attempt"] == 1
    assert {r["epoch"] for r in b_calls} == {a_call["epoch"] + 1}
    assert h.lease(run_id)[1] == a_call["epoch"] + 1


# -- (g) receipts under crash --------------------------------------------------------------


class Receiver:
    """A tiny HTTP endpoint counting arrivals per ``Idempotency-Key``."""

    def __init__(self) -> None:
        self.arrivals: list[str] = []
        lock = threading.Lock()
        arrivals = self.arrivals

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self.headers.get("Idempotency-Key") or ""
                with lock:
                    arrivals.append(key)
                    count = arrivals.count(key)
                body = json.dumps({"key": key, "arrival": count}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def test_crash_between_dispatch_and_settle_with_resend_sends_again_under_the_same_key(
    h: Harness, receiver: Receiver
) -> None:
    run_id = h.app.start("courier", url=receiver.url, policy="resend")
    key = idempotency_key(run_id, "1:send", 1)
    a = h.spawn("a", worker_id="w-g", crash_at="after_dispatch:1")
    assert a.wait_exit() == KILLED
    assert receiver.arrivals == [key]
    assert [r.status for r in h.app.receipts(run_id)] == ["claimed"]
    h.spawn("a-restarted", worker_id="w-g")

    h.wait_status(run_id, "succeeded")
    assert receiver.arrivals == [key, key]  # two arrivals, one key: the receiver dedups
    assert h.app.result(run_id) == {"key": key, "arrival": 2}
    [receipt] = h.app.receipts(run_id)
    assert (receipt.idempotency_key, receipt.status) == (key, "settled")
    assert receipt.response == {"key": key, "arrival": 2}
    check_journal(h.app.events(run_id))
    assert h.calls() == {"1:send": 2, "2:work": 1}
    assert {r["idempotency_key"] for r in h.invocations() if r["step_id"] == "1:send"} == {key}


def test_crash_between_dispatch_and_settle_at_most_once_stops_for_a_person(
    h: Harness, receiver: Receiver
) -> None:
    run_id = h.app.start("courier", url=receiver.url, policy="at_most_once")
    key = idempotency_key(run_id, "1:send", 1)
    a = h.spawn("a", worker_id="w-g", crash_at="after_dispatch:1")
    assert a.wait_exit() == KILLED
    assert receiver.arrivals == [key]
    h.spawn("a-restarted", worker_id="w-g")

    rec = h.wait_status(run_id, "failed")
    assert receiver.arrivals == [key]  # not sent again
    assert rec.error is not None
    assert f"receipt {key}" in rec.error and "at_most_once" in rec.error
    [dead] = [d for d in h.app.dead_letters() if d.run_id == run_id]
    assert f"receipt {key}" in dead.error
    [receipt] = h.app.receipts(run_id)
    assert (receipt.idempotency_key, receipt.status) == (key, "claimed")
    events = h.app.events(run_id)
    check_journal(events)
    failed = one(events, EventKind.STEP_FAILED, "1:send")
    assert failed.payload["error_type"] == "ReceiptUnresolved"
    one(events, EventKind.RUN_FAILED)
    assert h.calls() == {"1:send": 2}  # re-driven once, refused before dispatch


def test_at_most_once_after_a_crash_is_settled_by_hand_and_retried_without_a_resend(
    h: Harness, receiver: Receiver
) -> None:
    run_id = h.app.start("courier", url=receiver.url, policy="at_most_once")
    key = idempotency_key(run_id, "1:send", 1)
    a = h.spawn("a", worker_id="w-g", crash_at="after_dispatch:1")
    assert a.wait_exit() == KILLED
    assert receiver.arrivals == [key]  # it arrived; the receipt never heard
    h.spawn("a-restarted", worker_id="w-g")
    h.wait_status(run_id, "failed")  # ReceiptUnresolved: stopped for a person

    def ratchet_cli(*args: str) -> str:
        result = CliRunner().invoke(cli, ["--db", h.db_url, *args])
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result.stdout

    [row] = json.loads(ratchet_cli("receipts", run_id, "--json"))
    assert (row["idempotency_key"], row["delivery"], row["status"]) == (key, "#1", "claimed")
    # The person asked the receiver what it answered, and records that.
    out = ratchet_cli(
        "receipts", "settle", key, "--response", json.dumps({"key": key, "arrival": 1})
    )
    assert f"ratchet retry {run_id}" in out
    ratchet_cli("retry", run_id)

    h.wait_status(run_id, "succeeded")
    assert receiver.arrivals == [key]  # exactly one dispatch, across the crash and the retry
    assert h.app.result(run_id) == {"key": key, "arrival": 1}
    events = h.app.events(run_id)
    # A retried run: failed once, then succeeded (the journal keeps both).
    assert [e.kind for e in events if e.kind in TERMINAL] == ["run_failed", "run_succeeded"]
    assert events[-1].kind == EventKind.RUN_SUCCEEDED
    # The retry is a new attempt; it found the delivery settled under attempt 1's key.
    assert [e.attempt for e in of_kind(events, EventKind.STEP_STARTED, "1:send")] == [1, 1, 2]
    assert h.calls() == {"1:send": 3, "2:work": 1}
    [receipt] = h.app.receipts(run_id)
    assert (receipt.idempotency_key, receipt.status, receipt.settled_by) == (key, "settled", "hand")


@pytest.mark.parametrize("policy", ["resend", "at_most_once"])
def test_kill_after_settle_never_dispatches_again(
    h: Harness, receiver: Receiver, policy: str
) -> None:
    run_id = h.app.start("courier", url=receiver.url, policy=policy, block_after=True)
    key = idempotency_key(run_id, "1:send", 1)
    a = h.spawn("a", worker_id="w-g")
    h.wait_invoked("1:send", event="settled")  # settled, step not yet completed
    [receipt] = h.app.receipts(run_id)
    assert receipt.status == "settled"
    a.kill()
    h.open_gate("after-settle")
    h.spawn("a-restarted", worker_id="w-g")

    h.wait_status(run_id, "succeeded")
    assert receiver.arrivals == [key]
    # The re-run step got the stored response back, without dispatching.
    assert h.app.result(run_id) == {"key": key, "arrival": 1}
    check_journal(h.app.events(run_id))
    assert h.calls() == {"1:send": 2, "2:work": 1}
    assert [r.status for r in h.app.receipts(run_id)] == ["settled"]


# -- (h) retries across a crash ------------------------------------------------------------


@pytest.mark.parametrize(
    ("succeed_on", "block_on", "status"),
    [
        # killed during attempt 2 of 3; attempt 3 succeeds
        pytest.param(3, 2, "succeeded", id="killed_in_attempt_2"),
        # killed during the last attempt; its re-run exhausts the budget, no fourth try
        pytest.param(99, 3, "failed", id="killed_in_last_attempt"),
    ],
)
def test_retry_attempts_continue_from_the_journal_across_a_crash(
    h: Harness, succeed_on: int, block_on: int, status: str
) -> None:
    run_id = h.app.start("retrier", succeed_on=succeed_on, block_on=block_on)
    a = h.spawn("a", worker_id="w-h")
    h.wait_invoked("1:flaky", attempt=block_on)
    a.kill()
    h.open_gate(f"attempt-{block_on}")
    b = h.spawn("a-restarted", worker_id="w-h")

    rec = h.wait_status(run_id, status)
    events = h.app.events(run_id)
    check_journal(events)
    calls = h.invocations()
    attempts = [1, 2, 2, 3] if block_on == 2 else [1, 2, 3, 3]
    assert [r["attempt"] for r in calls] == attempts
    assert [r["pid"] for r in calls] == [a.pid] * block_on + [b.pid] * (4 - block_on)
    for r in calls:
        assert r["idempotency_key"] == idempotency_key(run_id, "1:flaky", r["attempt"])
    starts = of_kind(events, EventKind.STEP_STARTED, "1:flaky")
    assert [e.attempt for e in starts] == attempts
    assert max(e.attempt or 0 for e in starts) <= 3
    retrying = of_kind(events, EventKind.STEP_RETRYING, "1:flaky")
    assert [(e.payload["attempt"], e.payload["of"]) for e in retrying] == [(1, 3), (2, 3)]
    for e in retrying:
        assert e.payload["error"] == f"ToolError: attempt {e.payload['attempt']} failed"
    if status == "succeeded":
        assert h.app.result(run_id) == "ok on attempt 3"
    else:
        failed = one(events, EventKind.STEP_FAILED, "1:flaky")
        assert failed.attempt == 3
        assert rec.error is not None and "attempt 3 failed" in rec.error
        assert [d.reason for d in h.app.dead_letters() if d.run_id == run_id] == ["step_failed"]


# -- several workers on one database --------------------------------------------------------


def test_several_worker_processes_share_runs_and_each_runs_once(h: Harness, db_url: str) -> None:
    workers = [h.spawn(f"w{i}", concurrency=4) for i in range(3)]
    for w in workers:
        w.wait_started()
    run_ids = [h.app.start("chain", n=3) for _ in range(30)]
    for run_id in run_ids:
        h.wait_status(run_id, "succeeded", timeout=60)
        check_journal(h.app.events(run_id))
    calls = Counter((r["run_id"], r["step_id"]) for r in h.invocations())
    assert len(calls) == 30 * 3 and set(calls.values()) == {1}  # every step of every run once
    pids = {r["pid"] for r in h.invocations()}
    if db_url.startswith("postgresql"):
        # On PostgreSQL the load is shared: SKIP LOCKED claims, NOTIFY wake-ups.
        assert len(pids) >= 2, f"one worker did everything: {pids}"
    assert pids <= {w.pid for w in workers}


# -- graceful shutdown (SIGTERM) -----------------------------------------------------------


def test_sigterm_lets_a_running_def_step_finish_before_the_run_is_handed_back(h: Harness) -> None:
    run_id = h.app.start("cruncher")
    a = h.spawn("a")
    h.wait_invoked("1:crunch")  # the def step runs on a's thread, blocked on its gate
    b = h.spawn("b")
    b.wait_started()
    a.terminate()
    a.wait_log(f"action=shutdown_grace worker_id={a.worker_id} runs=1 grace=10.0s")
    # In its grace period a still holds the run; b cannot start the step a second time.
    assert h.lease(run_id)[0] == a.worker_id
    assert h.app.get(run_id).status == "running"
    h.open_gate("sync-1")

    h.wait_status(run_id, "succeeded")
    assert a.wait_exit() == 0
    assert h.app.result(run_id) == ["crunched-1", "out-2"]
    events = h.app.events(run_id)
    check_journal(events)
    assert h.calls() == {"1:crunch": 1, "2:work": 1}
    assert [r["pid"] for r in h.invocations()] == [a.pid, b.pid]
    one(events, EventKind.STEP_STARTED, "1:crunch")
    assert one(events, EventKind.STEP_COMPLETED, "1:crunch").payload == {"output": "crunched-1"}
    # a handed the run back once its step was done, and b claimed it at once (no sweep).
    resumed = one(events, EventKind.RUN_RESUMED)
    assert (resumed.payload["worker_id"], resumed.payload["reason"]) == (b.worker_id, "claim")
    assert "action=shutdown_grace_over" not in a.log()


def test_sigterm_past_the_grace_interrupts_the_step_and_hands_the_run_back(h: Harness) -> None:
    run_id = h.app.start("chain", n=3, block_at=[2])
    a = h.spawn("a", grace=0.3)
    first = h.wait_invoked("2:work")  # blocked on its gate, longer than the grace
    b = h.spawn("b")
    b.wait_started()
    a.terminate()
    a.wait_log(f"action=shutdown_grace_over worker_id={a.worker_id} interrupted=1")
    assert a.wait_exit() == 0
    second = wait_for(
        lambda: (
            len(runs := [r for r in h.invocations() if r["step_id"] == "2:work"]) == 2 and runs[1]
        ),
        what="step 2:work to run again",
        detail=h.worker_logs,
    )
    h.open_gate("step-2")

    h.wait_status(run_id, "succeeded")
    assert h.app.result(run_id) == ["out-1", "out-2", "out-3"]
    events = h.app.events(run_id)
    check_journal(events)
    assert h.calls() == {"1:work": 1, "2:work": 2, "3:work": 1}
    assert (first["pid"], second["pid"]) == (a.pid, b.pid)
    assert first["attempt"] == second["attempt"] == 1
    assert (
        first["idempotency_key"]
        == second["idempotency_key"]
        == idempotency_key(run_id, "2:work", 1)
    )
    starts = of_kind(events, EventKind.STEP_STARTED, "2:work")
    assert [(e.attempt, e.payload.get("resumed", False)) for e in starts] == [(1, False), (1, True)]
    assert of_kind(events, EventKind.STEP_FAILED) == []  # interrupted, not failed
    resumed = one(events, EventKind.RUN_RESUMED)
    assert (resumed.payload["worker_id"], resumed.payload["reason"]) == (b.worker_id, "claim")


def test_sigterm_past_the_grace_keeps_a_def_steps_run_while_its_process_lives(h: Harness) -> None:
    # Python cannot stop the step's thread: handing the run back would let another worker
    # run the step beside it. The run stays leased to a, and a's liveness lock held, until
    # a's process exits (and its thread with it); then b takes it over at once.
    run_id = h.app.start("cruncher")
    a = h.spawn("a", grace=0.3, lease_ttl=15.0)
    h.wait_invoked("1:crunch")
    b = h.spawn("b", recovery_interval=30.0)
    b.wait_started()
    a.terminate()
    a.wait_log(f"action=hand_back_skipped run_id={run_id} threads=1")
    holder, epoch, expires_at = h.lease(run_id)
    assert holder == a.worker_id
    assert a.wait_exit() == 0
    h.open_gate("sync-1")

    h.wait_status(run_id, "succeeded")
    events = h.app.events(run_id)
    check_journal(events)
    resumed = one(events, EventKind.RUN_RESUMED)
    assert (resumed.payload["worker_id"], resumed.payload["reason"]) == (b.worker_id, "takeover")
    assert resumed.payload["epoch"] == epoch + 1
    assert resumed.at < expires_at  # a's death, not its lease's end
    first, second = [r for r in h.invocations() if r["step_id"] == "1:crunch"]
    assert (first["pid"], second["pid"]) == (a.pid, b.pid)
    assert first["idempotency_key"] == second["idempotency_key"]
