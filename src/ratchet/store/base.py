"""The Store: every read and write the engine makes, as one transaction each.

The transaction bodies live here, once, over named queries; a dialect subclass supplies
the queries, the connection, how and where a transaction runs (and which ones it may
commit together), and how waiters are woken. Each public method is one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ratchet.errors import (
    BatchItemInvalid,
    LeaseLost,
    NotDeadLettered,
    RatchetError,
    ReceiptBusy,
    ReceiptSettled,
    RunFinished,
    RunIdConflict,
    SignalAlreadyConsumed,
    StoreConflict,
    StoreNotReady,
    UnknownReceipt,
    UnknownRun,
)
from ratchet.model import (
    Approval,
    ClaimedRun,
    DeadLetter,
    Event,
    EventKind,
    Lease,
    LLMTotals,
    NewRun,
    Receipt,
    RunRecord,
    RunStatus,
    dumps,
)
from ratchet.store import approvals, retention, sandboxes
from ratchet.store.bus import CANCEL, DONE, EVENTS, READY, Bus
from ratchet.store.queries import load_migrations

__all__ = [
    "CANCEL",
    "DONE",
    "EVENTS",
    "READY",
    "Clock",
    "HeldLease",
    "LeaseState",
    "Store",
    "Tx",
    "WorkerInfo",
]

T = TypeVar("T")

TIMER_BATCH = 100  # due timers promoted to queued per claim
WORKER_GONE_TTLS = 20  # a worker unseen for this many of its TTLs is forgotten


class FirmFuture(asyncio.Future[T]):
    """A store call's answer, which the caller's cancellation cannot discard.

    Cancelling a task cancels the future it awaits; for a transaction already sent, that
    would lose the answer while the commit still happens. This future refuses to be
    cancelled, so a cancelled caller waits for the outcome and is cancelled right after
    (see :func:`settled`): a caller never has to wonder whether its write landed."""

    def cancel(self, msg: Any = None) -> bool:
        return False


async def settled(fut: asyncio.Future[T]) -> T:
    """Await a :class:`FirmFuture`. If the caller was cancelled meanwhile, the
    cancellation arrives once the outcome is known: a failure (say LeaseLost) is raised
    instead of it, and ``CancelledError`` from here means the operation succeeded."""
    try:
        return await fut
    except asyncio.CancelledError:
        if fut.done() and not fut.cancelled() and fut.exception() is not None:
            raise fut.exception() from None  # type: ignore[misc]
        raise


def firm_future(loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
    return FirmFuture(loop=loop)


class Clock:
    """An offset added to the database's clock. Tests move it forward to expire leases
    and timers without sleeping through them; in production it stays at zero."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Any = ..., /) -> Any: ...
    def executemany(self, sql: str, params: Any, /) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Tx:
    """A transaction in progress: runs named queries on one cursor.

    ``send`` issues a statement whose outcome the body does not look at; with a dialect
    that pipelines (PostgreSQL), such statements travel together. ``run`` and ``many``
    return the affected row count, and ``one``/``all`` rows, so they wait for the answer.
    """

    __slots__ = ("_cur", "_q", "_sync", "after_commit")

    def __init__(
        self, cur: Cursor, queries: dict[str, str], sync: Callable[[], None] | None = None
    ) -> None:
        self._cur = cur
        self._q = queries
        self._sync = sync
        self.after_commit: list[Callable[[], None]] = []

    def send(self, name: str, params: dict[str, Any]) -> None:
        self._cur.execute(self._q[name], params)

    def send_many(self, name: str, rows: Sequence[dict[str, Any]]) -> None:
        self._cur.executemany(self._q[name], rows)

    def one(self, name: str, params: dict[str, Any]) -> Any:
        self._cur.execute(self._q[name], params)
        return self._cur.fetchone()

    def all(self, name: str, params: dict[str, Any]) -> list[Any]:
        self._cur.execute(self._q[name], params)
        return self._cur.fetchall()

    def run(self, name: str, params: dict[str, Any]) -> int:
        self._cur.execute(self._q[name], params)
        if self._sync is not None:
            self._sync()
        return int(self._cur.rowcount)

    def many(self, name: str, rows: Sequence[dict[str, Any]]) -> int:
        self._cur.executemany(self._q[name], rows)
        if self._sync is not None:
            self._sync()
        return int(self._cur.rowcount)


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A lease as renewal found it: still this worker's, at this epoch."""

    run_id: str
    epoch: int
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class StoredGraph:
    """A row of ``graphs``: one registered version of a graph, by content hash."""

    name: str
    version: str
    definition: dict[str, Any]
    registered_at: float


def _graph(row: Any) -> StoredGraph:
    return StoredGraph(
        row["name"], row["version"], json.loads(row["definition"]), float(row["registered_at"])
    )


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A row of ``workers``: who serves which ``(workflow, version)`` pairs and queues."""

    worker_id: str
    host: str
    pid: int
    serves: frozenset[tuple[str, str]]
    queues: tuple[str, ...]
    lease_ttl: float
    seen_at: float


@dataclass(frozen=True, slots=True)
class LeaseState:
    """A run's lease as the database has it."""

    worker_id: str | None
    epoch: int
    live: bool


# Rows are read by column name (sqlite3.Row; a name-indexable tuple on PostgreSQL): one
# mapping per row shape, so a query may add or reorder columns without breaking its readers.


