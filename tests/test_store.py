"""The Store contract, run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from ratchet.errors import ConfigError, LeaseLost, RunFinished, RunIdConflict, UnknownRun
from ratchet.model import Event, EventKind, Lease, NewRun, RunStatus, fold
from ratchet.store import Clock, Store, make_store
from ratchet.store.queries import load_migrations

TTL = 10.0
SERVED = [("wf", "1")]


async def _new(store: Store, run_id: str = "r1", queue: str = "default") -> None:
    _, created = await store.create_run(
        NewRun(run_id, "wf", "1", {"args": [], "kwargs": {}}, queue)
    )
    assert created


def _next(
    events: list[Event],
    kind: str,
    payload: dict[str, Any] | None = None,
    step_id: str | None = None,
) -> Event:
    last = events[-1]
    return Event.chain(
        last.run_id, last.seq + 1, kind, step_id, None, payload or {}, 0.0, last.hash
    )


async def test_create_run_is_idempotent_and_journals_run_queued(store: Store) -> None:
    rec, created = await store.create_run(NewRun("r1", "wf", "1", {"x": 1}))
    again, created_again = await store.create_run(NewRun("r1", "wf", "1", {"x": 1}))
    assert created and not created_again
    assert again.input == {"x": 1} and rec.status == RunStatus.QUEUED
    with pytest.raises(RunIdConflict, match=r'input \{"x":1\} \(not \{"x":2\}\)'):
        await store.create_run(NewRun("r1", "wf", "1", {"x": 2}))
    events = await store.load_events("r1")
    assert [(e.seq, e.kind) for e in events] == [(1, "run_queued")]


async def test_claim_takes_a_run_once_and_append_checks_the_lease(store: Store) -> None:
    await _new(store)
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    assert await store.claim("w2", TTL, 10, ["default"], SERVED) == []
    events = await store.load_events("r1")
    ev = _next(events, EventKind.RUN_STARTED)
    await store.append(claimed.lease, [ev])
    stale = Lease("r1", "w1", claimed.lease.epoch + 1)
    with pytest.raises(LeaseLost):
        await store.append(stale, [_next([*events, ev], EventKind.STEP_STARTED, step_id="1:a")])
    assert [e.seq for e in await store.load_events("r1")] == [1, 2]


async def test_queues_are_separate(store: Store) -> None:
    await _new(store, "r1", queue="slow")
    assert await store.claim("w1", TTL, 10, ["default"], SERVED) == []
    assert len(await store.claim("w1", TTL, 10, ["slow"], SERVED)) == 1


async def test_expired_lease_is_stolen_with_a_higher_epoch_and_the_old_holder_is_fenced(
    store: Store,
) -> None:
    await _new(store)
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    assert await store.steal_expired("w2", TTL, 20, ["default"], SERVED) == []  # still live
    store.clock.advance(TTL + 1)
    # An expired but unstolen lease may not append either: "live" is checked, not assumed.
    events = await store.load_events("r1")
    with pytest.raises(LeaseLost):
        await store.append(claimed.lease, [_next(events, EventKind.RUN_STARTED)])
    [stolen] = await store.steal_expired("w2", TTL, 20, ["default"], SERVED)
    assert stolen.lease.epoch == claimed.lease.epoch + 1 and stolen.reason == "sweep"
    # Renewal tells the old holder it lost the run.
    assert await store.renew("w1", TTL, ["r1"]) == []
    held = await store.renew("w2", TTL, ["r1"])
    assert [(h.run_id, h.epoch) for h in held] == [("r1", stolen.lease.epoch)]
    await store.append(stolen.lease, [_next(events, EventKind.RUN_RESUMED)])
    with pytest.raises(LeaseLost):
        await store.append(claimed.lease, [_next(events, EventKind.RUN_STARTED)])


async def test_sweep_takes_at_most_its_limit(store: Store) -> None:
    for i in range(25):
        await _new(store, f"r{i:02d}")
    assert len(await store.claim("w1", TTL, 25, ["default"], SERVED)) == 25
    store.clock.advance(TTL + 1)
    assert len(await store.steal_expired("w2", TTL, 20, ["default"], SERVED)) == 20
    assert len(await store.steal_expired("w2", TTL, 20, ["default"], SERVED)) == 5


async def test_two_sweepers_race_and_one_wins_each_run(db_url: str) -> None:
    stores = [make_store(db_url, Clock()) for _ in range(2)]
    for s in stores:
        await s.open()
    try:
        for i in range(10):
            await _new(stores[0], f"r{i}")
        await stores[0].claim("dead", TTL, 10, ["default"], SERVED)
        for s in stores:
            s.clock.advance(TTL + 1)
        got = await asyncio.gather(
            *(
                s.steal_expired(f"sweeper{i}", TTL, 20, ["default"], SERVED)
                for i, s in enumerate(stores)
            )
        )
        ids = [c.record.run_id for batch in got for c in batch]
        assert sorted(ids) == sorted(f"r{i}" for i in range(10))  # each exactly once
    finally:
        for s in stores:
            await s.close()


async def test_reclaim_own_takes_back_running_runs_at_once(store: Store) -> None:
    await _new(store)
    [claimed] = await store.claim("w-fixed", TTL, 10, ["default"], SERVED)
    [again] = await store.reclaim_own("w-fixed", TTL, SERVED)
    assert again.reason == "reclaim" and again.lease.epoch == claimed.lease.epoch + 1
    assert await store.reclaim_own("someone-else", TTL, SERVED) == []


async def test_start_worker_registers_it_and_takes_back_its_runs_in_one_call(store: Store) -> None:
    await _new(store, "r1")
    await _new(store, "r2")
    [claimed] = await store.claim("w-fixed", TTL, 1, ["default"], SERVED)
    [again] = await store.start_worker(
        "w-fixed", "host", 7, serves=SERVED, queues=["default"], lease_ttl=TTL
    )
    assert again.record.run_id == claimed.record.run_id and again.reason == "reclaim"
    assert again.lease.epoch == claimed.lease.epoch + 1
    [worker] = [w for w in await store.live_workers() if w.worker_id == "w-fixed"]
    assert (worker.pid, worker.serves, worker.queues) == (7, frozenset(SERVED), ("default",))
    # Another worker id takes back nothing, and the queued run stays queued.
    assert await store.start_worker("w-other", "host", 8, serves=SERVED) == []
    assert (await store.get_run("r2")).status == RunStatus.QUEUED  # type: ignore[union-attr]


async def test_finish_happens_once_even_for_two_finishers_with_the_same_lease(db_url: str) -> None:
    # Two holders that both believe they own the run (what a bug in leasing would give)
    # race to finish it: the database lets exactly one through.
    stores = [make_store(db_url, Clock()) for _ in range(2)]
    for s in stores:
        await s.open()
    try:
        await _new(stores[0])
        [claimed] = await stores[0].claim("w1", TTL, 10, ["default"], SERVED)
        events = await stores[0].load_events("r1")
        attempts = [
            s.finish(
                claimed.lease,
                [_next(events, EventKind.RUN_SUCCEEDED, {"output": i})],
                RunStatus.SUCCEEDED,
                output=i,
            )
            for i, s in enumerate(stores)
        ]
        results = await asyncio.gather(*attempts, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1, results
        assert isinstance(errors[0], RunFinished | LeaseLost)
        journal = await stores[0].load_events("r1")
        assert [e.kind for e in journal].count("run_succeeded") == 1
        assert (await stores[0].get_run("r1")).status == RunStatus.SUCCEEDED  # type: ignore[union-attr]
    finally:
        for s in stores:
            await s.close()


async def test_park_sees_a_signal_that_arrived_first(store: Store) -> None:
    await _new(store)
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    await store.send_signal("r1", "go", {"ok": True})
    assert await store.park(claimed.lease, [], ["signal:go"], None) == ("ready", ["signal:go"])
    assert (await store.get_run("r1")).status == RunStatus.RUNNING  # type: ignore[union-attr]
    assert await store.park(claimed.lease, [], ["signal:other"], None) == ("parked", [])
    rec = await store.get_run("r1")
    assert rec is not None and rec.status == RunStatus.WAITING
    assert rec.waiting_for == "signal:other"
    await store.send_signal("r1", "other", None)
    assert (await store.get_run("r1")).status == RunStatus.QUEUED  # type: ignore[union-attr]


async def test_timer_makes_a_parked_run_claimable_when_due(store: Store) -> None:
    await _new(store)
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    now = await store.now()
    assert await store.park(claimed.lease, [], ["sleep:2:sleep"], now + 3600) == ("parked", [])
    assert await store.claim("w1", TTL, 10, ["default"], SERVED) == []
    store.clock.advance(3601)
    [woken] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    assert woken.lease.epoch == claimed.lease.epoch + 1


async def test_cancel_queued_run_at_once_and_running_run_by_flag(store: Store) -> None:
    await _new(store, "q")
    assert await store.cancel("q") == RunStatus.CANCELLED
    assert [e.kind for e in await store.load_events("q")] == ["run_queued", "run_cancelled"]
    assert await store.cancel("q") == RunStatus.CANCELLED  # idempotent

    await _new(store, "r")
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    assert await store.cancel("r") == RunStatus.RUNNING
    [held] = await store.renew("w1", TTL, ["r"])
    assert held.cancel_requested
    # A cancel pending when the run tries to park wins over the park.
    assert await store.park(claimed.lease, [], ["signal:x"], None) == ("cancel", [])


async def test_cancel_of_expired_holder_fences_it(store: Store) -> None:
    await _new(store)
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    store.clock.advance(TTL + 1)
    assert await store.cancel("r1") == RunStatus.CANCELLED
    store.clock.advance(-(TTL + 1))  # even if its lease looked live again, the epoch moved
    with pytest.raises(LeaseLost):
        await store.append(claimed.lease, [])


async def test_unknown_run_ids_are_named(store: Store) -> None:
    with pytest.raises(UnknownRun, match="'nope'"):
        await store.send_signal("nope", "x", None)
    with pytest.raises(UnknownRun, match="'nope'"):
        await store.cancel("nope")
    assert await store.get_run("nope") is None


async def test_signal_to_finished_run_is_refused(store: Store) -> None:
    await _new(store)
    await store.cancel("r1")
    with pytest.raises(RunFinished):
        await store.send_signal("r1", "x", None)


async def test_journal_is_a_gapless_hash_chain(store: Store) -> None:
    await _new(store)
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    events = await store.load_events("r1")
    for i in range(5):
        ev = _next(events, EventKind.STEP_STARTED, {"i": i}, step_id=f"{i + 1}:s")
        await store.append(claimed.lease, [ev])
        events.append(ev)
    stored = await store.load_events("r1")
    assert [e.seq for e in stored] == list(range(1, 7))
    for prev, ev in itertools.pairwise(stored):
        assert ev.prev_hash == prev.hash
        assert ev.verify()
        assert (
            Event.chain(
                ev.run_id, ev.seq, ev.kind, ev.step_id, ev.attempt, ev.payload, ev.at, ev.prev_hash
            ).hash
            == ev.hash
        )
    assert fold("r1", stored).last_seq == 6


async def test_migrations_apply_once_and_reopen_cleanly(db_url: str) -> None:
    for _ in range(2):
        s = make_store(db_url)
        await s.open()
        applied = await s._run(
            lambda tx: tx._cur.execute(
                "SELECT version FROM schema_migrations ORDER BY version"
            ).fetchall()
        )
        assert [r[0] for r in applied] == [
            v for v, _, _ in load_migrations(s.dialect if s.dialect == "sqlite" else "postgres")
        ]
        await s.close()


async def test_a_postgres_store_with_every_migration_applied_opens_without_the_migrators_lock(
    pg_url: str,
) -> None:
    # A start against a migrated database reads which migrations it has and goes on: it
    # neither waits for another process's migrator nor writes DDL. One that lacks some
    # (a fresh schema, as every other test opens) migrates under the lock as before.
    first = make_store(pg_url)
    await first.open()
    await first.close()
    from urllib.parse import quote

    import psycopg

    from ratchet.store.postgres import PostgresStore

    with psycopg.connect(pg_url) as holder:  # a migrator elsewhere, mid-transaction
        holder.execute(PostgresStore(pg_url).queries["migrations_lock"])
        # Waiting for that lock would end in an error after 5 s (the URL's options are last).
        again = make_store(pg_url + "%20" + quote("-cstatement_timeout=5000"))
        await again.open()
        await _new(again)
        assert [e.kind for e in await again.load_events("r1")] == [EventKind.RUN_QUEUED]
        await again.close()
        holder.rollback()


async def test_a_postgres_store_opens_its_appends_connection_as_it_opens(pg_url: str) -> None:
    # A restarted worker's first step boundary finds the appends' connection open.
    from ratchet.store.postgres import PostgresStore

    store = make_store(pg_url)
    assert isinstance(store, PostgresStore)
    await store.open()
    try:
        await asyncio.wrap_future(store._append_executor.submit(lambda: None))
        conn = store._append_conn
        assert conn is not None and not conn.closed
        await _new(store)
        [claimed] = await store.claim("w1", TTL, 1, ["default"], SERVED)
        events = await store.load_events("r1")
        await store.append(claimed.lease, [_next(events, EventKind.RUN_STARTED)])
        assert store._append_conn is conn  # the one the appends use
    finally:
        await store.close()
    assert conn.closed


@pytest.mark.parametrize(
    "url",
    [
        "",
        "mysql://x",
        "sqlite://relative.db",
        "sqlite:///",
        "postgresql://",
        "nonsense",
        "postgresql://host:notaport/db",
    ],
)
def test_malformed_database_url_is_refused_before_anything_opens(url: str) -> None:
    with pytest.raises(ConfigError, match="database URL|RATCHET_DATABASE_URL"):
        make_store(url)


async def test_terminal_status_is_guarded_by_the_database_not_the_lease(store: Store) -> None:
    await _new(store)
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    events = await store.load_events("r1")
    done = _next(events, EventKind.RUN_SUCCEEDED, {"output": 1})
    await store.finish(claimed.lease, [done], RunStatus.SUCCEEDED, output=1)
    # Hand the same lease back, as a broken lease mechanism would: the guarded update
    # still refuses a second terminal transition, and its event rolls back with it.
    far = "to_timestamp(1e10)" if store.dialect == "postgresql" else "1e10"
    await store._run(
        lambda tx: tx._cur.execute(
            "INSERT INTO run_locks (run_id, worker_id, epoch, expires_at) "
            f"VALUES ('r1', 'w1', {claimed.lease.epoch}, {far})"
        )
    )
    with pytest.raises(RunFinished):
        await store.finish(
            claimed.lease,
            [_next([*events, done], EventKind.RUN_FAILED)],
            RunStatus.FAILED,
            error="late",
        )
    journal = await store.load_events("r1")
    assert [e.kind for e in journal] == ["run_queued", "run_succeeded"]
    assert (await store.get_run("r1")).status == RunStatus.SUCCEEDED  # type: ignore[union-attr]


async def test_a_cancelled_caller_learns_its_write_landed_or_why_not(store: Store) -> None:
    # Cancelling the task that awaits a write must not discard the answer: the write
    # completes, then the caller is cancelled (so CancelledError means it landed), or the
    # write's own failure is raised instead.
    await _new(store)
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    events = await store.load_events("r1")
    ev = _next(events, EventKind.RUN_STARTED)
    task = asyncio.ensure_future(store.append(claimed.lease, [ev]))
    await asyncio.sleep(0)  # the write is under way
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [e.seq for e in await store.load_events("r1")] == [1, 2]

    stale = Lease("r1", "w1", claimed.lease.epoch + 1)
    task = asyncio.ensure_future(store.append(stale, [_next([*events, ev], EventKind.RUN_RESUMED)]))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(LeaseLost):
        await task
    assert [e.seq for e in await store.load_events("r1")] == [1, 2]


async def test_a_journal_reads_back_every_payload_as_written_in_canonical_key_order(
    store: Store,
) -> None:
    # load_events decodes a journal's payloads together: each must still come back as the
    # value it was written as (nested objects, unicode, numbers, keys in sorted order on
    # both backends), in its own event, and verify against its hash.
    await _new(store)
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    payloads: list[dict[str, Any]] = [
        {},
        {"output": None},
        {"output": {"zeta": 1, "a": [1, 2.5, {"yy": 'é\n"', "b": None}], "mm": True}},
        {"output": 'x-0.0 [1,2] {"a":1},'},
        {"output": [[], {}, -3, 1e300]},
        {"idempotency_key": "ab" * 32, "kind": "llm", "llm": {"usage": {"input_tokens": 3}}},
    ]
    events = await store.load_events("r1")
    written: list[Event] = []
    for i, payload in enumerate(payloads):
        ev = _next([*events, *written], EventKind.STEP_COMPLETED, payload, f"{i + 1}:s")
        written.append(ev)
    await store.append(claimed.lease, written)
    read = (await store.load_events("r1"))[len(events) :]
    assert [e.payload for e in read] == payloads
    for e in read:
        assert e.verify()
        for value in (e.payload, e.payload.get("output")):
            if isinstance(value, dict):
                assert list(value) == sorted(value)
    assert [e.seq for e in await store.load_events("r1", after=3, limit=2)] == [4, 5]
