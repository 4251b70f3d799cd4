"""A dead worker's runs are taken over at once; a slow one keeps its leases; one worker id,
one live worker. On SQLite and PostgreSQL.

A worker holds its worker id's liveness lock while its process lives (a session-level
advisory lock on PostgreSQL, a record lock on a file beside the SQLite database), and live
workers look every half second for workers whose lock is gone. The store-level tests take
a lock away as a death does; the process tests SIGKILL and SIGSTOP real workers
(tests/support/crash_app.py) running with the default lease TTL and recovery interval.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from proc import Harness, WorkerProc
from waiting import wait_for

import ratchet
from ratchet.config import DEFAULT_LEASE_TTL, DEFAULT_RECOVERY_INTERVAL
from ratchet.errors import LeaseLost, WorkerIdInUse
from ratchet.model import Event, EventKind, NewRun
from ratchet.store import Clock, Store, make_store, workers

TTL = 10.0
SERVED = [("wf", "1")]


@pytest.fixture(autouse=True)
def quick_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    # A start tries a while before it is refused (another worker's look may hold the lock
    # for a moment): a tenth of a second is enough here, where nobody looks.
    monkeypatch.setattr(workers, "HOLD_TRIES_S", 0.1)


async def _register(store: Store, worker_id: str) -> None:
    await store.hold_worker_id(worker_id)
    await store.start_worker(worker_id, "host", 1, serves=SERVED, queues=["default"])


async def test_one_worker_id_is_held_by_one_live_worker_at_a_time(
    store: Store, db_url: str
) -> None:
    await _register(store, "w1")
    other = make_store(db_url, Clock())
    await other.open()
    try:
        with pytest.raises(WorkerIdInUse) as refused:
            await other.hold_worker_id("w1")
        assert str(refused.value) == (
            "worker id 'w1' is in use by a live worker (host host, pid 1): give each "
            "worker its own RATCHET_WORKER_ID (or --worker-id)"
        )
        with pytest.raises(WorkerIdInUse):  # nor twice by one store
            await store.hold_worker_id("w1")
        await other.hold_worker_id("w2")  # another id is free
        await store.drop_worker_id("w1")
        await other.hold_worker_id("w1")  # let go of: free again
    finally:
        await other.close()


async def test_a_dead_workers_runs_are_taken_over_under_a_new_epoch_while_its_lease_lives(
    store: Store,
) -> None:
    for run_id in ("r1", "r2", "r3"):
        await store.create_run(NewRun(run_id, "wf", "1", {"args": [], "kwargs": {}}))
    await _register(store, "a")
    await _register(store, "b")
    held = await store.claim("a", TTL, 3, ["default"], SERVED)
    assert len(held) == 3
    # a is alive: nothing to take.
    assert await store.take_over("b", TTL, 5, ["default"], SERVED) == ([], False)

    await store.drop_worker_id("a")  # a's lock is gone, as when its process dies
    taken, left = await store.take_over("b", TTL, 2, ["default"], SERVED)
    assert (len(taken), left) == (2, True)  # two free slots, one more waiting
    epochs = {c.lease.run_id: c.lease.epoch for c in held}
    for claimed in taken:
        assert claimed.reason == "takeover"
        assert claimed.lease.worker_id == "b"
        assert claimed.lease.epoch == epochs[claimed.record.run_id] + 1
        # The dead holder is fenced off, its lease still live by the clock.
        first = (await store.load_events(claimed.record.run_id))[-1]
        ev = Event.chain(first.run_id, 2, EventKind.RUN_STARTED, None, None, {}, 0.0, first.hash)
        old = next(c.lease for c in held if c.lease.run_id == claimed.record.run_id)
        with pytest.raises(LeaseLost):
            await store.append(old, [ev])
    assert "a" in {w.worker_id for w in await store.live_workers()}  # still holds a run

    [last], left = await store.take_over("b", TTL, 5, ["default"], SERVED)
    assert not left and last.reason == "takeover"
    # a is left with nothing: its row goes.
    assert {w.worker_id for w in await store.live_workers()} == {"b"}
    assert await store.take_over("b", TTL, 5, ["default"], SERVED) == ([], False)


async def test_a_worker_without_a_liveness_lock_is_left_to_its_lease(store: Store) -> None:
    # An earlier version's worker never takes the lock: only its lease says it is gone.
    await store.create_run(NewRun("r1", "wf", "1", {"args": [], "kwargs": {}}))
    await store.start_worker("old", "host", 1, serves=SERVED, queues=["default"])
    await _register(store, "b")
    assert len(await store.claim("old", TTL, 1, ["default"], SERVED)) == 1
    assert await store.take_over("b", TTL, 5, ["default"], SERVED) == ([], False)


# -- real worker processes ---------------------------------------------------------------


def _defaults(h: Harness, name: str, **kw: Any) -> WorkerProc:
    """A worker with the default lease TTL and recovery interval."""
    return h.spawn(
        name, lease_ttl=DEFAULT_LEASE_TTL, recovery_interval=DEFAULT_RECOVERY_INTERVAL, **kw
    )


def _resumed(h: Harness, run_id: str) -> Event:
    [resumed] = [e for e in h.app.events(run_id) if e.kind == EventKind.RUN_RESUMED]
    return resumed


@pytest.mark.crash
def test_a_killed_workers_run_is_taken_over_by_a_live_worker_before_its_lease_expires(
    h: Harness,
) -> None:
    run_id = h.app.start("chain", n=5, block_at=[3])
    a = _defaults(h, "a")
    h.wait_invoked("3:work")
    b = _defaults(h, "b")
    b.wait_started()
    holder, epoch, expires_at = h.lease(run_id)
    assert holder == "a"
    h.open_gate("step-3")
    killed_at = time.time()
    a.kill()

    h.wait_status(run_id, "succeeded", timeout=DEFAULT_LEASE_TTL)
    resumed = _resumed(h, run_id)
    # Taken because a died, with its lease still live and no sweep due for 30 s.
    assert resumed.payload["reason"] == "takeover"
    assert resumed.payload["worker_id"] == "b"
    assert resumed.payload["epoch"] == epoch + 1
    assert resumed.at < expires_at
    print(f"killed -> resumed: {resumed.at - killed_at:.3f} s")
    assert h.calls() == {"1:work": 1, "2:work": 1, "3:work": 2, "4:work": 1, "5:work": 1}
    b.wait_log(f"action=run_taken_over run_id={run_id} epoch={epoch + 1}")


@pytest.mark.crash
def test_a_stopped_workers_run_is_left_to_it_until_its_lease_expires(h: Harness) -> None:
    run_id = h.app.start("chain", n=5, block_at=[3])
    a = h.spawn("a", lease_ttl=4.0, recovery_interval=60.0)
    h.wait_invoked("3:work")
    os.kill(a.pid, signal.SIGSTOP)
    a.wait_stopped()
    holder, epoch, expires_at = h.lease(run_id)
    assert holder == "a"
    h.open_gate("step-3")
    b = h.spawn("b", lease_ttl=4.0, recovery_interval=0.3)
    b.wait_started()
    # b looks for dead workers every half second while a's lease lives: a is stopped, not
    # dead, so only the sweep takes its run, once the lease has run out.
    assert time.time() < expires_at - 1.0, "b started too late to look while the lease lived"

    h.wait_status(run_id, "succeeded")
    resumed = _resumed(h, run_id)
    assert (resumed.payload["reason"], resumed.payload["worker_id"]) == ("sweep", "b")
    assert resumed.payload["epoch"] == epoch + 1
    assert resumed.at >= expires_at - 0.05
    assert a.state() == "T"


@pytest.mark.crash
def test_a_second_live_worker_under_the_same_id_is_refused_at_start(
    h: Harness, tmp_path: Path
) -> None:
    run_id = h.app.start("chain", n=3, block_at=[2])
    a = _defaults(h, "a", worker_id="w-same")
    h.wait_invoked("2:work")
    # `ratchet worker` under the same id, from the environment.
    (tmp_path / "twin_app.py").write_text("import ratchet\napp = ratchet.Ratchet()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    twin = subprocess.run(
        [sys.executable, "-m", "ratchet.cli", "worker", "twin_app:app", "--db", h.db_url],
        cwd=tmp_path,
        env={**env, "RATCHET_WORKER_ID": "w-same"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert twin.returncode == 2
    errors = [line for line in twin.stderr.splitlines() if " level=" not in line]
    assert errors == [
        f"error: worker id 'w-same' is in use by a live worker (host {socket.gethostname()}, "
        f"pid {a.pid}): give each worker its own RATCHET_WORKER_ID (or --worker-id)"
    ], twin.stderr
    # The twin took nothing: a finishes its run, each step once.
    h.open_gate("step-2")
    h.wait_status(run_id, "succeeded")
    assert [e for e in h.app.events(run_id) if e.kind == EventKind.RUN_RESUMED] == []
    assert h.calls() == {"1:work": 1, "2:work": 1, "3:work": 1}
    assert a.alive()


@pytest.mark.crash
def test_a_worker_restarted_under_the_id_of_a_dead_one_starts_and_reclaims(h: Harness) -> None:
    run_id = h.app.start("chain", n=3, block_at=[2])
    a = _defaults(h, "a", worker_id="w-fixed")
    h.wait_invoked("2:work")
    a.kill()
    h.open_gate("step-2")
    again = _defaults(h, "a-again", worker_id="w-fixed")
    again.wait_started()
    h.wait_status(run_id, "succeeded")
    assert _resumed(h, run_id).payload["reason"] == "reclaim"


def test_a_servers_embedded_workers_get_an_id_each_from_the_one_given(
    make_app: Callable[..., ratchet.Ratchet], monkeypatch: pytest.MonkeyPatch
) -> None:
    from serving import serving

    monkeypatch.setenv("RATCHET_WORKER_ID", "web")
    app = make_app()

    def ids() -> set[str]:
        return {w.worker_id for w in app.live_workers()}

    with serving(app, workers=2):
        wait_for(
            lambda: ids() == {"web-0", "web-1"},
            what="both embedded workers",
            detail=lambda: str(ids()),
        )


async def test_a_live_worker_whose_session_ends_takes_its_lock_again_at_its_next_look(
    db_url: str,
) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL session; SQLite's locks are the process's own")
    a, b = make_store(db_url, Clock()), make_store(db_url, Clock())
    await a.open()
    await b.open()
    try:
        await a.create_run(NewRun("r1", "wf", "1", {"args": [], "kwargs": {}}))
        await _register(a, "a")
        await _register(b, "b")
        assert len(await a.claim("a", TTL, 1, ["default"], SERVED)) == 1
        key = "hashtextextended('workers'::regclass::oid::text || ':a', 0)"
        with psycopg.connect(db_url, autocommit=True) as admin:
            [(pid,)] = admin.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
                f"classid::bigint = ({key} >> 32) & 4294967295 AND "
                f"objid::bigint = {key} & 4294967295"
            ).fetchall()
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            wait_for(
                lambda: (
                    not admin.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)
                    ).fetchall()
                ),
                what="a's session to end",
            )
        # a's next look finds its session gone and takes its lock again: b sees it alive.
        assert await a.take_over("a", TTL, 5, ["default"], SERVED) == ([], False)
        assert await b.take_over("b", TTL, 5, ["default"], SERVED) == ([], False)
    finally:
        await a.close()
        await b.close()
