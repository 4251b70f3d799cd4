"""The awaitable client, on SQLite and PostgreSQL: an async application launches a worker
on its own event loop and uses every ``*_async`` call without blocking it."""

from __future__ import annotations

import asyncio

import pytest

import ratchet


async def test_an_async_application_uses_the_async_twins(db_url: str) -> None:
    app = ratchet.Ratchet(db_url, lease_ttl=3.0, recovery_interval=0.5)

    @app.step
    async def double(x: int) -> int:
        return x * 2

    @app.workflow
    async def calc(x: int) -> int:
        return await double(x)

    @app.workflow
    async def doomed() -> None:
        raise RuntimeError("no")

    worker = await app.launch_async()
    try:
        assert worker.started.is_set()
        # The worker runs on this loop: awaiting here lets it work.
        run_id = await app.start_async(calc, 21)
        assert await app.result_async(run_id, timeout_s=30) == 42
        failed = await app.start_async(doomed)
        with pytest.raises(ratchet.RunFailed):
            await app.result_async(failed, timeout_s=30)
        assert {r.run_id for r in await app.runs_async()} == {run_id, failed}
        assert await app.count_runs_async() == 2
        assert await app.count_runs_async("succeeded") == 1
        assert [d.run_id for d in await app.dead_letters_async()] == [failed]
        assert await app.count_dead_letters_async() == 1
        assert await app.receipts_async(run_id) == []
        assert (await app.get_async(run_id)).status == ratchet.RunStatus.SUCCEEDED
        with pytest.raises(ratchet.RatchetError, match="await shutdown_async"):
            app.shutdown()
    finally:
        await app.shutdown_async()
    # Stopped: nothing of the worker or the store is left running on this loop.
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
