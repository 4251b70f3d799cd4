"""Queues with limits the database enforces across every worker, on SQLite and PostgreSQL,
with several real worker processes (tests/support/queues_app.py): a limit one process
counted alone would be exceeded here, since each worker has free slots of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import queues_app
from proc import Harness
from waiting import wait_for

import ratchet
from ratchet.errors import InvalidInput, UnknownQueue

pytestmark = pytest.mark.crash


@pytest.fixture
def q(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, queues_app)
    try:
        yield harness
    finally:
        harness.close()


def intervals(h: Harness) -> dict[str, tuple[float, float]]:
    """Each run's step, from its start to its end, as the invocation log has them (a run
    whose step ran twice, after a crash, has its last start)."""
    starts = {r["run_id"]: r["at"] for r in h.invocations("start")}
    return {r["run_id"]: (starts[r["run_id"]], r["at"]) for r in h.invocations("end")}


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one moment."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        now += step
        most = max(most, now)
    return most


def wait_done(h: Harness, run_ids: list[str], timeout: float = 30.0) -> None:
    for run_id in run_ids:
        h.wait_status(run_id, "succeeded", timeout=timeout)


def running(h: Harness, queue: str) -> int:
    [view] = [v for v in h.app.queues() if v.limits.name == queue]
    return view.in_flight


def test_concurrency_holds_across_worker_processes(q: Harness) -> None:
    workers = [q.spawn(f"w{i}", concurrency=4) for i in range(3)]
    for w in workers:
        w.wait_started()
    ids = [q.app.start("limited", dwell=0.3) for _ in range(10)]
    wait_done(q, ids)
    spans = intervals(q)
    assert len(spans) == 10
    # Twelve free slots among three processes, and never more than two runs at once.
    assert most_at_once(list(spans.values())) == 2


def test_per_key_concurrency_holds_per_key_across_processes(q: Harness) -> None:
    for i in range(2):
        q.spawn(f"w{i}", concurrency=4).wait_started()
    keys = ["a", "a", "a", "b", "b", "c"]
    ids = [q.app.start("keyed", dwell=0.3, concurrency_key=k) for k in keys]
    wait_done(q, ids)
    spans = intervals(q)
    for key in set(keys):
        mine = [spans[r] for r, k in zip(ids, keys, strict=True) if k == key]
        assert most_at_once(mine) == 1, key
    assert most_at_once(list(spans.values())) > 1  # other keys ran beside each other


def test_rate_limits_first_drives_per_window(q: Harness) -> None:
    for i in range(2):
        q.spawn(f"w{i}", concurrency=4).wait_started()
    ids = [q.app.start("rated") for _ in range(6)]
    wait_done(q, ids)
    starts = sorted(r["at"] for r in q.invocations("start"))
    # Two first drives a second: the sixth cannot start before two windows went by (seen
    # from the steps, whose starts lag their claims by a scheduling delay each).
    assert starts[-1] - starts[0] >= 2 * queues_app.RATE.per_s - 0.5
    # As the database counted them: any three first drives span a window at least.
    firsts = sorted(_first_started(q, ids))
    for i in range(len(firsts) - 2):
        assert firsts[i + 2] - firsts[i] >= queues_app.RATE.per_s - 0.01, firsts


def _first_started(h: Harness, ids: list[str]) -> list[float]:
    """When the database recorded each run's first drive (its clock, which the rate reads)."""
    store = h.app.store
    rows: list[Any] = h.app.portal.call(
        store._read(lambda tx: [tx.one("run_first_started", {"run_id": r}) for r in ids])
    )
    return [float(r["first_started_at"]) for r in rows]


def test_queued_runs_are_claimed_in_priority_then_age_order(q: Harness) -> None:
    w = q.spawn("w", concurrency=4)
    w.wait_started()
    blocker = q.app.start("single", block="blocker")
    q.wait_invoked("1:hold", event="start")
    old = q.app.start("single")
    new = q.app.start("single")
    urgent = q.app.start("single", priority=5)
    q.open_gate("blocker")
    wait_done(q, [blocker, old, new, urgent])
    order = [r["run_id"] for r in q.invocations("start")]
    assert order == [blocker, urgent, old, new]


def test_limits_changed_at_run_time_take_effect(q: Harness) -> None:
    for i in range(2):
        q.spawn(f"w{i}", concurrency=4).wait_started()
    q.app.set_queue_limits("limited", concurrency=1)
    ids = [q.app.start("limited", dwell=0.2) for _ in range(4)]
    wait_done(q, ids)
    assert most_at_once(list(intervals(q).values())) == 1
    [view] = [v for v in q.app.queues() if v.limits.name == "limited"]
    assert view.limits.concurrency == 1 and view.set_by == "api"
    # A declaration in code (an app or worker starting) leaves the API's limits standing.
    queues_app.build(q.db_url).shutdown()
    again = queues_app.build(q.db_url)
    try:
        [view] = [v for v in again.queues() if v.limits.name == "limited"]
        assert view.limits.concurrency == 1
    finally:
        again.shutdown()


