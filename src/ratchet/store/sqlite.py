"""The embedded SQLite store: one file, WAL mode, ``synchronous=FULL`` by default.

One connection and one writer thread per store. Transactions queued while the thread is
busy are committed together (group commit): each runs inside its own SAVEPOINT, so one
failing (a lost lease, say) rolls back only itself, and every caller is answered only
after the shared COMMIT, so nothing is acknowledged before it is durable. Several
processes may share the file: BEGIN IMMEDIATE plus a busy timeout serialises them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ratchet.errors import ConfigError, StorageError
from ratchet.model import dumps
from ratchet.store.base import DONE, Clock, Store, Tx
from ratchet.store.queries import load_migrations, load_queries

T = TypeVar("T")
log = logging.getLogger("ratchet.store")

_BATCH_MAX = 256
FINISH_POLL_S = 0.05
_Item = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class SqliteStore(Store):
    dialect = "sqlite"

    def __init__(self, path: str, clock: Clock | None = None, synchronous: str | None = None,
                 busy_timeout_s: float = 60.0) -> None:
        super().__init__(clock)
        self.path = path
        self.queries = load_queries("sqlite")
        sync = (synchronous or os.environ.get("RATCHET_SQLITE_SYNCHRONOUS") or "FULL").upper()
        if sync not in ("FULL", "NORMAL", "EXTRA"):
            raise ConfigError(
                f"RATCHET_SQLITE_SYNCHRONOUS={sync!r}: expected FULL, NORMAL or EXTRA")
        self.synchronous = sync
        self._busy_timeout_s = busy_timeout_s
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._finish_poller: asyncio.Task[None] | None = None
        # Reads go to a connection of their own on a thread of their own: WAL lets them
        # proceed beside the writer, which then spends its time on commits.
        self._reader: ThreadPoolExecutor | None = None
        self._reader_conn: sqlite3.Connection | None = None
        self._conn: sqlite3.Connection | None = None

    # -- connection ------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=self._busy_timeout_s)
        except (OSError, sqlite3.Error) as e:
            raise StorageError(f"cannot open SQLite database {self.path!r}: {e}") from e
        clock = self.clock
        conn.create_function("ratchet_now", 0, lambda: time.time() + clock.offset)
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
            for version, name, sql in load_migrations("sqlite"):
                if version in done:
                    continue
                for statement in _statements(sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)",
                             (version, name, time.time()))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def open(self) -> None:
        if self._thread is not None:
            return
        conn = await asyncio.to_thread(self._connect)
        try:
            await asyncio.to_thread(self._migrate, conn)
        except sqlite3.Error as e:
            conn.close()
            raise StorageError(f"cannot migrate SQLite database {self.path!r}: {e}") from e
        self._conn = conn
        self._thread = threading.Thread(target=self._writer, name="ratchet-sqlite", daemon=True)
        self._thread.start()
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="ratchet-sqlite-read")

    async def close(self) -> None:
        poller, self._finish_poller = self._finish_poller, None
        if poller is not None and not poller.done():
            if poller.get_loop() is asyncio.get_running_loop():
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
            elif not poller.get_loop().is_closed():
                poller.get_loop().call_soon_threadsafe(poller.cancel)
        if self._thread is None:
            return
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        if self._reader is not None:
            reader, self._reader = self._reader, None
            if self._reader_conn is not None:
                conn, self._reader_conn = self._reader_conn, None
                await asyncio.get_running_loop().run_in_executor(reader, conn.close)
            reader.shutdown(wait=True)

    # -- transactions ----------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._thread is None:
            raise StorageError("store is not open")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.put((fn, args, loop, fut))
        return await fut

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        if self._reader is None:
            raise StorageError("store is not open")
        return await asyncio.get_running_loop().run_in_executor(self._reader, self._read_now,
                                                                fn, args)

    def _read_now(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        if self._reader_conn is None:
            self._reader_conn = self._connect()
        conn = self._reader_conn
        try:
            conn.execute("BEGIN")  # one snapshot for every statement of the read
            try:
                return fn(Tx(conn.cursor(), self.queries), *args)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as e:
            raise StorageError(f"SQLite: {e}") from e

    def _writer(self) -> None:
        assert self._conn is not None
        conn = self._conn
        cur = conn.cursor()
        while True:
            first = self._queue.get()
            if first is None:
                conn.close()
                return
            batch = [first]
            stop = False
            while len(batch) < _BATCH_MAX:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._commit_batch(conn, cur, batch)
            if stop:
                conn.close()
                return

    def _commit_batch(self, conn: sqlite3.Connection, cur: sqlite3.Cursor,
                      batch: list[_Item]) -> None:
        results: list[tuple[bool, Any]] = []
        after: list[Callable[[], None]] = []
        single = len(batch) == 1
        try:
            cur.execute("BEGIN IMMEDIATE")
            for fn, args, _, _ in batch:
                tx = Tx(cur, self.queries)
                if not single:
                    cur.execute("SAVEPOINT op")
                try:
                    value = fn(tx, *args)
                except BaseException as e:  # LeaseLost is a BaseException, and must roll back
                    if single:
                        raise
                    cur.execute("ROLLBACK TO op")
                    cur.execute("RELEASE op")
                    results.append((False, _translate(e)))
                else:
                    if not single:
                        cur.execute("RELEASE op")
                    results.append((True, value))
                    after.extend(tx.after_commit)
            cur.execute("COMMIT")
        except BaseException as e:
            if conn.in_transaction:
                try:
                    cur.execute("ROLLBACK")
                except sqlite3.Error:
                    log.exception("action=rollback_failed")
            err = _translate(e)
            results = [(False, err)] * len(batch)
            after = []
        for (_, _, loop, fut), (ok, value) in zip(batch, results, strict=True):
            loop.call_soon_threadsafe(_resolve, fut, ok, value)
        for hook in after:
            hook()

    # -- dialect hooks ---------------------------------------------------------------------

    def _ids(self, ids: Sequence[str]) -> Any:
        return dumps(list(ids))

    def _announce(self, tx: Tx, channel: str, key: str = "") -> None:
        # Waiters in this process wake at once; for other processes, see _watch_finishes.
        tx.after_commit.append(lambda: self._wake(channel, key))

    def _watch_finishes(self, loop: asyncio.AbstractEventLoop) -> None:
        # Workers in other processes finish runs without telling this one: one poller per
        # store asks, for all awaited runs at once, which have finished.
        if self._finish_poller is None or self._finish_poller.done():
            self._finish_poller = loop.create_task(self._poll_finishes())

    async def _poll_finishes(self) -> None:
        while True:
            await asyncio.sleep(FINISH_POLL_S)
            awaited = self._awaited_runs()
            if not awaited:
                return
            for run_id in await self.finished_among(awaited):
                self._wake(DONE, run_id)

    async def now(self) -> float:
        # ratchet_now() in SQL reads this same clock; no round trip needed.
        return time.time() + self.clock.offset


def _resolve(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


def _translate(e: BaseException) -> BaseException:
    if isinstance(e, sqlite3.Error):
        err = StorageError(f"SQLite: {e}")
        err.__cause__ = e
        return err
    return e


def _statements(sql: str) -> list[str]:
    """Split a migration file into statements (no semicolons inside our DDL's bodies)."""
    out, buf = [], []
    for line in sql.splitlines():
        if line.strip().startswith("--"):
            continue
        buf.append(line)
        if line.rstrip().endswith(";"):
            out.append("\n".join(buf))
            buf = []
    if "".join(buf).strip():
        out.append("\n".join(buf))
    return out
