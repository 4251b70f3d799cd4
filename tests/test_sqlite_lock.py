"""SQLite: another process holding the write lock does not freeze a worker's event loop.
Its writes wait for the lock off the loop, so everything else (lease renewals, steps,
reads) goes on, and once the lock is free every write lands."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

from waiting import wait_for_async

import ratchet
from ratchet.engine.worker import Worker
from ratchet.model import NewRun, RunStatus
from ratchet.store import make_store

TICKS = 50  # the other connection keeps the write lock until the loop has ticked this often
HUNG_S = 20.0  # only stops a test whose loop froze: the lock is then let go regardless


async def test_the_loop_keeps_running_while_another_process_holds_the_write_lock(
    sqlite_url: str,
) -> None:
    app = ratchet.Ratchet(sqlite_url)
    release = asyncio.Event()

    @app.step()
    async def blocked() -> int:
        await release.wait()
        return 1

    @app.step()
    async def after() -> int:
        return 2

    @app.workflow()
    async def wf() -> int:
        return await blocked() + await after()

    store = make_store(sqlite_url)
    await store.open()
    worker = Worker(store, app.workflows, lease_ttl=3.0, recovery_interval=60.0)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    ticks = 0  # turns of the loop, counted by a task of its own

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.02)

    tick_task = asyncio.create_task(ticker())
    try:
        await worker.started.wait()
        await store.create_run(NewRun("r1", "wf", "1", {"args": [], "kwargs": {}}))

        async def blocked_started() -> bool:
            return any(e.step_id == "1:blocked" for e in await store.load_events("r1"))

        await wait_for_async(blocked_started, what="the step started")
        held, done = threading.Event(), threading.Event()
        release_at: list[int] = []  # the tick count when the step ended
        ticked_while_held: list[int] = []  # ticks counted between that and letting go

        def hold_the_lock() -> None:  # another writer: its own connection, as a process has
            conn = sqlite3.connect(sqlite_url[len("sqlite:///") :], isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            held.set()
            # The fault itself: the lock held until the loop has turned TICKS times after
            # the step ended (its completion waiting for this lock all along). A loop
            # frozen by that wait never gets there.
            hung_at = time.monotonic() + HUNG_S
            while not release_at or ticks - release_at[0] < TICKS:
                if time.monotonic() > hung_at:
                    break
                time.sleep(0.01)
            ticked_while_held.append(ticks - release_at[0] if release_at else 0)
            conn.execute("COMMIT")
            conn.close()
            done.set()

        holder = threading.Thread(target=hold_the_lock)
        holder.start()
        await asyncio.to_thread(held.wait)
        release_at.append(ticks)
        release.set()  # the step ends: its completion must wait for the lock
        await asyncio.to_thread(done.wait)
        assert ticked_while_held[0] >= TICKS, f"the loop ticked {ticked_while_held[0]} times"
        holder.join()

        async def finished() -> bool:
            rec = await store.get_run("r1")
            return rec is not None and rec.status.terminal

        await wait_for_async(finished, what="the run ended")
        rec = await store.get_run("r1")
        assert rec is not None and rec.status == RunStatus.SUCCEEDED and rec.output == 3
        kinds = [(e.kind, e.step_id) for e in await store.load_events("r1")]
        assert kinds == [
            ("run_queued", None),
            ("run_started", None),
            ("step_started", "1:blocked"),
            ("step_completed", "1:blocked"),
            ("step_started", "2:after"),
            ("step_completed", "2:after"),
            ("run_succeeded", None),
        ]
        assert worker.outcomes == {"succeeded": 1}  # the lease was never lost
    finally:
        tick_task.cancel()
        stop.set()
        await running
        await store.close()
        app.shutdown()
