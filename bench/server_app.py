"""The app ``ratchet server`` serves in the server bench, and the writer that drives its run.

``python -m bench.server_app writer --db URL --out FILE`` is a real Ratchet worker in a
process of its own: it claims the queued ``paced`` run and drives it (one commit a step,
carrying that step's ``step_completed`` and the next one's ``step_started``), and stamps
each event's commit: the store's ``append`` and ``finish`` return once their transaction
has committed, and the stamp (``time.time()``, the clock the subscribers read too) is
taken right then, for every seq in it. It writes ``{"commits": {seq: time}, ...}`` to
FILE when the run has ended.
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


def _stamped(commits: dict[int, float],
             write: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def timed(lease: Any, events: Sequence[Event], *args: Any, **kwargs: Any) -> Any:
        answer = await write(lease, events, *args, **kwargs)
        now = time.time()
        for ev in events:
            commits[ev.seq] = now
        return answer

    return timed


async def drive(url: str, run_id: str, timeout: float) -> dict[str, Any]:
    app.database_url = url
    store = await asyncio.to_thread(lambda: app.store)
    commits: dict[int, float] = {}
    # Instance attributes: only this process's store, and every drive's append goes here.
    store.append = _stamped(commits, store.append)  # type: ignore[method-assign]
    store.finish = _stamped(commits, store.finish)  # type: ignore[method-assign]
    used = resource.getrusage(resource.RUSAGE_SELF)
    began = time.time()
    worker = app.worker(concurrency=4)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        status = (await asyncio.wait_for(app.result_async(run_id, timeout), timeout + 5))
    finally:
        stop.set()
        await task
        await app.shutdown_async()
    now = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)
    return {"commits": commits, "result": status, "cpu_s": round(cpu, 3),
            "seconds": round(time.time() - began, 3)}


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
