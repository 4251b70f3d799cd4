"""The workflows the queue tests drive, in queues with limits, and the worker process that
drives them (``python tests/support/queues_app.py``, configured as crash_app's workers are).

Each step appends ``start`` and ``end`` lines to the invocation log (crash_app.record), so
a test can tell how many runs of a queue were inside their step at any moment, whichever
process drove them.
"""

from __future__ import annotations

import asyncio

import crash_app
from crash_app import gate, record

import ratchet

# A short window, so a rate test waits a second or two.
RATE = ratchet.Rate(2, per_s=1.0)


def build(
    url: str, *, lease_ttl: float | None = None, recovery_interval: float | None = None
) -> ratchet.Ratchet:
    """The queue tests' application on database ``url``."""
    app = ratchet.Ratchet(url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)
    app.queue("limited", concurrency=2)
    app.queue("keyed", per_key_concurrency=1)
    app.queue("rated", rate=RATE)
    app.queue("single", concurrency=1)
    app.queue("open")  # declared, no limits
    app.queue("parked", concurrency=1, hold_while_parked=True)

    @app.step
    async def hold(dwell: float = 0.0, block: str | None = None) -> str:
        info = record("start")
        if block is not None:
            await gate(block)
        elif dwell:
            await asyncio.sleep(dwell)
        record("end")
        return info.run_id

    @app.workflow(queue="limited")
    async def limited(dwell: float = 0.0, block: str | None = None) -> str:
        return await hold(dwell, block)

    @app.workflow(queue="keyed")
    async def keyed(dwell: float = 0.0) -> str:
        return await hold(dwell)

    @app.workflow(queue="rated")
    async def rated() -> str:
        return await hold()

    @app.workflow(queue="single")
    async def single(block: str | None = None) -> str:
        return await hold(0.0, block)

    @app.workflow(queue="open")
    async def unlimited(dwell: float = 0.0) -> str:
        return await hold(dwell)

    @app.workflow(queue="parked")
    async def listener() -> str:
        await hold()
        return str(await ratchet.wait_for_signal("go"))

    return app


if __name__ == "__main__":
    crash_app.main(build)
