"""PostgreSQL wake-ups: a process listens only on the channels someone in it watches; a
channel first watched later is heard from then on (cross-process, by LISTEN/NOTIFY), and
every watcher, of any run, is woken when the listening connection is replaced (what was
announced meanwhile may have been missed)."""

from __future__ import annotations

import asyncio

import pytest

from ratchet.model import NewRun
from ratchet.store import Clock, make_store
from ratchet.store.base import DONE, EVENTS, READY

pytestmark = pytest.mark.postgres


async def test_a_channel_first_watched_later_is_heard_and_others_are_not_listened_to(
    pg_url: str,
) -> None:
    watcher, writer = make_store(pg_url, Clock()), make_store(pg_url, Clock())
    await watcher.open()
    await writer.open()
    try:
        with watcher.watching(READY) as ready:
            assert watcher._channels == {READY}  # type: ignore[attr-defined]  # a worker's
            await asyncio.wait_for(ready.wait(), 10)  # woken once listening
            ready.clear()
            await writer.create_runs([NewRun("l-1", "wf", "1", {"args": [], "kwargs": {}})])
            await asyncio.wait_for(ready.wait(), 10)  # another process's start wakes it
            with watcher.watching(EVENTS, "l-2") as appended, watcher.watching(DONE, "l-2"):
                assert watcher._channels == {READY, EVENTS, DONE}  # type: ignore[attr-defined]
                await asyncio.wait_for(appended.wait(), 10)  # woken once listening again
                appended.clear()
                ready.clear()
                await writer.create_runs([NewRun("l-2", "wf", "1", {"args": [], "kwargs": {}})])
                await asyncio.wait_for(appended.wait(), 10)  # its run_queued event
                await asyncio.wait_for(ready.wait(), 10)  # READY still heard too
    finally:
        await watcher.close()
        await writer.close()
