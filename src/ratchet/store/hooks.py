"""What a dialect supplies to the store (see :mod:`ratchet.store.dialect`): how and where
a transaction runs, the liveness locks of workers, how waiters are woken, and the few writes
a dialect may do its own way. :class:`ratchet.store.base.Store` adds its verbs on top."""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from ratchet.model import Event, NewRun, RunRecord
from ratchet.store import journal, runs
from ratchet.store.bus import DONE, EVENTS, Bus
from ratchet.store.runs import insert_batch
from ratchet.store.transaction import Clock, Tx

T = TypeVar("T")


class StoreHooks(ABC):
    """The store's state and its dialect's hooks."""

    dialect: str
    sql_dialect: str  # the name of the dialect's folder of migrations and .sql file
    queries: dict[str, str]
    # Whether JSON comes back as the canonical text it was written as (see rows.py).
    json_text_canonical = True

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.bus = Bus(self._on_watch)
        # Each worker's row as registered, to write it again should it be pruned while alive.
        self._registrations: dict[str, dict[str, Any]] = {}
        self._held: set[str] = set()  # worker ids whose liveness lock this store holds

    # -- dialect hooks (see ratchet.store.dialect) -----------------------------------------

    @abstractmethod
    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(tx, *args)`` in one transaction, off the event loop."""

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a read-only ``fn(tx, *args)``; dialects may serve it beside the writes."""
        return await self._run(fn, *args)

    async def _look(self, fn: Callable[..., T], *args: Any) -> T | None:
        """:meth:`_read`, for a worker's look at who died (see ratchet.store.dialect)."""
        return await self._read(fn, *args)

    @abstractmethod
    def _dead(self, tx: Tx, worker_id: str) -> list[str]:
        """Within ``tx``: the workers (not ``worker_id``) whose liveness lock is gone."""

    @abstractmethod
    async def _hold(self, worker_id: str) -> bool:
        """Take ``worker_id``'s liveness lock; False when a live worker holds it."""

    @abstractmethod
    async def _release(self, worker_id: str) -> None:
        """Let go of ``worker_id``'s liveness lock."""

    @abstractmethod
    def _ids(self, ids: Sequence[str]) -> Any:
        """A list of ids as the dialect's queries take it."""

    @abstractmethod
    def _served(self, served: Collection[tuple[str, str]]) -> dict[str, Any]:
        """``(workflow, version)`` pairs as the parameters the dialect's queries take."""

    @abstractmethod
    def _announce(self, tx: Tx, channel: str, key: str = "") -> None:
        """Once this transaction commits, wake the waiters on ``channel`` (READY: a run
        became claimable; DONE: run ``key`` finished), in this process and, where the
        dialect can, in others."""

    @abstractmethod
    async def open(self) -> None:
        """Connect and apply pending migrations."""

    @abstractmethod
    async def close(self) -> None: ...

    def _listen(self, channel: str) -> None:
        """Make sure other processes' announcements on ``channel`` reach this one's
        watchers (dialects that can)."""
        return

    def _watch_finishes(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure finishes in other processes reach DONE waiters (dialects without
        cross-process notifications poll)."""
        return

    def _watch_journals(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure appends in other processes reach EVENTS waiters (dialects without
        cross-process notifications poll, once for all of them)."""
        return

    def _journaled(self, tx: Tx, run_id: str) -> None:
        """This transaction appends to ``run_id``'s journal: wake its tails on commit.
        PostgreSQL's journal trigger notifies instead, for every writer."""
        self._announce(tx, EVENTS, run_id)

    async def _create(self, new: NewRun) -> tuple[RunRecord, bool]:
        """Write one run unless its id exists (a dialect may do it in one statement)."""
        return await runs.create_run(self, new)

    def _insert_batch(
        self, tx: Tx, runs: list[dict[str, Any]], events: list[dict[str, Any]]
    ) -> list[str]:
        """Insert a batch of new runs and their first events (see
        :func:`ratchet.store.runs.insert_batch`); a dialect may do it in one statement."""
        return insert_batch(self, tx, runs, events)

    def _insert_events(self, tx: Tx, events: Sequence[Event]) -> None:
        """Within ``tx``: insert ``events`` whose lease the caller has checked."""
        journal.insert_events(self, tx, events)

    # -- wake-ups ----------------------------------------------------------------------------

    def _on_watch(self, channel: str, key: str, loop: asyncio.AbstractEventLoop) -> None:
        self._listen(channel)
        if channel == DONE and key:
            self._watch_finishes(loop)
        elif channel == EVENTS:
            self._watch_journals(loop)

    def _wake(self, channel: str, key: str = "") -> None:
        self.bus.wake(channel, key)

    def watching(
        self, channel: str, key: str = ""
    ) -> contextlib.AbstractContextManager[asyncio.Event]:
        """An event set by the next announcement on ``channel`` (READY, DONE for run
        ``key`` or any run, CANCEL); see :meth:`ratchet.store.bus.Bus.watching`."""
        return self.bus.watching(channel, key)
