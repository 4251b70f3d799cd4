"""The PostgreSQL store: many workers on many machines, one database as the coordinator.

Transactions run on psycopg's pooled connections in a thread pool sized to the connection
pool, so the asyncio engine never blocks on the network. Idle workers wait on
``LISTEN ratchet_ready``; every transaction that makes a run ready sends ``NOTIFY`` in the
same commit, and workers still poll as a fallback for a lost notification.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

import psycopg
import psycopg_pool
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import AdaptersMap, Loader
from psycopg.pq import Format
from psycopg.types.string import TextLoader

from ratchet.errors import LeaseLost, StorageError, StoreConflict, ValueRefused, WorkerIdInUse
from ratchet.model import (
    GENESIS_HASH,
    ClaimedRun,
    ClaimReason,
    Event,
    EventKind,
    Lease,
    NewRun,
    RunRecord,
    dumps,
)
from ratchet.store import queues as queue_limits
from ratchet.store.base import Store
from ratchet.store.leases import TIMER_BATCH, take
from ratchet.store.pg_liveness import SERVER_SETTLE_S, LivenessSession
from ratchet.store.queries import load_migrations, load_queries
from ratchet.store.rows import record_from_row
from ratchet.store.runs import queued_payload
from ratchet.store.transaction import Clock, Tx, firm_future, settled

T = TypeVar("T")
log = logging.getLogger("ratchet.store")


CONNECT_TIMEOUT_S = 5


def _one_line(e: BaseException) -> str:
    """psycopg's message on one line (the server's own words, without its indentation)."""
    return " ".join(str(e).split()) or type(e).__name__


class _EpochLoader(Loader):
    """timestamptz as Unix seconds (a float), the engine's unit of time everywhere: the
    datetime psycopg reads, as seconds since the epoch (exact to the microsecond)."""

    _datetime = psycopg.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, Format.TEXT)

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        assert self._datetime is not None
        self._load = self._datetime(oid, context).load

    def load(self, data: Buffer) -> float:
        return float(self._load(data).timestamp())


class _Adapters:
    """How Ratchet's connections read values: jsonb as its text (the store parses it, as it
    does SQLite's), timestamptz as Unix seconds. Other users of psycopg are not affected."""

    connection = None
    adapters = AdaptersMap(psycopg.adapters)
    adapters.register_loader("jsonb", TextLoader)
    adapters.register_loader("timestamptz", _EpochLoader)


class Row(tuple[Any, ...]):
    """A row readable by position or by column name (``row["run_id"]``), like sqlite3.Row."""

    __slots__ = ()
    _index: ClassVar[dict[str, int]] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            key = self._index[key]
        return tuple.__getitem__(self, key)


_row_classes: dict[tuple[str, ...], type[Row]] = {}


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    """psycopg row factory: one Row subclass per column-name tuple, made once."""
    names = tuple(c.name for c in cursor.description or ())
    cls = _row_classes.get(names)
    if cls is None:
        cls = type("Row", (Row,), {"__slots__": (), "_index": {n: i for i, n in enumerate(names)}})
        _row_classes[names] = cls
    return cls


_Batch = list[tuple[Lease, Sequence[Event], "asyncio.Future[None]"]]


class _AppendQueue:
    """Appends waiting for the next group commit on one event loop."""

    __slots__ = ("busy", "pending", "task")

    def __init__(self) -> None:
        self.pending: _Batch = []
        self.busy = False
        self.task: asyncio.Task[None] | None = None


