"""The workflows the guard crash tests drive (tests/test_guards_crash.py), in worker
processes run as ``python tests/support/guards_app.py`` (the worker of
tests/support/crash_app.py)."""

from __future__ import annotations

import asyncio

import crash_app
from crash_app import gate, record

import ratchet


def build(
    url: str, *, lease_ttl: float | None = None, recovery_interval: float | None = None
) -> ratchet.Ratchet:
    """An app whose workflows poll the same job, with the same answer, n times, or run
    branches that each pause on a guard."""
    app = ratchet.Ratchet(url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)

    @app.step
    async def poll(job: str) -> str:
        record("invoke")
        return "pending"

    # record: the run goes on past its anomaly (the default action is fail).
    @app.workflow(guards=ratchet.Guards(runaway_repeats=3, actions={"runaway_loop": "record"}))
    async def watcher(n: int) -> int:
        for _ in range(n):
            await poll("job-1")
        return n

    @app.workflow(guards=ratchet.Guards(runaway_repeats=3, actions={"runaway_loop": "pause"}))
    async def careful(n: int) -> int:
        for _ in range(n):
            await poll("job-1")
        return n

    @app.workflow(guards=ratchet.Guards(max_steps=3, actions={"excessive_steps": "pause"}))
    async def long_run(n: int) -> int:
        for i in range(1, n + 1):
            await poll(f"job-{i}")
        return n

    @app.step
    async def left() -> str:
        record("invoke")
        await gate("left")
        return "left"

    @app.step
    async def right() -> str:
        record("invoke")
        await gate("right")
        return "right"

    # Every step with a new result trips (a streak of one): each branch pauses on its own.
    @app.workflow(guards=ratchet.Guards(runaway_repeats=1, actions={"runaway_loop": "pause"}))
    async def branches() -> list[str]:
        return list(await asyncio.gather(left(), right()))

    return app


if __name__ == "__main__":
    crash_app.main(build)
