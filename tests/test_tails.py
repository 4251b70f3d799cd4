"""A run's tail in the server process, on both backends: every event encoded once for all
its subscribers, and all that is new handed to a subscriber as one chunk, so a thousand
subscribers cost one encoding per event and one write per wake-up each (tests/test_server.py
follows the streams end to end over HTTP)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from waiting import wait_for_async

from ratchet.api.tails import Tail, Tails
from ratchet.model import Event, EventKind, NewRun, RunStatus
from ratchet.store import Store

TTL = 10.0


def _chain(last: Event, kinds: list[str]) -> list[Event]:
    events = []
    for kind in kinds:
        last = Event.chain(last.run_id, last.seq + 1, kind, None, None, {}, time.time(), last.hash)
        events.append(last)
    return events


async def _next(stream: AsyncIterator[bytes | None]) -> bytes | None:
    return await asyncio.wait_for(anext(stream), 15)


async def test_each_event_is_encoded_once_and_a_subscriber_gets_all_that_is_new_in_one_chunk(
    store: Store,
) -> None:
    await store.create_run(NewRun("r1", "wf", "1", {}))
    [claimed] = await store.claim("w1", TTL, 10, ["default"], [("wf", "1")])
    lease = claimed.lease
    encoded: list[int] = []

    def encode(ev: Event) -> bytes:
        encoded.append(ev.seq)
        return f"{ev.seq}:{ev.kind};".encode()

    tails = Tails(store, encode)
    try:
        with tails.subscribe("r1") as tail, tails.subscribe("r1") as same:
            assert same is tail  # one reader per run, whatever the number of subscribers
            ahead, behind = tail.follow(0, 30), tail.follow(0, 30)
            # What committed before the tail started is replayed from the journal.
            assert await _next(ahead) == await _next(behind) == b"1:run_queued;"
            [queued] = await store.load_events("r1")
            encoded.clear()

            started = _chain(queued, [EventKind.RUN_STARTED, EventKind.STEP_STARTED])
            await store.append(lease, started)
            assert await _next(ahead) == b"2:run_started;3:step_started;"
            # Two commits more while one subscriber is not reading: it is handed all three
            # commits' events in one chunk when it reads again.
            done = _chain(started[-1], [EventKind.STEP_COMPLETED])
            await store.append(lease, done)
            nxt = _chain(done[-1], [EventKind.STEP_STARTED, EventKind.STEP_COMPLETED])
            await store.append(lease, nxt)
            await wait_for_async(lambda: tail.head == 6, what="the tail to read seq 6")
            assert await _next(behind) == (
                b"2:run_started;3:step_started;4:step_completed;5:step_started;6:step_completed;"
            )
            assert await _next(ahead) in (
                b"4:step_completed;5:step_started;6:step_completed;",
                b"4:step_completed;",
            )
            assert encoded == [2, 3, 4, 5, 6]  # once each, for both subscribers

            end = _chain(nxt[-1], [EventKind.RUN_SUCCEEDED])
            await store.finish(lease, end, RunStatus.SUCCEEDED, output=1)
            assert await _next(behind) == b"7:run_succeeded;"
            assert [chunk async for chunk in behind] == []  # ended after the terminal event
    finally:
        await tails.close()


async def test_a_subscriber_behind_the_window_replays_from_the_journal(store: Store) -> None:
    await store.create_run(NewRun("r1", "wf", "1", {}))
    [claimed] = await store.claim("w1", TTL, 10, ["default"], [("wf", "1")])
    [queued] = await store.load_events("r1")
    tails = Tails(store, lambda ev: f"{ev.seq};".encode())
    try:
        with tails.subscribe("r1") as tail:
            await wait_for_async(lambda: tail.head == 1, what="the tail to start")
            events = _chain(queued, [EventKind.RUN_STARTED, EventKind.STEP_STARTED])
            await store.append(claimed.lease, events)
            await wait_for_async(lambda: tail.head == 3, what="the tail to read seq 3")
            assert [e.seq for e in tail.window] == [2, 3]
            # seq 1 is not in the window: what follows it is read from the journal.
            assert await _next(tail.follow(0, 30)) == b"1;2;3;"
            assert await _next(tail.follow(1, 30)) == b"2;3;"  # from the window
            # A subscriber already past the head waits, and hears a heartbeat meanwhile.
            assert await _next(tail.follow(3, 0.05)) is None
    finally:
        await tails.close()


def test_the_window_and_its_encodings_stay_aligned_and_bounded() -> None:
    tail = Tail(None, "r1", lambda ev: str(ev.seq).encode())  # type: ignore[arg-type]
    first = Event.chain("r1", 1, EventKind.RUN_QUEUED, None, None, {}, 0.0, "0" * 64)
    events = [first, *_chain(first, [EventKind.STEP_STARTED] * 2099)]
    for i in range(0, 2100, 700):
        tail._publish(events[i : i + 700])
    assert len(tail.window) == len(tail.encoded) == 2000
    assert (tail.window[0].seq, tail.encoded[0]) == (101, b"101")
    assert (tail.window[-1].seq, tail.encoded[-1], tail.head) == (2100, b"2100", 2100)