class PostgresStore(Store):
    dialect = "postgresql"
    sql_dialect = "postgres"
    json_text_canonical = False  # jsonb

    def __init__(
        self, url: str, clock: Clock | None = None, pool_size: int = 16, read_only: bool = False
    ) -> None:
        super().__init__(clock)
        self.url = url
        self.read_only = read_only
        self.queries = load_queries("postgres")
        self._pool_size = pool_size
        self._pool: psycopg_pool.ConnectionPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._listen_conn: psycopg.AsyncConnection[Any] | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self._channels: set[str] = set()  # the channels watched in this process
        self._appends: dict[asyncio.AbstractEventLoop, _AppendQueue] = {}
        self._append_executor = ThreadPoolExecutor(1, thread_name_prefix="ratchet-pg-append")
        self._append_conn: psycopg.Connection[Any] | None = None
        self._liveness = LivenessSession(url, self.queries)

    def _probe(self) -> None:
        """One plain connection first, so that an unreachable server or a missing database
        fails at once with the server's own words, not after the pool's retries."""
        timeout: dict[str, Any] = (
            {} if "connect_timeout" in self.url else {"connect_timeout": CONNECT_TIMEOUT_S}
        )
        try:
            with psycopg.connect(self.url, autocommit=True, **timeout) as conn:
                if not self.read_only:
                    return
                row = conn.execute("SELECT to_regclass('schema_migrations')").fetchone()
                if row is None or row[0] is None:
                    raise StorageError(
                        "no Ratchet tables in this PostgreSQL database "
                        "(nothing has run against it yet?)"
                    )
        except psycopg.Error as e:
            raise StorageError(f"cannot connect to PostgreSQL: {_one_line(e)}") from e

    async def open(self) -> None:
        if self._pool is not None:
            return
        await asyncio.to_thread(self._probe)
        pool = psycopg_pool.ConnectionPool(
            self.url,
            min_size=1,
            max_size=self._pool_size,
            open=False,
            # Autocommit: a single statement is its own transaction (one round trip);
            # multi-statement bodies open one explicitly with conn.transaction().
            kwargs={"autocommit": True, "row_factory": _row_factory, "context": _Adapters},
            name="ratchet",
        )
        try:
            await asyncio.to_thread(pool.open, True, 10.0)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            await asyncio.to_thread(pool.close)
            raise StorageError(f"cannot connect to PostgreSQL: {e}") from e
        self._pool = pool
        self._executor = ThreadPoolExecutor(self._pool_size, thread_name_prefix="ratchet-pg")
        if not self.read_only:
            # The appends' own connection, opened while the migrations are checked: a
            # restarted worker's first step boundary does not wait for it.
            with contextlib.suppress(RuntimeError):  # a store closed before: no appends
                self._append_executor.submit(self._open_append_conn)
        await self._loop_run(self._migrate)

    async def close(self) -> None:
        task, self._listen_task = self._listen_task, None
        if task is not None:
            if task.get_loop() is asyncio.get_running_loop():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            elif not task.done() and not task.get_loop().is_closed():
                # Listening on another thread's loop: stop it there.
                task.get_loop().call_soon_threadsafe(task.cancel)
        if self._listen_conn is not None:
            with contextlib.suppress(Exception):
                await self._listen_conn.close()
            self._listen_conn = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._append_executor.shutdown(wait=True)
        with contextlib.suppress(RuntimeError):  # closed before
            await asyncio.wrap_future(self._liveness.executor.submit(self._liveness.close))
        self._liveness.executor.shutdown(wait=True)
        if self._append_conn is not None:
            self._append_conn.close()
            self._append_conn = None
        if self._pool is not None:
            await asyncio.to_thread(self._pool.close)
            self._pool = None

    def _migrate(self) -> None:
        assert self._pool is not None
        migrations = load_migrations("postgres")
        with self._checkout() as conn:
            if self._applied(conn) >= {version for version, _, _ in migrations}:
                return  # nothing to do: a start takes no lock and writes no DDL
        with self._checkout() as conn, conn.transaction():
            # One migrator at a time across every process starting against this database.
            conn.execute(self.queries["migrations_lock"])
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version integer PRIMARY KEY, name text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
            for version, name, sql in migrations:
                if version in done:
                    continue
                conn.execute(sql.encode())
                conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name)
                )

    def _applied(self, conn: psycopg.Connection[Any]) -> set[int]:
        """The migrations applied in the store's schema (none when it has no tables)."""
        try:
            return {r[0] for r in conn.execute(self.queries["migrations_applied"])}
        except psycopg.errors.UndefinedTable:
            return set()

    async def _loop_run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        if self._executor is None:
            raise StorageError("store is not open")
        fut: asyncio.Future[T] = firm_future(loop)

        def answer(done: concurrent.futures.Future[T]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_copy_outcome, done, fut)

        self._executor.submit(fn).add_done_callback(answer)
        try:
            return await settled(fut)
        except psycopg.Error as e:
            raise _translate(e) from e

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._pool is None:
            raise StorageError("store is not open")
        return await self._loop_run(lambda: self._tx(fn, args))

    def _checkout(self) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]:
        assert self._pool is not None
        return self._pool.connection()

    def _sync_clock(self, conn: psycopg.Connection[Any]) -> None:
        skew = self.clock.offset
        if getattr(conn, "_ratchet_skew", 0.0) != skew:
            conn.execute("SELECT set_config('ratchet.skew', %s, false)", (repr(skew),))
            conn._ratchet_skew = skew  # type: ignore[attr-defined]

    def _tx(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        with self._checkout() as conn:
            self._sync_clock(conn)
            # Pipeline mode: statements whose results the body does not read before the
            # next one travel together, so a transaction costs fewer round trips.
            with conn.pipeline() as pipeline, conn.transaction(), conn.cursor() as cur:
                return fn(Tx(cur, self.queries, pipeline.sync), *args)

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        if self._pool is None:
            raise StorageError("store is not open")

        def read() -> T:
            # Autocommit: a one-statement read is one round trip, no BEGIN/COMMIT.
            with self._checkout() as conn:
                self._sync_clock(conn)
                with conn.cursor() as cur:
                    return fn(Tx(cur, self.queries), *args)

        return await self._loop_run(read)

    async def _create(self, new: NewRun) -> tuple[RunRecord, bool]:
        ev = Event.chain(
            new.run_id,
            1,
            EventKind.RUN_QUEUED,
            None,
            None,
            queued_payload(new),
            time.time(),
            GENESIS_HASH,
        )
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
            "tags": dumps(new.tags),
            "concurrency_key": new.concurrency_key,
            "payload": ev.payload_json,
            "at": ev.at,
            "prev_hash": ev.prev_hash,
            "hash": ev.hash,
        }
        rows = await self._statement(self.queries["create_run"], params, fetch=True)
        if not rows:
            # A concurrent start inserted this run id after the statement's snapshot was
            # taken: the insert waited for it and did nothing, and the fallback read could
            # not see it. It has committed now, so a fresh statement sees it.
            rows = await self._read(lambda tx: [tx.one("run_get", {"run_id": new.run_id})])
            if rows[0] is None:
                raise StorageError(f"run {new.run_id} was neither created nor found")
            return record_from_row(rows[0]), False
        return record_from_row(rows[0]), bool(rows[0]["created"])

    def _insert_batch(
        self, tx: Tx, runs: list[dict[str, Any]], events: list[dict[str, Any]]
    ) -> list[str]:
        # One statement for the whole batch: a row per run in each array.
        params = {
            "run_ids": [r["run_id"] for r in runs],
            "workflows": [r["workflow"] for r in runs],
            "versions": [r["workflow_version"] for r in runs],
            "inputs": [r["input"] for r in runs],
            "queues": [r["queue"] for r in runs],
            "priorities": [r["priority"] for r in runs],
            "tenants": [r["tenant_id"] for r in runs],
            "tags": [r["tags"] for r in runs],
            "keys": [r["concurrency_key"] for r in runs],
            "payloads": [e["payload"] for e in events],
            "ats": [e["at"] for e in events],
            "hashes": [e["hash"] for e in events],
            "genesis": GENESIS_HASH,
        }
        return [row["run_id"] for row in tx.all("create_runs", params)]

    async def claim(
        self,
        worker_id: str,
        ttl: float,
        limit: int,
        queues: Sequence[str],
        served: Collection[tuple[str, str]],
    ) -> list[ClaimedRun]:
        # Two statements in one round trip: due timers become queued (their own
        # statement, along runs_timers), then the claim reads runs_queued alone.
        params = {
            "queues": list(dict.fromkeys(queues)),
            "limit": limit,
            "worker_id": worker_id,
            "ttl": ttl,
            **self._served(served),
        }
        timers = {"limit": TIMER_BATCH}

        limited_params = {"queues": params["queues"]}

        def statement() -> tuple[list[Any], list[Any]]:
            with self._checkout() as conn:
                self._sync_clock(conn)
                with conn.pipeline():
                    conn.execute(self.queries["timers_due"], timers)
                    cur = conn.execute(self.queries["claim_ready"], params)
                    limited = conn.execute(self.queries["queues_limited"], limited_params)
                return cur.fetchall(), limited.fetchall()

        rows, limited = await self._loop_run(statement)
        claimed = [
            ClaimedRun(rec, Lease(rec.run_id, worker_id, int(row["epoch"])), ClaimReason.CLAIM)
            for row in rows
            for rec in (record_from_row(row),)
        ]
        room = limit - len(claimed)
        if limited and room > 0:
            # Queues with limits: their own transaction, under their rows' locks.
            names = [r["name"] for r in limited]
            claimed += await self._run(self._claim_limited, names, worker_id, ttl, room, served)
        return claimed

    def _claim_limited(
        self,
        tx: Tx,
        names: list[str],
        worker_id: str,
        ttl: float,
        limit: int,
        served: Collection[tuple[str, str]],
    ) -> list[ClaimedRun]:
        picked = queue_limits.pick_limited(self, tx, names, limit, served)
        taken = take(self, tx, [r["run_id"] for r in picked], worker_id, ttl, "claim")
        queue_limits.mark_started(self, tx, taken)
        return taken

    async def _statement(self, sql: str, params: dict[str, Any], fetch: bool = False) -> Any:
        """One statement outside an explicit transaction: its own commit, one round trip.
        Returns the rows (``fetch``) or the affected row count."""

        def statement() -> Any:
            with self._checkout() as conn:
                self._sync_clock(conn)
                cur = conn.execute(sql, params)
                return cur.fetchall() if fetch else cur.rowcount

        return await self._loop_run(statement)

    async def append(self, lease: Lease, events: Sequence[Event]) -> None:
        """Group commit: appends requested while another is in flight on this loop wait
        and go together in the next statement; each is answered after that commit."""
        if not events:
            return await super().append(lease, events)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = firm_future(loop)
        queue = self._appends.setdefault(loop, _AppendQueue())
        queue.pending.append((lease, events, fut))
        if not queue.busy:
            queue.busy = True
            queue.task = loop.create_task(self._drain_appends(queue))
        return await settled(fut)

    def _open_append_conn(self) -> None:
        """Open the appends' connection ahead of the first append (on their thread); a
        failure here is left for that append to meet and report."""
        if self._append_conn is None or self._append_conn.closed:
            with contextlib.suppress(psycopg.Error):
                self._append_conn = psycopg.connect(
                    self.url, autocommit=True, row_factory=_row_factory, context=_Adapters
                )

    def _append_now(self, events: str) -> list[Any]:
        # The group commits have a connection and a thread of their own, so they never
        # queue behind other transactions for a pooled connection.
        try:
            if self._append_conn is None or self._append_conn.closed:
                self._append_conn = psycopg.connect(
                    self.url, autocommit=True, row_factory=_row_factory, context=_Adapters
                )
            conn = self._append_conn
            self._sync_clock(conn)
            return conn.execute(self.queries["append_events"], {"events": events}).fetchall()
        except psycopg.Error as e:
            if self._append_conn is not None and self._append_conn.broken:
                self._append_conn = None
            raise _translate(e) from e

    async def _drain_appends(self, queue: _AppendQueue) -> None:
        try:
            while queue.pending:
                batch, queue.pending = queue.pending, []
                try:
                    await self._append_batch(batch)
                except Exception as e:
                    if len(batch) == 1:
                        _fail(batch, e)
                        continue
                    # One bad run (a value the database refuses, say) must not fail the
                    # others: append each run's events on its own, so it fails alone.
                    for item in batch:
                        try:
                            await self._append_batch([item])
                        except Exception as e:
                            _fail([item], e)
        finally:
            queue.busy = False

    async def _append_batch(self, batch: _Batch) -> None:
        """Append ``batch`` in one statement and answer each append (done, or LeaseLost);
        a failed statement raises and answers none."""
        rows = [
            [
                lease.run_id,
                lease.worker_id,
                lease.epoch,
                e.seq,
                e.kind,
                e.step_id,
                e.attempt,
                e.payload_json or dumps(e.payload),
                e.at,
                e.prev_hash,
                e.hash,
            ]
            for lease, events, _ in batch
            for e in events
        ]
        # Strings as they are (UTF-8, as psycopg sends text), numbers in their shortest
        # exact form, which PostgreSQL reads back to the same float.
        text = json.dumps(rows, ensure_ascii=False, separators=(",", ":"))
        landed_rows = await asyncio.get_running_loop().run_in_executor(
            self._append_executor, self._append_now, text
        )
        landed = Counter(row[0] for row in landed_rows)
        for lease, events, fut in batch:
            if fut.done():
                continue
            if landed[lease.run_id] == len(events):
                fut.set_result(None)
            else:
                fut.set_exception(LeaseLost(lease.run_id))

    # -- dialect hooks ---------------------------------------------------------------------

    def _dead(self, tx: Tx, worker_id: str) -> list[str]:
        params = {"worker_id": worker_id, "settle": SERVER_SETTLE_S}
        return [r["worker_id"] for r in tx.all("workers_dead", params)]

    async def _on_liveness(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._liveness.executor, fn, *args)
        except psycopg.Error as e:
            raise _translate(e) from e

    async def _hold(self, worker_id: str) -> bool:
        return await self._on_liveness(self._liveness.hold, worker_id)

    async def _release(self, worker_id: str) -> None:
        with contextlib.suppress(RuntimeError):  # closed: the session, and its locks, went
            await self._on_liveness(self._liveness.release, worker_id)

    async def _look(self, fn: Callable[..., T], *args: Any) -> T | None:
        lost = await self._on_liveness(self._liveness.check)
        if lost:
            raise WorkerIdInUse(
                f"worker id {lost[0]!r} was taken by another live worker while this "
                "one's database session was lost"
            )
        if time.monotonic() < self._liveness.settle_until:
            return None
        return await self._read(fn, *args)

    def _ids(self, ids: Sequence[str]) -> Any:
        return list(ids)

    def _served(self, served: Collection[tuple[str, str]]) -> dict[str, Any]:
        pairs = list(served)
        return {"served_workflows": [w for w, _ in pairs], "served_versions": [v for _, v in pairs]}

    def _announce(self, tx: Tx, channel: str, key: str = "") -> None:
        tx.one("notify", {"channel": channel, "key": key})

    def _journaled(self, tx: Tx, run_id: str) -> None:
        return  # journal_events_notify (migration 008) notifies in every appending commit

    def _listen(self, channel: str) -> None:
        # Only the channels someone in this process watches: a worker that follows no
        # journal is not sent a notification for every event every run appends.
        task = self._listen_task
        if channel in self._channels and task is not None and not task.done():
            return
        self._channels.add(channel)
        if task is not None and not task.done():
            # Listening already, to fewer channels: listen again, to all of them, on a new
            # connection (whose wake-up of every channel covers the switch).
            if task.get_loop() is asyncio.get_running_loop():
                task.cancel()
            elif not task.get_loop().is_closed():
                task.get_loop().call_soon_threadsafe(task.cancel)
        self._listen_task = asyncio.get_running_loop().create_task(
            self._listen_loop(task), name="ratchet-listen"
        )

    async def _listen_loop(self, previous: asyncio.Task[None] | None = None) -> None:
        if previous is not None and previous.get_loop() is asyncio.get_running_loop():
            await asyncio.wait([previous])  # its connection closed first
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            channels = tuple(self._channels)
            try:
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                self._listen_conn = conn
                for channel in channels:
                    await conn.execute(f"LISTEN {channel}")
                for channel in channels:  # anything may have happened while deaf
                    self.bus.wake_all(channel)
                async for note in conn.notifies():
                    self._wake(note.channel, note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("action=listen_lost error=%s", e)
                for channel in channels:
                    self.bus.wake_all(channel)
                await asyncio.sleep(0.5)
            finally:
                if conn is not None:
                    if self._listen_conn is conn:
                        self._listen_conn = None
                    with contextlib.suppress(Exception):
                        await conn.close()


def _fail(batch: _Batch, error: Exception) -> None:
    for _, _, fut in batch:
        if not fut.done():
            fut.set_exception(error)


def _translate(e: psycopg.Error) -> Exception:
    """A database error as Ratchet's: a refused value or a violated constraint is not
    transient (retrying gives the same answer); anything else may be (errors.py)."""
    if isinstance(e, psycopg.IntegrityError):
        return StoreConflict(f"PostgreSQL: {e}")
    if isinstance(e, psycopg.DataError):
        return ValueRefused(f"PostgreSQL: {e}")
    return StorageError(f"PostgreSQL: {e}")


def _copy_outcome(source: concurrent.futures.Future[Any], target: asyncio.Future[Any]) -> None:
    if target.done():
        return
    error = source.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())
