"""PostgreSQL's wake-ups between processes: a store hears journal appends (``EVENTS``) only
from the first time its process tails a journal, so a worker is not woken once more by its
own commit at every step boundary; a tail started later still hears every append."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ratchet.model import Event, EventKind, Lease, NewRun, RunStatus
from ratchet.store import Clock, Store, make_store
from ratchet.store.base import DONE, EVENTS

TTL = 10.0
WAIT_S = 15.0


@pytest.fixture
async def stores(pg_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores on one database, as two processes would hold them: ``heard`` listens,
    ``writer`` appends."""
    heard, writer = make_store(pg_url, Clock()), make_store(pg_url, Clock())
    await heard.open()
    await writer.open()
    yield heard, writer
    await writer.close()
    await heard.close()


async def _leased(store: Store, run_id: str) -> tuple[Lease, Event]:
    await store.create_run(NewRun(run_id, "wf", "1", {"args": [], "kwargs": {}}))
    [claimed] = await store.claim("w1", TTL, 1, ["default"], [("wf", "1")])
    [queued] = await store.load_events(run_id)
    return claimed.lease, queued


def _next(last: Event, kind: str) -> Event:
    return Event.chain(last.run_id, last.seq + 1, kind, None, None, {}, 0.0, last.hash)


async def test_appends_wake_nobody_until_a_journal_is_tailed_then_every_tail_hears_them(
    stores: tuple[Store, Store],
) -> None:
    heard, writer = stores
    woken: list[tuple[str, str]] = []
    wake = heard._wake

    def recording(channel: str, key: str = "") -> None:
        woken.append((channel, key))
        wake(channel, key)

    heard._wake = recording  # type: ignore[method-assign]

    # Nobody tails a journal: appends, then the run's end, reach the listening store only
    # as the end. Notifications come in commit order, so had the append's been heard, it
    # would be there before the end's.
    lease, last = await _leased(writer, "quiet")
    with heard.watching(DONE, "quiet") as done:
        started = _next(last, EventKind.RUN_STARTED)
        await writer.append(lease, [started])
        await writer.finish(
            lease, [_next(started, EventKind.RUN_SUCCEEDED)], RunStatus.SUCCEEDED, output=None
        )
        await asyncio.wait_for(done.wait(), WAIT_S)
    assert ("ratchet_done", "quiet") in woken
    assert not [w for w in woken if w[0] == EVENTS and w[1] == "quiet"]

    # The first tail: the store listens for appends too from now on, and wakes the tail
    # once it does (an append between the tail's read and then is read again).
    lease, last = await _leased(writer, "tailed")
    with heard.watching(EVENTS, "tailed") as appended:
        await asyncio.wait_for(appended.wait(), WAIT_S)
        appended.clear()
        await writer.append(lease, [_next(last, EventKind.RUN_STARTED)])
        await asyncio.wait_for(appended.wait(), WAIT_S)
    assert (EVENTS, "tailed") in woken