def record_from_row(row: Any) -> RunRecord:
    """A ``runs`` row (the columns of ``run_get``) as a :class:`RunRecord`."""
    output = row["output"]
    return RunRecord(
        run_id=row["run_id"],
        workflow=row["workflow"],
        workflow_version=row["workflow_version"],
        input=json.loads(row["input"]),
        status=RunStatus(row["status"]),
        output=json.loads(output) if output is not None else None,
        error=row["error"],
        parent_run_id=row["parent_run_id"],
        parent_step_id=row["parent_step_id"],
        queue=row["queue"],
        priority=row["priority"],
        not_before=row["not_before"],
        waiting_for=row["waiting_for"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        tenant_id=row["tenant_id"],
    )


def _event(row: Any, canonical: bool = True) -> Event:
    """A ``journal_events`` row as an :class:`Event`. ``canonical``: the stored payload text
    is the canonical text the event was hashed with. Otherwise (jsonb, which keeps its own
    spacing and key order) the event carries no text, and :meth:`Event.verify` makes the
    canonical one from the value when asked (reading a journal does not pay for it), unless
    the row says its text is the one hashed (``payload_exact``: kept from before jsonb)."""
    text = row["payload"]
    # jsonb gives objects back with its own key order (shorter keys first); a replay must
    # see a step's output exactly as its first run did (canonical JSON: sorted keys), or
    # code that serialises it (a prompt, a request body) would differ between drives.
    payload = json.loads(text) if canonical else json.loads(text, object_pairs_hook=_sorted)
    return Event(
        row["run_id"],
        row["seq"],
        row["kind"],
        row["step_id"],
        row["attempt"],
        payload,
        row["at"],
        row["prev_hash"],
        row["hash"],
        text if canonical or row["payload_exact"] else "",
    )


def _events(rows: Sequence[Any], canonical: bool = True) -> list[Event]:
    """Rows of ``journal_events`` as events (see :func:`_event`). A replay reads thousands:
    their payloads are decoded by one parse of a JSON array holding them all, which gives
    the same values as a parse of each and saves a decoder call per event."""
    if not rows:
        return []
    array = "[" + ",".join([r["payload"] for r in rows]) + "]"
    payloads = json.loads(array) if canonical else json.loads(array, object_pairs_hook=_sorted)
    if len(payloads) != len(rows):  # a stored text that is not one JSON value
        return [_event(r, canonical) for r in rows]
    # events_load's columns, by position (both dialects give them in this order).
    return [
        Event(
            run_id,
            seq,
            kind,
            step_id,
            attempt,
            payload,
            at,
            prev_hash,
            hash_,
            text if canonical or exact else "",
        )
        for (
            run_id,
            seq,
            kind,
            step_id,
            attempt,
            text,
            exact,
            at,
            prev_hash,
            hash_,
        ), payload in zip(rows, payloads, strict=True)
    ]


def _sorted(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    pairs.sort(key=lambda kv: kv[0])
    return dict(pairs)


def _receipt(row: Any) -> Receipt:
    response = row["response"]
    return Receipt(
        row["idempotency_key"],
        row["run_id"],
        row["step_id"],
        row["status"],
        json.loads(response) if response is not None else None,
        row["claimed_at"],
        row["settled_at"],
        row["delivery"],
        row["attempt"],
        row["settled_by"],
    )


def _dead_letter(row: Any) -> DeadLetter:
    return DeadLetter(row["run_id"], row["workflow"], row["reason"], row["error"], row["at"])


def _short(value: Any, limit: int = 60) -> str:
    text = dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_same_run(rec: RunRecord, new: NewRun, redact: bool = False) -> None:
    """An idempotent start found ``rec`` under ``new``'s id: the same request, or a
    conflict named field by field (a different workflow, input, queue or priority).
    ``redact``: name the fields that differ but quote none of the stored values (the HTTP
    API, whose caller may not be allowed to read the run)."""
    if redact:
        fields = [
            name
            for name, same in (
                ("workflow", rec.workflow == new.workflow),
                ("input", dumps(rec.input) == dumps(new.input)),
                ("queue", rec.queue == new.queue),
                ("priority", rec.priority == new.priority),
            )
            if not same
        ]
        if fields:
            raise RunIdConflict(
                f"run id {rec.run_id!r} already exists with another "
                f"{', '.join(fields)}: use another run id"
            )
        return
    if rec.workflow != new.workflow:
        raise RunIdConflict(
            f"run id {rec.run_id!r} already belongs to workflow "
            f"{rec.workflow!r}, not {new.workflow!r}"
        )
    diffs = []
    if dumps(rec.input) != dumps(new.input):
        diffs.append(f"input {_short(rec.input)} (not {_short(new.input)})")
    if rec.queue != new.queue:
        diffs.append(f"queue {rec.queue!r} (not {new.queue!r})")
    if rec.priority != new.priority:
        diffs.append(f"priority {rec.priority} (not {new.priority})")
    if diffs:
        raise RunIdConflict(
            f"run id {rec.run_id!r} already exists with {'; '.join(diffs)}: use another run id"
        )


def _check_in_batch(rec: RunRecord, new: NewRun, index: int, redact: bool = False) -> None:
    """:func:`_check_same_run` for item ``index`` of a batch, and the same tenant too."""
    if rec.tenant_id != new.tenant_id:
        raise BatchItemInvalid(
            index, "run_id", f"run id {rec.run_id!r} is taken; choose another", taken=True
        )
    try:
        _check_same_run(rec, new, redact)
    except RunIdConflict as e:
        raise BatchItemInvalid(index, "run_id", str(e)) from None


def _check_repeat(earlier: NewRun, new: NewRun, j: int, i: int) -> None:
    """Item ``i`` repeats item ``j``'s run id: the same run, or a conflict."""
    same = (
        earlier.workflow,
        earlier.workflow_version,
        dumps(earlier.input),
        earlier.queue,
        earlier.priority,
        earlier.tenant_id,
        earlier.guards,
    ) == (
        new.workflow,
        new.workflow_version,
        dumps(new.input),
        new.queue,
        new.priority,
        new.tenant_id,
        new.guards,
    )
    if not same:
        raise BatchItemInvalid(
            i,
            "run_id",
            f"run id {new.run_id!r} repeats item {j} with a "
            "different workflow, input, queue, priority or guards",
        )


def event_params(ev: Event) -> dict[str, Any]:
    return {
        "run_id": ev.run_id,
        "seq": ev.seq,
        "kind": ev.kind,
        "step_id": ev.step_id,
        "attempt": ev.attempt,
        "payload": ev.payload_json or dumps(ev.payload),
        "at": ev.at,
        "prev_hash": ev.prev_hash,
        "hash": ev.hash,
    }


class Store(ABC):
    """One schema, two backends. Every method is one transaction."""

    dialect: str
    sql_dialect: str  # the name of the dialect's folder of migrations and .sql file
    queries: dict[str, str]
    # Whether JSON comes back as the canonical text it was written as (see _event).
    json_text_canonical = True

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.bus = Bus(self._on_watch)
        self._registrations: dict[str, dict[str, Any]] = {}

    # -- dialect hooks -------------------------------------------------------------------

    @abstractmethod
    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(tx, *args)`` in one transaction, off the event loop."""

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a read-only ``fn(tx, *args)``; dialects may serve it beside the writes."""
        return await self._run(fn, *args)

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

    async def finished_among(self, run_ids: Sequence[str]) -> list[str]:
        """Those of ``run_ids`` that have reached a terminal status."""
        ids = self._ids(run_ids)
        rows = await self._read(lambda tx: tx.all("runs_finished", {"ids": ids}))
        return [r["run_id"] for r in rows]

    async def now(self) -> float:
        """The database's clock (plus the store's offset), in Unix seconds."""
        return float(await self._read(lambda tx: tx.one("now", {})["now"]))

    async def check_ready(self) -> None:
        """Raise :class:`StoreNotReady`, naming what is wrong, unless the database answers
        and has every migration this code knows applied (``/readyz``)."""
        try:
            rows = await self._read(lambda tx: tx.all("migrations_applied", {}))
        except RatchetError as e:
            raise StoreNotReady(f"cannot read the applied migrations ({type(e).__name__})") from e
        done = {int(r["version"]) for r in rows}
        missing = [v for v, _, _ in load_migrations(self.sql_dialect) if v not in done]
        if missing:
            raise StoreNotReady("migrations not applied: " + ", ".join(map(str, missing)))

    # -- shared transaction pieces ---------------------------------------------------------

    @staticmethod
    def _check_lease(tx: Tx, lease: Lease) -> None:
        params = {"run_id": lease.run_id, "worker_id": lease.worker_id, "epoch": lease.epoch}
        if tx.one("lease_check", params) is None:
            raise LeaseLost(lease.run_id)

    def _insert_events(self, tx: Tx, events: Sequence[Event]) -> None:
        for run_id in {e.run_id for e in events}:
            self._journaled(tx, run_id)
        if len(events) == 1:
            tx.send("event_insert", event_params(events[0]))
        elif events:
            tx.send_many("event_insert", [event_params(e) for e in events])

    def _append_unowned(self, tx: Tx, run_id: str, kind: str, payload: dict[str, Any]) -> Event:
        """Append for a writer without the lease; the caller holds the run's lease row
        locked (or fenced), so no holder can append concurrently."""
        last = tx.one("event_last", {"run_id": run_id})
        seq, prev = (last["seq"], last["hash"]) if last else (0, "0" * 64)
        ev = Event.chain(run_id, seq + 1, kind, None, None, payload, time.time(), prev)
        tx.send("event_insert", event_params(ev))
        self._journaled(tx, run_id)
        return ev

    def _insert_run(self, tx: Tx, new: NewRun) -> tuple[RunRecord, bool]:
        params = {
            "run_id": new.run_id,
            "workflow": new.workflow,
            "workflow_version": new.workflow_version,
            "input": dumps(new.input),
            "parent_run_id": new.parent_run_id,
            "parent_step_id": new.parent_step_id,
            "queue": new.queue,
            "priority": new.priority,
            "tenant_id": new.tenant_id,
        }
        created = tx.run("run_insert", params) == 1
        if created:
            payload: dict[str, Any] = {"workflow": new.workflow, "version": new.workflow_version}
            if new.guards:
                payload["guards"] = new.guards
            ev = Event.chain(
                new.run_id, 1, EventKind.RUN_QUEUED, None, None, payload, time.time(), "0" * 64
            )
            tx.send("event_insert", event_params(ev))
            self._journaled(tx, new.run_id)
            self._announce(tx, READY)
        row = tx.one("run_get", {"run_id": new.run_id})
        return record_from_row(row), created

    def _take(
        self, tx: Tx, ids: list[str], worker_id: str, ttl: float, reason: str
    ) -> list[ClaimedRun]:
        if not ids:
            return []
        epochs = {
            r["run_id"]: r["epoch"]
            for r in tx.all(
                "leases_take", {"ids": self._ids(ids), "worker_id": worker_id, "ttl": ttl}
            )
        }
        if not epochs:
            return []
        taken = self._ids(list(epochs))
        tx.send("runs_set_running", {"ids": taken})
        rows = tx.all("runs_get_many", {"ids": taken})
        return [
            ClaimedRun(rec, Lease(rec.run_id, worker_id, int(epochs[rec.run_id])), reason)
            for rec in map(record_from_row, rows)
        ]

    # -- runs ------------------------------------------------------------------------------

    async def create_run(self, new: NewRun, *, redact: bool = False) -> tuple[RunRecord, bool]:
        """Write the run (``queued``) and its ``run_queued`` event; idempotent on run_id:
        an existing run with the same workflow, input, queue and priority is returned with
        ``created=False``; one that differs raises :class:`RunIdConflict` naming what
        (``redact``: without quoting the stored run's values)."""
        rec, created = await self._create(new)
        if not created:
            _check_same_run(rec, new, redact)
        return rec, created

    async def _create(self, new: NewRun) -> tuple[RunRecord, bool]:
        return await self._run(self._insert_run, new)

    async def create_runs(
        self, news: Sequence[NewRun], *, redact: bool = False
    ) -> list[tuple[str, RunStatus, bool]]:
        """Write many runs (``queued``) and their ``run_queued`` events in one transaction,
        with one wake-up: ``(run_id, status, created)`` per item, in order. Each item is
        idempotent on its run id as in :meth:`create_run`; an item whose id exists with a
        different workflow, input, queue, priority or tenant raises
        :class:`BatchItemInvalid` naming its index, and nothing of the batch is written
        (``redact``: without quoting the stored runs' values). Top-level runs only (no
        parent)."""
        first: dict[str, int] = {}
        for i, new in enumerate(news):
            if new.parent_run_id is not None:
                raise BatchItemInvalid(i, "run_id", "a batch starts top-level runs only")
            j = first.setdefault(new.run_id, i)
            if j != i:
                _check_repeat(news[j], new, j, i)
        unique = [news[i] for i in first.values()]
        found = await self._run(self._insert_runs, unique, redact)
        created = {run_id for run_id, (_, fresh) in found.items() if fresh}
        return [
            (n.run_id, found[n.run_id][0], n.run_id in created and first[n.run_id] == i)
            for i, n in enumerate(news)
        ]

    def _insert_runs(
        self, tx: Tx, news: list[NewRun], redact: bool = False
    ) -> dict[str, tuple[RunStatus, bool]]:
        index = {n.run_id: i for i, n in enumerate(news)}
        found: dict[str, tuple[RunStatus, bool]] = {}

        def check_existing(ids: list[str]) -> None:
            for row in tx.all("runs_get_many", {"ids": self._ids(ids)}):
                rec = record_from_row(row)
                _check_in_batch(rec, news[index[rec.run_id]], index[rec.run_id], redact)
                found[rec.run_id] = (rec.status, False)

        check_existing(list(index))
        fresh = [n for n in news if n.run_id not in found]
        if fresh:
            now = time.time()
            rows, events = [], []
            for n in fresh:
                payload: dict[str, Any] = {"workflow": n.workflow, "version": n.workflow_version}
                if n.guards:
                    payload["guards"] = n.guards
                ev = Event.chain(
                    n.run_id, 1, EventKind.RUN_QUEUED, None, None, payload, now, "0" * 64
                )
                rows.append(
                    {
                        "run_id": n.run_id,
                        "workflow": n.workflow,
                        "workflow_version": n.workflow_version,
                        "input": dumps(n.input),
                        "parent_run_id": None,
                        "parent_step_id": None,
                        "queue": n.queue,
                        "priority": n.priority,
                        "tenant_id": n.tenant_id,
                    }
                )
                events.append(event_params(ev))
            inserted = self._insert_batch(tx, rows, events)
            for run_id in inserted:
                found[run_id] = (RunStatus.QUEUED, True)
            raced = [n.run_id for n in fresh if n.run_id not in found]
            if raced:
                # Started concurrently by another transaction, committed after this one's
                # first look: the inserts skipped them, and a fresh read sees them now.
                check_existing(raced)
            if inserted:
                self._announce(tx, READY)
        return found

    def _insert_batch(
        self, tx: Tx, runs: list[dict[str, Any]], events: list[dict[str, Any]]
    ) -> list[str]:
        """Insert ``runs`` (skipping ids that exist) and, for those inserted, their events
        (in the same order); return the ids inserted. The dialect may do it in one
        statement (PostgreSQL); this form holds the write lock throughout (SQLite's BEGIN
        IMMEDIATE), so no other writer can insert one of these ids meanwhile."""
        if tx.many("run_insert", runs) != len(runs):
            raise StoreConflict(
                "a run of the batch was inserted by another writer while "
                "this one held the write lock"
            )
        tx.send_many("event_insert", events)
        for row in runs:
            self._journaled(tx, row["run_id"])
        return [row["run_id"] for row in runs]

    async def get_run(self, run_id: str) -> RunRecord | None:
        row = await self._read(lambda tx: tx.one("run_get", {"run_id": run_id}))
        return record_from_row(row) if row else None

    async def list_runs(self, status: str | None = None, limit: int = 100) -> list[RunRecord]:
        if status is None:
            rows = await self._read(lambda tx: tx.all("runs_list", {"limit": limit}))
        else:
            params = {"status": status, "limit": limit}
            rows = await self._read(lambda tx: tx.all("runs_list_status", params))
        return [record_from_row(r) for r in rows]

    async def load_events(self, run_id: str, after: int = 0, limit: int = -1) -> list[Event]:
        """A run's journal after ``after``, in one query."""
        if limit < 0:
            limit = 2**62
        params = {"run_id": run_id, "after": after, "limit": limit}
        rows = await self._read(lambda tx: tx.all("events_load", params))
        return _events(rows, self.json_text_canonical)

    async def llm_totals(self, run_ids: Sequence[str]) -> dict[str, LLMTotals]:
        """The model calls of each run, summed from their journals (runs without any are
        left out)."""
        params = {"ids": self._ids(list(run_ids))}
        rows = await self._read(lambda tx: tx.all("llm_calls_of_runs", params))
        totals: dict[str, LLMTotals] = {}
        for r in rows:
            totals.setdefault(r["run_id"], LLMTotals()).add(json.loads(r["llm"]))
        return totals

    async def lease(self, run_id: str) -> LeaseState | None:
        """Who holds the run's lease now, at which epoch, and whether it is still live by
        the database's clock; None if the run was never claimed."""
        row = await self._read(lambda tx: tx.one("lease_get", {"run_id": run_id}))
        return LeaseState(row["worker_id"], int(row["epoch"]), bool(row["live"])) if row else None

    async def receipts(self, run_id: str) -> list[Receipt]:
        """A run's receipts, in the order they were (last) claimed."""
        rows = await self._read(lambda tx: tx.all("receipts_list", {"run_id": run_id}))
        return [_receipt(r) for r in rows]

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        rows = await self._read(lambda tx: tx.all("dead_letters_list", {"limit": limit}))
        return [_dead_letter(r) for r in rows]

    async def count_runs(self, status: str | None = None) -> int:
        """How many runs there are, with ``status`` if given."""
        if status is None:
            row = await self._read(lambda tx: tx.one("runs_count", {}))
        else:
            row = await self._read(lambda tx: tx.one("runs_count_by_status", {"status": status}))
        return int(row[0])

    async def count_dead_letters(self) -> int:
        """How many runs are in the dead-letter queue."""
        return int((await self._read(lambda tx: tx.one("dead_letters_count", {})))[0])

    # -- ownership -------------------------------------------------------------------------

    async def register_worker(
        self,
        worker_id: str,
        host: str,
        pid: int,
        *,
        serves: Collection[tuple[str, str]] = (),
        queues: Sequence[str] = (),
        lease_ttl: float = 15.0,
    ) -> None:
        """Record a worker, what it serves (``(workflow, version)`` pairs and queues) and
        its lease TTL, by which its liveness is judged (:meth:`live_workers`)."""
        params = self._registration(worker_id, host, pid, serves, queues, lease_ttl)
        await self._run(lambda tx: tx.send("worker_upsert", params))

    def _registration(
        self,
        worker_id: str,
        host: str,
        pid: int,
        serves: Collection[tuple[str, str]],
        queues: Sequence[str],
        lease_ttl: float,
    ) -> dict[str, Any]:
        """A worker's row, kept to register it again should it be pruned while alive."""
        params = {
            "worker_id": worker_id,
            "host": host,
            "pid": pid,
            "serves": dumps(sorted([w, v] for w, v in serves)),
            "queues": dumps(list(queues)),
            "lease_ttl": lease_ttl,
        }
        self._registrations[worker_id] = params
        return params

    async def live_workers(self) -> list[WorkerInfo]:
        """The workers seen within their lease TTL, with what they serve."""
        rows = await self._read(lambda tx: tx.all("workers_live", {}))
        return [
            WorkerInfo(
                r["worker_id"],
                r["host"],
                r["pid"],
                frozenset((w, v) for w, v in json.loads(r["serves"])),
                tuple(json.loads(r["queues"])),
                r["lease_ttl"],
                r["seen_at"],
            )
            for r in rows
        ]

    async def claim(
        self,
        worker_id: str,
        ttl: float,
        limit: int,
        queues: Sequence[str],
        served: Collection[tuple[str, str]],
    ) -> list[ClaimedRun]:
        """Take up to ``limit`` ready runs (queued, or waiting past ``not_before``) of the
        ``(workflow, version)`` pairs in ``served``; others stay queued for a worker that
        serves them."""

        def body(tx: Tx) -> list[ClaimedRun]:
            if tx.all("timers_due", {"limit": TIMER_BATCH}):
                self._announce(tx, READY)
            picked: list[Any] = []
            for queue in dict.fromkeys(queues):  # each along runs_queued, then merged
                picked += tx.all(
                    "claim_pick", {"queue": queue, "limit": limit, **self._served(served)}
                )
            picked.sort(key=lambda r: (-r["priority"], r["created_at"]))
            ids = [r["run_id"] for r in picked[:limit]]
            return self._take(tx, ids, worker_id, ttl, "claim")

        return await self._run(body)

    async def steal_expired(
        self,
        worker_id: str,
        ttl: float,
        limit: int,
        queues: Sequence[str],
        served: Collection[tuple[str, str]],
    ) -> list[ClaimedRun]:
        """The recovery sweep: take running runs (of the pairs in ``served``) whose lease
        is missing or expired; and forget workers long gone."""

        def body(tx: Tx) -> list[ClaimedRun]:
            tx.send("workers_prune", {"ttls": WORKER_GONE_TTLS})
            picked = tx.all(
                "steal_pick", {"queues": self._ids(queues), "limit": limit, **self._served(served)}
            )
            return self._take(tx, [r["run_id"] for r in picked], worker_id, ttl, "sweep")

        return await self._run(body)

    async def reclaim_own(
        self, worker_id: str, ttl: float, served: Collection[tuple[str, str]]
    ) -> list[ClaimedRun]:
        """On restart: take back, at once, the running runs still under this worker id
        (those of the pairs in ``served``; the sweep hands the others on)."""

        def body(tx: Tx) -> list[ClaimedRun]:
            picked = tx.all("reclaim_pick", {"worker_id": worker_id, **self._served(served)})
            return self._take(tx, [r["run_id"] for r in picked], worker_id, ttl, "reclaim")

        return await self._run(body)

    async def start_worker(
        self,
        worker_id: str,
        host: str,
        pid: int,
        *,
        serves: Collection[tuple[str, str]] = (),
        queues: Sequence[str] = (),
        lease_ttl: float = 15.0,
    ) -> list[ClaimedRun]:
        """:meth:`register_worker`, then :meth:`reclaim_own`, in one commit: a restarted
        worker's interrupted runs are its own again one commit after it starts."""
        params = self._registration(worker_id, host, pid, serves, queues, lease_ttl)

        def body(tx: Tx) -> list[ClaimedRun]:
            tx.send("worker_upsert", params)
            picked = tx.all("reclaim_pick", {"worker_id": worker_id, **self._served(serves)})
            return self._take(tx, [r["run_id"] for r in picked], worker_id, lease_ttl, "reclaim")

        return await self._run(body)

    async def renew(self, worker_id: str, ttl: float, run_ids: Sequence[str]) -> list[HeldLease]:
        """Extend the leases of the runs this worker drives, in one statement, and report
        which it still holds (a run missing from the answer was taken from it)."""
        ids = self._ids(run_ids)

        def body(tx: Tx) -> list[HeldLease]:
            if tx.run("worker_seen", {"worker_id": worker_id}) == 0:
                registration = self._registrations.get(worker_id)
                if registration is not None:  # pruned while cut off: be seen again
                    tx.send("worker_upsert", registration)
            if not run_ids:
                return []
            tx.send("leases_renew", {"worker_id": worker_id, "ttl": ttl, "ids": ids})
            rows = tx.all("leases_held", {"worker_id": worker_id, "ids": ids})
            return [
                HeldLease(r["run_id"], int(r["epoch"]), bool(r["cancel_requested"])) for r in rows
            ]

        return await self._run(body)

    async def retake_lease(self, lease: Lease, ttl: float) -> Lease | None:
        """The holder's lease again under a new epoch, for a new drive by the same worker;
        None if the lease moved on meanwhile."""

        def body(tx: Tx) -> Lease | None:
            row = tx.one(
                "lease_retake",
                {
                    "run_id": lease.run_id,
                    "worker_id": lease.worker_id,
                    "epoch": lease.epoch,
                    "ttl": ttl,
                },
            )
            return None if row is None else Lease(lease.run_id, lease.worker_id, int(row["epoch"]))

        return await self._run(body)

    async def release_worker(self, worker_id: str) -> None:
        """A clean shutdown: hand this worker's running runs back to the queue at once,
        and remove its ``workers`` row."""

        def body(tx: Tx) -> None:
            if tx.run("runs_requeue_worker", {"worker_id": worker_id}):
                self._announce(tx, READY)
            tx.send("leases_release_worker", {"worker_id": worker_id})
            tx.send("worker_delete", {"worker_id": worker_id})

        await self._run(body)

    # -- the holder's writes ---------------------------------------------------------------

    async def append(self, lease: Lease, events: Sequence[Event]) -> None:
        """Append events under the lease: all land, or LeaseLost and none do."""

        if not events:
            return await self._run(self._check_lease, lease)
        holder = {"worker_id": lease.worker_id, "epoch": lease.epoch}
        rows = [event_params(e) | holder for e in events]

        def body(tx: Tx) -> None:
            # One statement per event checks the lease and inserts; fewer rows than events
            # means the lease was lost, and the transaction rolls back.
            inserted = (
                tx.run("event_insert_leased", rows[0])
                if len(rows) == 1
                else tx.many("event_insert_leased", rows)
            )
            if inserted != len(rows):
                raise LeaseLost(lease.run_id)
            self._journaled(tx, lease.run_id)

        await self._run(body)

    async def start_child(self, lease: Lease, events: Sequence[Event], child: NewRun) -> RunRecord:
        """Append the parent's events and create the child run, in one transaction."""

        def body(tx: Tx) -> RunRecord:
            self._check_lease(tx, lease)
            self._insert_events(tx, events)
            return self._insert_run(tx, child)[0]

        return await self._run(body)

    async def pending_signal(self, run_id: str, name: str) -> tuple[int, Any] | None:
        """The oldest unconsumed signal ``name`` for the run: ``(signal_id, payload)``."""
        params = {"run_id": run_id, "name": name}
        row = await self._read(lambda tx: tx.one("signal_pending", params))
        return (int(row["id"]), json.loads(row["payload"])) if row else None

    async def consume_signal(self, lease: Lease, events: Sequence[Event], signal_id: int) -> None:
        """Append ``events`` and mark the signal consumed by the last of them, together.
        Only the lease holder consumes a run's signals, so the peek before cannot race."""

        def body(tx: Tx) -> None:
            self._check_lease(tx, lease)
            self._insert_events(tx, events)
            params = {"run_id": lease.run_id, "id": signal_id, "seq": events[-1].seq}
            if tx.run("signal_consume", params) != 1:
                raise SignalAlreadyConsumed(
                    f"signal {signal_id} of run {lease.run_id} was already consumed"
                )

        await self._run(body)

    # -- graphs (migrations sqlite 006, postgres 007) ---------------------------------------

    async def register_graph(self, name: str, version: str, definition: Any) -> StoredGraph:
        """Store a graph version (a no-op when that content is registered already); the row
        as stored, with its first registration time."""
        params = {"name": name, "version": version, "definition": dumps(definition)}

        def body(tx: Tx) -> StoredGraph:
            tx.send("graph_insert", params)
            return _graph(tx.one("graph_get", {"name": name, "version": version}))

        return await self._run(body)

    async def get_graph(self, name: str, version: str | None = None) -> StoredGraph | None:
        """A registered graph version, or its latest registered version."""
        if version is None:
            row = await self._read(lambda tx: tx.one("graph_latest", {"name": name}))
        else:
            row = await self._read(
                lambda tx: tx.one("graph_get", {"name": name, "version": version})
            )
        return _graph(row) if row else None

    async def list_graphs(self) -> list[StoredGraph]:
        """Every registered version of every graph, newest first within a name."""
        return [_graph(r) for r in await self._read(lambda tx: tx.all("graphs_list", {}))]

    async def graph_versions(self) -> frozenset[tuple[str, str]]:
        """Every registered ``(graph name, version)`` pair: what a worker serves besides its
        code workflows."""
        rows = await self._read(lambda tx: tx.all("graph_versions", {}))
        return frozenset((r["name"], r["version"]) for r in rows)

    async def graph_versions_tiers(
        self,
    ) -> tuple[frozenset[tuple[str, str]], frozenset[tuple[str, str]]]:
        """Every registered ``(graph name, version)`` pair, and those of ``tier:
        isolated`` among them."""
        rows = await self._read(lambda tx: tx.all("graph_versions_tiers", {}))
        pairs = [((r["name"], r["version"]), bool(r["isolated"])) for r in rows]
        return (frozenset(p for p, _ in pairs), frozenset(p for p, isolated in pairs if isolated))

    # -- guards ----------------------------------------------------------------------------

    async def recent_retries(self, workflow: str, window_s: float) -> int:
        """How many retries the runs of ``workflow`` journaled within the last ``window_s``
        seconds, whichever worker drove them."""
        params = {"workflow": workflow, "window_s": window_s}
        row = await self._read(lambda tx: tx.one("guard_retries_recent", params))
        return int(row["n"]) if row else 0

    async def llm_history(
        self, workflow: str, limit: int
    ) -> list[tuple[str, str | None, dict[str, Any] | None]]:
        """The LLM calls (run, step, usage and cost) of the last ``limit`` finished runs of
        ``workflow``; a run without any has one row with step and call None."""
        params = {"workflow": workflow, "limit": limit}
        rows = await self._read(lambda tx: tx.all("guard_llm_history", params))
        return [
            (r["run_id"], r["step_id"], json.loads(r["llm"]) if r["llm"] else None) for r in rows
        ]

    # -- sandboxes (see ratchet.store.sandboxes) --------------------------------------------

    async def open_sandbox(
        self, lease: Lease, sandbox_id: str, backend: str, limit: int, since_epoch: int = 0
    ) -> tuple[sandboxes.SandboxRecord | None, int]:
        """Under the lease: the row of the run's next sandbox, or None once ``limit``
        attempts (of epoch ``since_epoch`` on) were counted; and how many were."""

        def body(tx: Tx) -> tuple[sandboxes.SandboxRecord | None, int]:
            self._check_lease(tx, lease)
            return sandboxes.open_sandbox(tx, lease, sandbox_id, backend, limit, since_epoch)

        return await self._run(body)

    async def sandbox_running(self, sandbox_id: str) -> None:
        """The sandbox's process started."""
        await self._run(lambda tx: tx.send("sandbox_running", {"sandbox_id": sandbox_id}))

    async def end_sandbox(
        self,
        sandbox_id: str,
        *,
        reason: str,
        exit_code: int | None,
        signal: int | None,
        peak_memory: int | None,
    ) -> None:
        """The sandbox's process is gone: how it ended."""
        params = {
            "sandbox_id": sandbox_id,
            "end_reason": reason,
            "exit_code": exit_code,
            "signal": signal,
            "peak_memory": peak_memory,
        }
        await self._run(lambda tx: tx.send("sandbox_end", params))

    async def list_sandboxes(
        self, run_id: str | None = None, limit: int = 100
    ) -> list[sandboxes.SandboxRecord]:
        """A run's sandboxes by attempt, or the most recent ones of every run."""
        if run_id is not None:
            rows = await self._read(lambda tx: tx.all("sandboxes_of_run", {"run_id": run_id}))
        else:
            rows = await self._read(lambda tx: tx.all("sandboxes_recent", {"limit": limit}))
        return [sandboxes.record(r) for r in rows]

    # -- approvals (see ratchet.store.approvals) --------------------------------------------

    async def ask_approval(
        self,
        lease: Lease,
        events: Sequence[Event],
        step_id: str,
        attempt: int,
        name: str,
        data: Any,
        deadline: float | None,
    ) -> None:
        """Append ``events`` (the ``step_waiting`` that asks) and write the approval's row,
        together: from then on it is listed and may be decided."""
        await self._run(
            lambda tx: approvals.ask(
                self, tx, lease, events, step_id, attempt, name, data, deadline
            )
        )

    async def get_approval(self, run_id: str, step_id: str) -> Approval | None:
        """The approval asked by step ``step_id`` of the run."""
        return await self._read(lambda tx: approvals.get(tx, run_id, step_id))

    async def expire_approval(self, lease: Lease, step_id: str, attempt: int) -> Approval:
        """The holder found the approval's deadline past: mark it expired, unless a
        decision landed first. Returns the row as it ends (expired, or decided)."""
        return await self._run(lambda tx: approvals.expire(self, tx, lease, step_id, attempt))

    async def decide_approval(
        self,
        run_id: str,
        step: str,
        approved: bool,
        by: str,
        comment: str | None,
        note: str | None = None,
        grant: dict[str, Any] | None = None,
    ) -> Approval:
        """Record a person's decision on a pending approval (``step``: its step id, or its
        name when that picks one) and wake the run; ``note``: a name the client gave
        beside the decider ``by``. Refused, with nothing written, for an unknown run or
        approval, one already decided (:class:`ApprovalAlreadyDecided`), timed out, or of
        a finished run (:class:`ApprovalNotPending`). ``grant`` (checked by the caller):
        for a guard's pause of a limit, the limits approving it moves (see
        :func:`ratchet.store.approvals.granting`)."""
        return await self._run(
            lambda tx: approvals.decide(self, tx, run_id, step, approved, by, comment, note, grant)
        )

    async def pending_approvals(
        self, run_id: str | None = None, limit: int = 100
    ) -> list[Approval]:
        """Pending approvals of unfinished runs, oldest first; with ``run_id``, those of
        that run and of the runs under it."""
        params = {"run_id": run_id, "limit": limit}
        rows = await self._read(lambda tx: tx.all("approvals_pending", params))
        return [approvals.approval_from_row(r) for r in rows]

    async def park(
        self, lease: Lease, events: Sequence[Event], waits: Sequence[str], not_before: float | None
    ) -> tuple[str, list[str]]:
        """Append ``events``, set the run ``waiting`` and release the lease, unless some of
        ``waits`` (``signal:NAME``, ``child:RUN``, ``approval:STEP``, or timers) is already
        satisfied. Returns ``("parked", [])``, ``("ready", satisfied)`` (keep driving;
        events still appended) or ``("cancel", [])`` (a cancel is pending). Several waits
        park the run as ``any:[...]``: whichever arrives first wakes it."""

        def body(tx: Tx) -> tuple[str, list[str]]:
            # Locked before the condition is read: a signal, child or cancel committing
            # concurrently either is seen below or sees this run already waiting. (Every
            # transaction that locks both takes the runs row before the run_locks row.)
            row = tx.one("run_get_locked", {"run_id": lease.run_id})
            self._check_lease(tx, lease)
            self._insert_events(tx, events)
            if row["cancel_requested"]:
                return "cancel", []
            ready = [w for w in waits if self._wait_satisfied(tx, lease.run_id, w)]
            if ready:
                return "ready", ready
            waiting_for = waits[0] if len(set(waits)) == 1 else "any:" + dumps(sorted(set(waits)))
            tx.send(
                "run_park",
                {"run_id": lease.run_id, "waiting_for": waiting_for, "not_before": not_before},
            )
            tx.send(
                "lease_release",
                {"run_id": lease.run_id, "worker_id": lease.worker_id, "epoch": lease.epoch},
            )
            if not_before is not None:
                self._announce(tx, READY)
            return "parked", []

        return await self._run(body)

    @staticmethod
    def _wait_satisfied(tx: Tx, run_id: str, waiting_for: str) -> bool:
        kind, _, name = waiting_for.partition(":")
        if kind == "signal":
            return tx.one("signal_pending", {"run_id": run_id, "name": name}) is not None
        if kind == "child":
            child = tx.one("run_get", {"run_id": name})
            return child is not None and RunStatus(child["status"]).terminal
        if kind == "approval":
            found = approvals.get(tx, run_id, name)
            return found is not None and found.status != "pending"
        return False  # timers: the claim takes the run when not_before comes

    async def hand_back(self, lease: Lease, events: Sequence[Event]) -> None:
        """A drive stopped for a shutdown: append its last events, queue the run again and
        release the lease, so any worker can take it at once."""

        def body(tx: Tx) -> None:
            tx.one("run_get_locked", {"run_id": lease.run_id})
            self._check_lease(tx, lease)
            self._insert_events(tx, events)
            if tx.run("run_hand_back", {"run_id": lease.run_id}):
                self._announce(tx, READY)
            tx.send(
                "lease_release",
                {"run_id": lease.run_id, "worker_id": lease.worker_id, "epoch": lease.epoch},
            )

        await self._run(body)

    async def finish(
        self,
        lease: Lease,
        events: Sequence[Event],
        status: RunStatus,
        output: Any = None,
        error: str | None = None,
        dead_letter: str | None = None,
        receipt: dict[str, Any] | None = None,
    ) -> None:
        """Append the terminal events and set the terminal status, once: the guarded
        update lets exactly one finisher through; any other gets RunFinished and its
        events roll back. A child's end wakes its waiting parent in the same commit.
        ``receipt`` (:func:`ratchet.store.retention.receipt_params`): the run's signed
        receipt, stored in the same commit, so a run never ends without one."""

        def body(tx: Tx) -> None:
            # Runs rows first (the lock order every transaction follows: a parent's, then
            # the run's, then the lease); the guarded update goes before the events so a
            # second finisher is told RunFinished rather than tripping over the first one's
            # sequence numbers.
            self._locked_run_and_parent(tx, lease.run_id)
            self._check_lease(tx, lease)
            params = {
                "run_id": lease.run_id,
                "status": str(status),
                "output": dumps(output) if output is not None else None,
                "error": error,
            }
            if tx.run("run_finish", params) != 1:
                raise RunFinished(f"run {lease.run_id} has already finished")
            self._insert_events(tx, events)
            if receipt is not None:
                retention.put_receipt_in(tx, receipt)
            if dead_letter:
                tx.send(
                    "dead_letter_put",
                    {"run_id": lease.run_id, "reason": dead_letter, "error": error or ""},
                )
            self._ended(tx, lease.run_id)
            rec = record_from_row(tx.one("run_get", {"run_id": lease.run_id}))
            if rec.parent_run_id and tx.run(
                "run_wake", {"run_id": rec.parent_run_id, "waiting_for": f"child:{rec.run_id}"}
            ):
                self._announce(tx, READY)
            self._cancel_children(tx, lease.run_id)

        await self._run(body)

    async def claim_receipt(
        self, lease: Lease, key: str, step_id: str, *, delivery: str, attempt: int
    ) -> Receipt | None:
        """Claim delivery ``delivery`` of the step before dispatch, under ``key`` (the one
        ``attempt`` derives for it). None: newly claimed, dispatch. Otherwise the receipt an
        earlier attempt or drive left for this delivery, with the key it was sent under
        (settled: reuse its response; failed: settled by hand as not delivered; claimed: a
        crash or a failed dispatch left it, and the delivery's policy decides)."""

        def body(tx: Tx) -> Receipt | None:
            self._check_lease(tx, lease)
            params = {
                "key": key,
                "run_id": lease.run_id,
                "step_id": step_id,
                "delivery": delivery,
                "attempt": attempt,
                "epoch": lease.epoch,
            }
            if tx.run("receipt_claim", params) == 1:
                return None
            # A receipt from before deliveries had identities carries only its key.
            row = tx.one(
                "receipt_find", {"run_id": lease.run_id, "step_id": step_id, "delivery": delivery}
            ) or tx.one("receipt_get", {"key": key})
            if row is None:
                raise StoreConflict(
                    f"receipt {key} of run {lease.run_id} step {step_id} "
                    "conflicted on insert but cannot be read back"
                )
            return _receipt(row)

        return await self._run(body)

    async def reclaim_receipt(self, lease: Lease, key: str) -> None:
        """Re-claim a receipt left claimed, for a resend under the same key."""

        def body(tx: Tx) -> None:
            self._check_lease(tx, lease)
            tx.send("receipt_reclaim", {"key": key, "epoch": lease.epoch})

        await self._run(body)

    async def settle_receipt(self, lease: Lease, key: str, response: Any) -> None:
        """Record the delivery's response, under the lease that dispatched it."""

        def body(tx: Tx) -> None:
            self._check_lease(tx, lease)
            tx.send(
                "receipt_settle", {"key": key, "response": dumps(response), "epoch": lease.epoch}
            )

        await self._run(body)

    def _ended(self, tx: Tx, run_id: str) -> None:
        """In the transaction that set a run's terminal status (run_finish, which keeps
        the lease's epoch on the run): drop the rows a finished run no longer needs (its
        lease, its consumed signals; receipts stay, they are evidence) and announce it."""
        tx.send("lease_drop", {"run_id": run_id})
        tx.send("signals_drop_consumed", {"run_id": run_id})
        self._announce(tx, DONE, run_id)

    async def resolve_receipt(
        self, key: str, response: Any = None, failed: bool = False
    ) -> Receipt:
        """Settle a claimed receipt by hand (a person who found out what happened): with
        the receiver's ``response``, or as ``failed`` (it did not happen). Refused for an
        unknown key, a receipt already settled, and while a worker holds the run's lease
        (its drive may be dispatching this very delivery)."""

        def body(tx: Tx) -> Receipt:
            row = tx.one("receipt_get", {"key": key})
            if row is None:
                raise UnknownReceipt(f"unknown receipt key {key!r}")
            run_id = row["run_id"]
            # The run's row, then its lease row, as every transaction locks them: a worker
            # claiming or settling under the lease waits for this one, or this one sees it.
            self._locked_run(tx, run_id)
            lock = tx.one("lease_row_locked", {"run_id": run_id})
            found = _receipt(tx.one("receipt_get_locked", {"key": key}))
            if found.status != "claimed":
                raise ReceiptSettled(
                    f"receipt {key} (run {run_id}, step {found.step_id}, delivery "
                    f"{found.delivery}) is already {found.status}"
                    + (" by hand" if found.settled_by == "hand" else "")
                    + "; nothing changed"
                )
            if lock is not None and lock["worker_id"] is not None and bool(lock["live"]):
                raise ReceiptBusy(
                    f"run {run_id} is being driven by worker {lock['worker_id']}, which may be "
                    f"dispatching receipt {key} right now; settle it once the run has "
                    "failed or its worker has stopped and the lease has expired"
                )
            tx.send(
                "receipt_resolve",
                {
                    "key": key,
                    "status": "failed" if failed else "settled",
                    "response": None if failed else dumps(response),
                },
            )
            return _receipt(tx.one("receipt_get", {"key": key}))

        return await self._run(body)

    # -- writes from outside the run (API, CLI) --------------------------------------------

    def _locked_run(self, tx: Tx, run_id: str) -> RunRecord:
        row = tx.one("run_get_locked", {"run_id": run_id})
        if row is None:
            raise UnknownRun(f"unknown run id {run_id!r}")
        return record_from_row(row)

    def _locked_run_and_parent(self, tx: Tx, run_id: str) -> RunRecord:
        """Lock a run's row, after its parent's when it has one. A run ending wakes its
        parent; the parent parks holding its own row lock while it reads the child's status.
        Holding the parent's row across the child's end makes the two take turns: either the
        parent sees the child ended, or the end sees the parent waiting and wakes it."""
        row = tx.one("run_get", {"run_id": run_id})
        if row is None:
            raise UnknownRun(f"unknown run id {run_id!r}")
        parent = record_from_row(row).parent_run_id
        if parent is not None:
            tx.one("run_get_locked", {"run_id": parent})  # ancestors before descendants
        return self._locked_run(tx, run_id)

    async def send_signal(self, run_id: str, name: str, payload: Any) -> RunRecord:
        """Deliver a signal; wakes the run if it waits for this signal."""

        def body(tx: Tx) -> RunRecord:
            rec = self._locked_run(tx, run_id)
            if rec.status.terminal:
                raise RunFinished(f"run {run_id} has already {rec.status}; signal {name!r} refused")
            tx.send("signal_insert", {"run_id": run_id, "name": name, "payload": dumps(payload)})
            if tx.run("run_wake", {"run_id": run_id, "waiting_for": f"signal:{name}"}):
                self._announce(tx, READY)
            return rec

        return await self._run(body)

    async def cancel(self, run_id: str) -> RunStatus:
        """Cancel a run and its unfinished children. Unowned (queued, waiting): cancelled
        here and now, fencing any expired holder. Owned by a live worker: flagged, and that
        worker finishes it."""

        def body(tx: Tx) -> RunStatus:
            rec = self._locked_run_and_parent(tx, run_id)
            return self._cancel_locked(tx, rec)

        return await self._run(body)

    def _cancel_locked(self, tx: Tx, rec: RunRecord) -> RunStatus:
        """Cancel ``rec`` (its row locked, after its parent's) and then its children."""
        run_id = rec.run_id
        if rec.status.terminal:
            return rec.status
        lock = tx.one("lease_row_locked", {"run_id": run_id})
        if lock is not None and lock["worker_id"] is not None and bool(lock["live"]):
            # Its worker finishes it, and its children with it (see finish).
            tx.send("run_cancel_request", {"run_id": run_id})
            self._announce(tx, CANCEL, run_id)
            return rec.status
        # The lease row (locked above, so in-flight appends have landed) goes with the
        # run's end: an expired holder finds no lease to write under.
        self._append_unowned(tx, run_id, EventKind.RUN_CANCELLED, {"by": "request"})
        tx.send(
            "run_finish",
            {"run_id": run_id, "status": "cancelled", "output": None, "error": "cancelled"},
        )
        self._ended(tx, run_id)
        if rec.parent_run_id and tx.run(
            "run_wake", {"run_id": rec.parent_run_id, "waiting_for": f"child:{run_id}"}
        ):
            self._announce(tx, READY)
        self._cancel_children(tx, run_id)
        return RunStatus.CANCELLED

    def _cancel_children(self, tx: Tx, run_id: str) -> None:
        """A run ended: its unfinished children (and theirs) are cancelled with it. Their
        rows are locked after the parent's, the order every transaction follows."""
        for row in tx.all("runs_children_active", {"run_id": run_id}):
            self._cancel_locked(tx, self._locked_run(tx, row["run_id"]))

    async def retry_dead(
        self, run_id: str, grant: dict[str, Any] | None = None, by: str | None = None
    ) -> RunRecord:
        """Re-queue a dead-lettered run; it resumes after its last completed step, with its
        limits as they were unless ``grant`` (checked by the caller) moves some; ``by``,
        who retried it, is journaled in the ``run_queued`` event with the grant."""

        def body(tx: Tx) -> RunRecord:
            rec = self._locked_run(tx, run_id)
            if (
                rec.status != RunStatus.FAILED
                or tx.run("dead_letter_delete", {"run_id": run_id}) != 1
            ):
                raise NotDeadLettered(f"run {run_id} is {rec.status}, not dead-lettered")
            tx.one("lease_row_locked", {"run_id": run_id})
            payload: dict[str, Any] = {"reason": "retry"}
            if by is not None:
                payload["by"] = by
            if grant is not None:
                payload["grant"] = grant
            self._append_unowned(tx, run_id, EventKind.RUN_QUEUED, payload)
            tx.send("run_requeue", {"run_id": run_id})
            self._announce(tx, READY)
            return record_from_row(tx.one("run_get", {"run_id": run_id}))

        return await self._run(body)
