"""The notification bus: in-process wake-ups for whoever waits on a store's events.

A transaction that makes a run claimable, finishes a run or requests a cancel announces it
on a channel once it commits; the bus sets the asyncio events of every watcher of that
channel, on whichever loop the watcher lives (the store may serve several). How
announcements from other processes reach the bus is the dialect's business (LISTEN/NOTIFY
on PostgreSQL, polling on SQLite): it is told when someone starts watching.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator

READY = "ratchet_ready"  # a run became claimable
DONE = "ratchet_done"  # a run reached a terminal status
CANCEL = "ratchet_cancel"  # a cancel was requested for a run a worker holds
EVENTS = "ratchet_events"  # events were appended to run key's journal

_Entry = tuple[asyncio.AbstractEventLoop, asyncio.Event]


class Bus:
    """Watchers by ``(channel, key)``; ``key`` is a run id on DONE/CANCEL/EVENTS, ""
    otherwise (and "" on DONE or EVENTS means any run)."""

    def __init__(
        self, on_watch: Callable[[str, str, asyncio.AbstractEventLoop], None] | None = None
    ) -> None:
        self._waiters: dict[tuple[str, str], set[_Entry]] = {}
        self._lock = threading.Lock()
        self._on_watch = on_watch

    def wake(self, channel: str, key: str = "") -> None:
        """Wake the watchers of ``channel`` for ``key``, and on DONE also those watching
        any run. Callable from any thread."""
        with self._lock:
            waiters = list(self._waiters.get((channel, key), ()))
            if key:
                waiters += self._waiters.get((channel, ""), ())
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def wake_all(self, channel: str) -> None:
        """Wake every watcher of ``channel``, whatever its key: announcements may have
        been missed (a notification connection was lost or replaced)."""
        with self._lock:
            waiters = [
                entry
                for (ch, _), entries in self._waiters.items()
                if ch == channel
                for entry in entries
            ]
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    @contextlib.contextmanager
    def watching(self, channel: str, key: str = "") -> Iterator[asyncio.Event]:
        """An event set by the next announcement on ``channel`` (for run ``key`` on DONE).
        Enter before checking the state it announces, so an announcement between the
        check and the wait is not lost."""
        loop = asyncio.get_running_loop()
        entry = (loop, asyncio.Event())
        with self._lock:
            self._waiters.setdefault((channel, key), set()).add(entry)
        if self._on_watch is not None:
            self._on_watch(channel, key, loop)
        try:
            yield entry[1]
        finally:
            with self._lock:
                waiters = self._waiters[(channel, key)]
                waiters.discard(entry)
                if not waiters:
                    del self._waiters[(channel, key)]

    def watched(self, channel: str) -> list[str]:
        """The keys someone is waiting on for ``channel`` ("" excluded)."""
        with self._lock:
            return [key for ch, key in self._waiters if ch == channel and key]
