"""One reader per followed run, whatever the number of its subscribers.

A thousand clients following one run must not turn each journal append into a thousand
queries. A :class:`Tail` is the process's one follower of a run: woken by the store (the
trigger's NOTIFY on PostgreSQL, the commit or the shared poll on SQLite), it reads the new
events once and hands them to every subscriber. It keeps a bounded window of the latest
events only so that subscribers at the head need not query; a subscriber further behind
(a reconnect after a long while) replays from the journal itself until it reaches the
window. Seq is gapless and read in order, so a subscriber that takes ``seq > last`` from the
journal and then from the window misses nothing and repeats nothing.

The fan-out is what costs at a thousand subscribers, so the tail encodes each event once,
for all of them, and hands a subscriber everything new since its last write as one chunk:
one write per wake-up rather than one per event, and a subscriber that fell behind (the
process was busy) catches up in fewer, larger writes instead of falling further behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator

from ratchet.model import Event
from ratchet.store import Store
from ratchet.store.base import EVENTS

log = logging.getLogger("ratchet.api")

TERMINAL = frozenset({"run_succeeded", "run_failed", "run_cancelled"})
PAGE = 500
WINDOW = 2000  # events kept for subscribers at the head
BACKSTOP_S = 15.0  # re-read even without a wake-up, in case one was lost


class Tail:
    """A run's journal as this process follows it."""

    def __init__(self, store: Store, run_id: str, encode: Callable[[Event], bytes]) -> None:
        self.store = store
        self.run_id = run_id
        self.encode = encode
        self.window: list[Event] = []  # contiguous seqs, the latest read
        self.encoded: list[bytes] = []  # the window's events, encoded
        self.head = 0  # the last seq read
        self.ended = False  # the terminal event has been read
        self.draining = False  # the server is stopping: streams end (see Tails.drain)
        self.subscribers = 0
        self._changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(
                self._read(), name=f"ratchet-tail-{self.run_id}"
            )

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    def drain(self) -> None:
        self.draining = True
        self.wake()

    def wake(self) -> None:
        """Wake every subscriber's wait, to look at why it might stop."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _publish(self, events: list[Event]) -> None:
        self.window.extend(events)
        self.encoded.extend(map(self.encode, events))
        del self.window[:-WINDOW], self.encoded[:-WINDOW]
        self.head = events[-1].seq
        self.ended = self.ended or any(e.kind in TERMINAL for e in events)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _read(self) -> None:
        # Watch before the first read: an append between a read and the wait wakes it.
        with self.store.watching(EVENTS, self.run_id) as woken:
            # Start at the journal's head: subscribers replay what came before from the
            # journal, and the window holds what commits from now on.
            self.head = await self._last_seq()
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
            while not self.ended:
                woken.clear()
                try:
                    batch = await self.store.load_events(self.run_id, self.head, PAGE)
                except Exception as e:
                    log.warning("action=tail_read_failed run_id=%s error=%s", self.run_id, e)
                    await asyncio.sleep(0.5)
                    continue
                if batch:
                    self._publish(batch)
                    if len(batch) == PAGE:
                        continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), BACKSTOP_S)

    async def _last_seq(self) -> int:
        return await self.store.journal_head(self.run_id)

    async def follow(
        self, after: int, heartbeat_s: float, stop: Callable[[], bool] | None = None
    ) -> AsyncIterator[bytes | None]:
        """The run's events after seq ``after``, encoded, each once and in order, as they
        commit: all those available at once joined in one chunk; None when ``heartbeat_s``
        passes without one. Ends after the terminal event, when the server drains, or
        when ``stop()`` says so after a :meth:`wake`."""
        while not self.draining and not (stop is not None and stop()):
            changed = self._changed
            start = self.window[0].seq if self.window else self.head + 1
            if after + 1 < start:
                # Behind the window: replay from the journal itself.
                events = await self.store.load_events(self.run_id, after, PAGE)
                encoded = [self.encode(ev) for ev in events]
            elif after < self.head:
                events = self.window[after + 1 - start :]
                encoded = self.encoded[after + 1 - start :]
            else:
                events, encoded = [], []
            if events:
                ends = next((i for i, ev in enumerate(events) if ev.kind in TERMINAL), None)
                if ends is not None:
                    yield b"".join(encoded[: ends + 1])
                    return
                yield b"".join(encoded)
                after = events[-1].seq
                continue
            try:
                # A timeout scope, not wait_for: no task per wait, which a thousand
                # subscribers woken at every commit would pay for.
                async with asyncio.timeout(heartbeat_s):
                    await changed.wait()
            except TimeoutError:
                yield None


class Tails:
    """The tails of one server process, by run id, each kept while it has subscribers."""

    def __init__(self, store: Store, encode: Callable[[Event], bytes]) -> None:
        self.store = store
        self.encode = encode  # an event as subscribers receive it
        self._tails: dict[str, Tail] = {}
        self.draining = False

    @contextlib.contextmanager
    def subscribe(
        self, run_id: str, encode: Callable[[Event], bytes] | None = None
    ) -> Iterator[Tail]:
        """Follow ``run_id`` while the block lasts. ``encode``: how its events are encoded
        (default: the tails' own), taken by the run's first subscriber; a run has one
        tenant, so every subscriber of it reads the same encoding."""
        tail = self._tails.get(run_id)
        if tail is None:
            tail = self._tails[run_id] = Tail(self.store, run_id, encode or self.encode)
            tail.start()
            if self.draining:
                tail.drain()
        tail.subscribers += 1
        try:
            yield tail
        finally:
            tail.subscribers -= 1
            if tail.subscribers == 0:
                del self._tails[run_id]
                if tail._reader is not None:
                    tail._reader.cancel()

    def drain(self) -> None:
        """End every stream now: the server is stopping, and an open stream would hold it
        until its graceful timeout, then be cut. A client resumes on another server (or
        this one, restarted) with ``Last-Event-ID``, missing nothing."""
        self.draining = True
        for tail in self._tails.values():
            tail.drain()

    async def close(self) -> None:
        for tail in list(self._tails.values()):
            await tail.stop()
        self._tails.clear()