def test_bad_limits_and_unknown_queues_are_refused_writing_nothing(q: Harness) -> None:
    before = {v.limits.name: v.limits for v in q.app.queues()}
    with pytest.raises(InvalidInput, match="concurrency"):
        q.app.set_queue_limits("limited", concurrency=-1)
    with pytest.raises(InvalidInput, match="per_key_concurrency"):
        q.app.set_queue_limits("limited", concurrency=3, per_key_concurrency=0)
    with pytest.raises(InvalidInput, match="unknown queue field"):
        q.app.set_queue_limits("limited", concurency=3)
    with pytest.raises(UnknownQueue, match="nowhere"):
        q.app.set_queue_limits("nowhere", concurrency=3)
    with pytest.raises(InvalidInput, match="rate"):
        ratchet.Rate(0, per_s=1)
    with pytest.raises(InvalidInput, match="concurrency"):
        q.app.queue("other", concurrency=0)
    after = {v.limits.name: v.limits for v in q.app.queues()}
    assert after == before and "nowhere" not in after


def test_a_killed_workers_slots_are_freed_by_takeover_without_double_counting(
    q: Harness,
) -> None:
    a = q.spawn("a", concurrency=4)
    a.wait_started()
    held = [q.app.start("limited", block=f"g{i}") for i in range(2)]
    wait_for(lambda: len(q.invocations("start")) == 2, timeout=15, what="two runs started")
    b = q.spawn("b", concurrency=4)
    b.wait_started()
    waiting = [q.app.start("limited", dwell=0.1) for _ in range(3)]
    a.kill()
    for run_id in held:
        b.wait_log(f"action=run_taken_over run_id={run_id}")
    # b holds the two runs a held; the queue's two slots are theirs, not freed twice.
    assert running(q, "limited") == 2
    assert {q.app.get(r).status for r in waiting} == {ratchet.RunStatus.QUEUED}
    for i in range(2):
        q.open_gate(f"g{i}")
    wait_done(q, held + waiting)
    assert most_at_once(list(intervals(q).values())) <= 2


def test_a_queue_that_holds_slots_while_parked_counts_its_parked_runs(q: Harness) -> None:
    q.spawn("w", concurrency=4).wait_started()
    first = q.app.start("listener")
    q.wait_parked(first, "signal:go")
    second = q.app.start("listener")
    # A claim after the second was queued: the worker took this run of another queue.
    q.wait_status(q.app.start("unlimited"), "succeeded")
    assert q.app.get(second).status == ratchet.RunStatus.QUEUED
    assert running(q, "parked") == 1  # the parked run holds the queue's one slot
    q.app.signal(first, "go", 1)
    q.wait_parked(second, "signal:go")  # its slot freed when the first ended
    q.app.set_queue_limits("parked", hold_while_parked=False)
    third = q.app.start("listener")
    q.wait_parked(third, "signal:go")  # parked runs hold no slot any more
    for run_id in (second, third):
        q.app.signal(run_id, "go", 2)
    wait_done(q, [first, second, third])


def test_a_delayed_start_holds_no_slot_of_a_queue_that_holds_parked_runs(q: Harness) -> None:
    # A start that may not begin yet waits on no key: it has not begun, so even a queue
    # whose parked runs keep their slots counts it nowhere, and the next run takes the slot.
    later = q.app.start("listener", delay_s=3600)
    assert q.app.get(later).status == ratchet.RunStatus.WAITING
    assert running(q, "parked") == 0
    q.spawn("w", concurrency=4).wait_started()
    now = q.app.start("listener")
    q.wait_parked(now, "signal:go")
    assert running(q, "parked") == 1
    q.app.signal(now, "go", 1)
    wait_done(q, [now])
    q.app.cancel(later)


def test_a_freed_slot_is_handed_on_at_once_not_at_the_next_poll(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    # A worker that polls once in ten minutes: only the wake-up of a run's end (or park)
    # in a limited queue can hand its slot to the next run in time.
    app = make_app()
    app.queue("one_at_a_time", concurrency=1)

    @app.workflow(name="solo", queue="one_at_a_time")
    async def solo(i: int) -> int:
        if i == 1:
            await ratchet.sleep(0.01)  # parked, it holds no slot
        return i

    ids = [app.start(solo, i) for i in range(4)]
    app.launch(poll_interval=600)
    assert [app.result(r, timeout_s=60) for r in ids] == [0, 1, 2, 3]
