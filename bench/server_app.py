"""The app ``ratchet server`` serves in the server bench, and the writer that drives its run.

``python -m bench.server_app writer --db URL --out FILE`` is a real Ratchet worker in a
process of its own: it claims the queued ``paced`` run and drives it (one commit a step,
carrying that step's ``step_completed`` and the next one's ``step_started``), and stamps
each event with ``time.time()`` (the clock the subscribers read too) as its commit
completes: on PostgreSQL in the thread that runs the append statement, as soon as the
statement (its own commit) returns; on SQLite, whose commits run on the worker's event loop,
as ``append`` returns to the drive. The terminal event is stamped as ``finish`` returns.
A stamp can only be late (the thread or the loop waited for a CPU after the commit), so
each event's creation time (``at``, taken before its commit) goes beside it as a bound on
the other side. It writes ``{"commits": {seq: [committed, created]}, ...}`` to FILE when the
run has ended.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import ratchet
from ratchet.model import Event
from ratchet.store import Store
from ratchet.store.postgres import PostgresStore

# The database: ``ratchet server --db`` for the server; the writer sets it before the store
# opens.
app = ratchet.Ratchet()


@app.step()
async def tick(i: int, at: float) -> int:
    await asyncio.sleep(max(0.0, at - time.time()))
    return i


@app.workflow(name="paced")
async def paced(steps: int, every_s: float) -> int:
    """``steps`` steps on a fixed schedule, one every ``every_s`` seconds (two events each),
    so the journal grows at a steady rate whatever a commit costs."""
    begin = time.time()
    for i in range(steps):
        await tick(i, begin + (i + 1) * every_s)
    return steps


@app.workflow(name="noop")
async def noop(n: int = 0) -> int:
    """What ``POST /v1/runs`` starts in the accept measure (no worker drives it)."""
    return n


def _stamp(store: Store, commits: dict[int, tuple[float, float]]) -> None:
    """Record in ``commits`` when each event's commit completed, and when the event was
    made (this process's store only: instance attributes, wrapping the calls every drive's
    writes go through)."""

    def after(write: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(lease: Any, events: Sequence[Event], *args: Any, **kw: Any) -> Any:
            answer = await write(lease, events, *args, **kw)
            now = time.time()
            commits.update((ev.seq, (now, ev.at)) for ev in events)
            return answer

        return timed

    if isinstance(store, PostgresStore):
        # Appends go out as one autocommit statement on a thread of their own: stamp there,
        # not after the hand-back to the loop, which a busy machine can delay.
        statement = store._append_now

        def committed(events: str) -> list[Any]:
            # The batch as the store sends it: a JSON array of rows [run_id, worker_id,
            # epoch, seq, kind, step_id, attempt, payload, at, prev_hash, hash].
            rows = statement(events)
            now = time.time()
            commits.update((row[3], (now, row[8])) for row in json.loads(events))
            return rows

        store._append_now = committed  # type: ignore[method-assign]
    else:
        store.append = after(store.append)  # type: ignore[method-assign,assignment]
    store.finish = after(store.finish)  # type: ignore[method-assign,assignment]


async def drive(url: str, run_id: str, timeout: float) -> dict[str, Any]:
    app.database_url = url
    store = await asyncio.to_thread(lambda: app.store)
    commits: dict[int, tuple[float, float]] = {}
    _stamp(store, commits)
    used = resource.getrusage(resource.RUSAGE_SELF)
    began = time.time()
    worker = app.worker(concurrency=4)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        output = await asyncio.wait_for(app.result_async(run_id, timeout), timeout + 5)
    finally:
        stop.set()
        await task
        await app.shutdown_async()
    now = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)
    return {
        "commits": commits,
        "result": output,
        "cpu_s": round(cpu, 3),
        "seconds": round(time.time() - began, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=("writer",))
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    answer = asyncio.run(drive(args.db, args.run_id, args.timeout))
    with open(args.out, "w") as f:
        json.dump(answer, f)


if __name__ == "__main__":
    main()
