"""Rows that would otherwise grow without bound go when they stop mattering: a finished
run's lease and consumed signals (in the finishing transaction), a worker's row when it
shuts down cleanly or has long been gone. Lease epochs still never repeat."""

from __future__ import annotations

from typing import Any

import pytest

from ratchet.errors import LeaseLost
from ratchet.model import Event, EventKind, NewRun, RunStatus
from ratchet.store import Store

TTL = 10.0
SERVED = [("wf", "1")]


async def _count(store: Store, sql: str) -> int:
    return int(await store._read(lambda tx: tx._cur.execute(sql).fetchone()[0]))


def _after(
    events: list[Event],
    kind: str,
    payload: dict[str, Any] | None = None,
    step_id: str | None = None,
) -> Event:
    last = events[-1]
    return Event.chain(
        last.run_id, last.seq + 1, kind, step_id, None, payload or {}, 0.0, last.hash
    )


async def test_a_finished_run_keeps_no_lease_row_or_consumed_signal_and_epochs_go_on(
    store: Store,
) -> None:
    await store.create_run(NewRun("r1", "wf", "1", {"args": [], "kwargs": {}}))
    [first] = await store.claim("w1", TTL, 1, ["default"], SERVED)
    await store.send_signal("r1", "go", 1)
    await store.send_signal("r1", "unused", 2)
    found = await store.pending_signal("r1", "go")
    assert found is not None
    events = await store.load_events("r1")
    got = _after(events, EventKind.SIGNAL_RECEIVED, {"name": "go"}, "1:signal:go")
    await store.consume_signal(first.lease, [got], found[0])
    failed = _after([*events, got], EventKind.RUN_FAILED, {"error": "boom"})
    await store.finish(
        first.lease, [failed], RunStatus.FAILED, error="boom", dead_letter="step_failed"
    )

    assert await _count(store, "SELECT count(*) FROM run_locks") == 0
    # The consumed signal is in the journal; the one never consumed is its only record.
    assert await _count(store, "SELECT count(*) FROM signals WHERE name = 'go'") == 0
    assert await _count(store, "SELECT count(*) FROM signals WHERE name = 'unused'") == 1
    assert await store.lease("r1") is None

    # A retried dead letter is leased above every epoch it ever had, so the old holder
    # (same worker id) stays fenced.
    await store.retry_dead("r1")
    [second] = await store.claim("w1", TTL, 1, ["default"], SERVED)
    assert second.lease.epoch == first.lease.epoch + 1
    with pytest.raises(LeaseLost):
        await store.append(
            first.lease, [_after(await store.load_events("r1"), EventKind.RUN_RESUMED)]
        )


async def test_cancelling_an_unowned_run_drops_its_lease_row_and_fences_the_old_holder(
    store: Store,
) -> None:
    await store.create_run(NewRun("r1", "wf", "1", {"args": [], "kwargs": {}}))
    [claimed] = await store.claim("w1", TTL, 1, ["default"], SERVED)
    store.clock.advance(TTL + 1)
    assert await store.cancel("r1") == RunStatus.CANCELLED
    assert await _count(store, "SELECT count(*) FROM run_locks") == 0
    store.clock.advance(-(TTL + 1))
    with pytest.raises(LeaseLost):
        await store.append(
            claimed.lease, [_after(await store.load_events("r1"), EventKind.RUN_STARTED)]
        )


async def test_worker_rows_go_on_clean_shutdown_and_when_long_unseen(store: Store) -> None:
    for worker_id in ("clean", "crashed", "alive"):
        await store.register_worker(
            worker_id, "host", 1, serves=SERVED, queues=["default"], lease_ttl=TTL
        )
    assert [w.worker_id for w in await store.live_workers()] == ["alive", "clean", "crashed"]
    [alive] = [w for w in await store.live_workers() if w.worker_id == "alive"]
    assert alive.serves == frozenset(SERVED) and alive.queues == ("default",)

    await store.release_worker("clean")
    assert await _count(store, "SELECT count(*) FROM workers") == 2

    store.clock.advance(TTL + 1)  # both unseen for a TTL: not live, still known
    await store.renew("alive", TTL, [])
    assert [w.worker_id for w in await store.live_workers()] == ["alive"]
    store.clock.advance(TTL * 30)
    await store.renew("alive", TTL, [])
    await store.steal_expired("alive", TTL, 20, ["default"], SERVED)  # the sweep prunes
    assert await _count(store, "SELECT count(*) FROM workers") == 1
    # A worker pruned while cut off is seen again at its next renewal.
    await store._run(lambda tx: tx._cur.execute("DELETE FROM workers"))
    await store.renew("alive", TTL, [])
    assert [w.worker_id for w in await store.live_workers()] == ["alive"]
