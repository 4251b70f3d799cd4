"""Which store errors are transient (StorageError) and which are not (StoreConflict,
ValueRefused), and a failed group commit failing only the run that caused it."""

from __future__ import annotations

import asyncio

import pytest

from ratchet.errors import SignalAlreadyConsumed, StorageError, StoreConflict, ValueRefused
from ratchet.model import Event, EventKind, Lease, NewRun
from ratchet.store import Store

TTL = 10.0
SERVED = [("wf", "1")]


async def _claimed(store: Store, *run_ids: str) -> dict[str, Lease]:
    for run_id in run_ids:
        await store.create_run(NewRun(run_id, "wf", "1", {"args": [], "kwargs": {}}))
    return {
        c.record.run_id: c.lease
        for c in await store.claim("w1", TTL, len(run_ids), ["default"], SERVED)
    }


def _after(events: list[Event], kind: str, step_id: str | None = None) -> Event:
    last = events[-1]
    return Event.chain(last.run_id, last.seq + 1, kind, step_id, None, {}, 0.0, last.hash)


async def test_a_signal_consumed_twice_is_a_logic_error_not_a_storage_error(store: Store) -> None:
    leases = await _claimed(store, "r1")
    await store.send_signal("r1", "go", 1)
    found = await store.pending_signal("r1", "go")
    assert found is not None
    events = await store.load_events("r1")
    first = _after(events, EventKind.SIGNAL_RECEIVED, "1:signal:go")
    await store.consume_signal(leases["r1"], [first], found[0])
    with pytest.raises(SignalAlreadyConsumed) as caught:
        await store.consume_signal(
            leases["r1"],
            [
                _after(
                    [*events, first],
                    EventKind.SIGNAL_RECEIVED,
                    "1:signal:go",
                )
            ],
            found[0],
        )
    assert not isinstance(caught.value, StorageError)
    assert [e.seq for e in await store.load_events("r1")] == [1, 2]


async def test_a_violated_constraint_is_a_store_conflict(store: Store) -> None:
    leases = await _claimed(store, "r1")
    events = await store.load_events("r1")
    ev = _after(events, EventKind.RUN_STARTED)
    await store.append(leases["r1"], [ev])
    with pytest.raises(StoreConflict) as caught:  # the same seq again: the primary key says no
        await store.append(leases["r1"], [ev])
    assert not isinstance(caught.value, StorageError)


async def test_one_bad_run_in_a_group_commit_fails_alone(store: Store) -> None:
    leases = await _claimed(store, "good", "bad", "good2")
    good = _after(await store.load_events("good"), EventKind.STEP_STARTED, "1:fine")
    good2 = _after(await store.load_events("good2"), EventKind.STEP_STARTED, "1:fine")
    # PostgreSQL's text type cannot hold NUL: the whole statement would fail.
    bad = _after(await store.load_events("bad"), EventKind.STEP_STARTED, "1:a\x00b")
    results = await asyncio.gather(
        store.append(leases["good"], [good]),
        store.append(leases["bad"], [bad]),
        store.append(leases["good2"], [good2]),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None, results
    if store.dialect != "sqlite":  # SQLite stores the NUL faithfully
        assert isinstance(results[1], ValueRefused), results
    assert [e.step_id for e in await store.load_events("good")] == [None, "1:fine"]
    assert [e.step_id for e in await store.load_events("good2")] == [None, "1:fine"]
