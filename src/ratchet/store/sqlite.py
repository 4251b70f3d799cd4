"""The embedded SQLite store: one file, WAL mode, ``synchronous=FULL`` by default.

Transactions run on the event loop that asks for them, batched: every transaction
requested during one turn of the loop is committed together at the end of that turn
(group commit). Each runs inside its own SAVEPOINT, so one failing (a lost lease, say)
rolls back only itself, and every caller is answered only after the shared COMMIT, so
nothing is acknowledged before it is durable. Running on the loop rather than on a
writer thread spares each step two thread hand-offs, which cost more than the work they
carry; the loop is held only for the commit itself, which concurrent runs share. Reads use
a second connection and see the last commit (WAL lets them proceed beside a writer).
Several processes may share the file: BEGIN IMMEDIATE serialises them. On the loop it
never waits (busy timeout 0): when another process holds the write lock, the batch moves
to a waiter thread that waits for the lock (up to the busy timeout) and commits there, so
the loop, and the lease renewals on it, keep running.

A read-only store (the CLI's listings) never creates the file or its folder, and opens
the file read-only, so it can read a database it may not write; it migrates only when the
file's schema is behind, which takes a writable file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote

from ratchet.errors import (
    ConfigError,
    StorageError,
    StoreConflict,
    StoreNotReady,
    ValueRefused,
)
from ratchet.model import dumps
from ratchet.store.base import Store
from ratchet.store.bus import DONE, EVENTS
from ratchet.store.liveness import LockFile, lock_path
from ratchet.store.queries import load_migrations, load_queries
from ratchet.store.transaction import Clock, Tx, firm_future, settled

T = TypeVar("T")
log = logging.getLogger("ratchet.store")

FINISH_POLL_S = 0.05
_Item = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]


class SqliteStore(Store):
    dialect = "sqlite"
    sql_dialect = "sqlite"

    def __init__(
        self,
        path: str,
        clock: Clock | None = None,
        synchronous: str | None = None,
        busy_timeout_s: float = 60.0,
        read_only: bool = False,
    ) -> None:
        super().__init__(clock)
        self.path = path
        self.read_only = read_only
        self.queries = load_queries("sqlite")
        sync = (synchronous or os.environ.get("RATCHET_SQLITE_SYNCHRONOUS") or "FULL").upper()
        if sync not in ("FULL", "NORMAL", "EXTRA"):
            raise ConfigError(
                f"RATCHET_SQLITE_SYNCHRONOUS={sync!r}: expected FULL, NORMAL or EXTRA"
            )
        self.synchronous = sync
        self._busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._reader_conn: sqlite3.Connection | None = None
        # A connection is used by one thread at a time (the store may serve several loops).
        self._write_lock = threading.Lock()
        # Batches waiting for another process's write lock wait on this thread, in order.
        self._waiter = ThreadPoolExecutor(1, thread_name_prefix="ratchet-sqlite-wait")
        self._waiting = 0
        self._waiting_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, list[_Item]] = {}
        self._finish_poller: asyncio.Task[None] | None = None
        self._journal_poller: asyncio.Task[None] | None = None
        # The file the connections opened, (device, inode): see check_ready.
        self._identity: tuple[int, int] | None = None
        # The workers' liveness locks, beside the database file (store/liveness.py).
        self._locks = LockFile(lock_path(path))

    # -- connection ------------------------------------------------------------------------

    def _connect(self, read_only: bool = False) -> sqlite3.Connection:
        path = os.path.abspath(self.path)
        conn: sqlite3.Connection | None = None
        try:
            if read_only:
                if not os.path.isfile(path):
                    raise StorageError(
                        f"no Ratchet database at {self.path!r}: the file does "
                        "not exist (nothing has run against it yet?)"
                    )
                conn = sqlite3.connect(
                    f"file:{quote(path)}?mode=ro",
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                    timeout=self._busy_timeout_s,
                )
            else:
                _create_private(path)
                conn = sqlite3.connect(
                    self.path,
                    isolation_level=None,
                    check_same_thread=False,
                    timeout=self._busy_timeout_s,
                )
            conn.row_factory = sqlite3.Row  # rows are read by column name
            clock = self.clock
            conn.create_function("ratchet_now", 0, lambda: time.time() + clock.offset)
            # The first statement reads the file: a file that is not SQLite fails here.
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal" and not read_only:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
            return conn
        except (OSError, sqlite3.Error) as e:
            if conn is not None:
                conn.close()
            raise StorageError(f"cannot open SQLite database {self.path!r}: {e}") from e

    def _behind(self, conn: sqlite3.Connection) -> bool:
        """Whether migrations are pending; a file without Ratchet's tables is refused."""
        try:
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        except sqlite3.Error as e:
            raise StorageError(
                f"{self.path!r} is not a Ratchet database (no schema_migrations table)"
            ) from e
        return any(version not in done for version, _, _ in load_migrations("sqlite"))

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
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, time.time())
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def open(self) -> None:
        if self._conn is not None:
            return
        read_only = self.read_only
        if read_only:
            conn = await asyncio.to_thread(self._connect, True)
            try:
                behind = await asyncio.to_thread(self._behind, conn)
            except BaseException:
                conn.close()
                raise
            if behind:  # an older file: bring it up to date, which needs it writable
                conn.close()
                read_only = False
        if not read_only:
            conn = await asyncio.to_thread(self._connect)
            try:
                await asyncio.to_thread(self._migrate, conn)
            except sqlite3.Error as e:
                conn.close()
                raise StorageError(f"cannot migrate SQLite database {self.path!r}: {e}") from e
        self._reader_conn = await asyncio.to_thread(self._connect, read_only)
        self._identity = _identity(os.stat(os.path.abspath(self.path)))
        # Writes on the loop never wait for the lock (see _flush); the waiter thread sets
        # the full busy timeout for its own attempts.
        conn.execute("PRAGMA busy_timeout=0")
        self._conn = conn

    async def close(self) -> None:
        pollers = (self._journal_poller, self._finish_poller)
        self._journal_poller = self._finish_poller = None
        for poller in pollers:
            _stop(poller)
            if poller is not None and poller.get_loop() is asyncio.get_running_loop():
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
        conn, reader = self._conn, self._reader_conn
        self._conn = self._reader_conn = None
        # Off the loop: a batch may be waiting (holding the connection) for another
        # process's write lock.
        await asyncio.to_thread(self._write_lock.acquire)
        try:
            if conn is not None:
                conn.close()
        finally:
            self._write_lock.release()
        with self._read_lock:
            if reader is not None:
                reader.close()

    # -- transactions ----------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._conn is None:
            raise StorageError("store is not open")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = firm_future(loop)
        batch = self._pending.get(loop)
        if batch is None:
            # Committed after the callbacks already queued in this turn, so transactions
            # that other runs request in the same turn share the commit.
            batch = self._pending[loop] = []
            loop.call_soon(self._flush, loop)
        batch.append((fn, args, fut))
        return await settled(fut)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._pending.pop(loop)
        # On the loop only while the write lock is free: the write connection's busy
        # timeout is 0, so BEGIN IMMEDIATE answers at once. When another process (or a
        # waiting batch of this one) holds the lock, the batch waits for it on the waiter
        # thread, and the loop, lease renewals included, keeps running meanwhile.
        if self._waiting or not self._write_lock.acquire(blocking=False):
            return self._commit_off_loop(loop, batch)
        try:
            if self._conn is None:
                results: list[tuple[bool, Any]] = [(False, StorageError("store is closed"))]
                results *= len(batch)
                after: list[Callable[[], None]] = []
            else:
                outcome = self._commit_batch(self._conn, batch, wait=False)
                if outcome is None:
                    return self._commit_off_loop(loop, batch)
                results, after = outcome
        finally:
            self._write_lock.release()
        _answer(batch, results, after)

    def _commit_off_loop(self, loop: asyncio.AbstractEventLoop, batch: list[_Item]) -> None:
        with self._waiting_lock:
            self._waiting += 1

        def commit() -> None:
            try:
                with self._write_lock:
                    conn = self._conn
                    if conn is None:
                        results: list[tuple[bool, Any]] = [
                            (False, StorageError("store is closed"))
                        ] * len(batch)
                        after: list[Callable[[], None]] = []
                    else:
                        outcome = self._commit_batch(conn, batch, wait=True)
                        assert outcome is not None
                        results, after = outcome
            except BaseException as e:  # pragma: no cover - answered, never lost
                results, after = [(False, _translate(e, self.path))] * len(batch), []
            finally:
                with self._waiting_lock:
                    self._waiting -= 1
            # Transaction bodies ran here; their answers and wake-ups go back to the loop.
            loop.call_soon_threadsafe(_answer, batch, results, after)

        self._waiter.submit(commit)

    def _commit_batch(
        self, conn: sqlite3.Connection, batch: list[_Item], wait: bool
    ) -> tuple[list[tuple[bool, Any]], list[Callable[[], None]]] | None:
        """Commit ``batch``; None (nothing done) if ``wait`` is false and another
        connection holds the write lock."""
        results: list[tuple[bool, Any]] = []
        after: list[Callable[[], None]] = []
        single = len(batch) == 1
        cur = conn.cursor()
        if wait:
            cur.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
        try:
            try:
                cur.execute("BEGIN IMMEDIATE")
            finally:
                if wait:
                    cur.execute("PRAGMA busy_timeout=0")
        except sqlite3.Error as e:
            busy = isinstance(e, sqlite3.OperationalError) and (
                e.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
            )
            if busy and not wait:
                return None
            return [(False, _translate(e, self.path))] * len(batch), []
        try:
            for fn, args, _ in batch:
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
                    results.append((False, _translate(e, self.path)))
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
            err = _translate(e, self.path)
            return [(False, err)] * len(batch), []
        return results, after

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        with self._read_lock:
            conn = self._reader_conn
            if conn is None:
                raise StorageError("store is not open")
            try:
                conn.execute("BEGIN")  # one snapshot for every statement of the read
                try:
                    return fn(Tx(conn.cursor(), self.queries), *args)
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as e:
                raise _translate(e, self.path) from e

    # -- dialect hooks ---------------------------------------------------------------------

    def _dead(self, tx: Tx, worker_id: str) -> list[str]:
        rows = tx.all("workers_locking", {"worker_id": worker_id})
        return self._locks.dead(r["worker_id"] for r in rows)

    async def _hold(self, worker_id: str) -> bool:
        try:
            return await asyncio.to_thread(self._locks.hold, worker_id)
        except OSError as e:
            raise StorageError(f"cannot lock the workers' file {self._locks.path!r}: {e}") from e

    async def _release(self, worker_id: str) -> None:
        await asyncio.to_thread(self._locks.release, worker_id)

    def _ids(self, ids: Sequence[str]) -> Any:
        return dumps(list(ids))

    def _served(self, served: Collection[tuple[str, str]]) -> dict[str, Any]:
        return {"served": dumps([[w, v] for w, v in served])}

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
            awaited = self.bus.watched(DONE)
            if not awaited:
                return
            for run_id in await self.finished_among(awaited):
                self._wake(DONE, run_id)

    def _watch_journals(self, loop: asyncio.AbstractEventLoop) -> None:
        # Appends in this process wake their tails on commit; those of workers in other
        # processes are found by one poll per store for all tailed runs at once, never one
        # per subscriber.
        if self._journal_poller is None or self._journal_poller.done():
            self._journal_poller = loop.create_task(self._poll_journals())

    async def _poll_journals(self) -> None:
        heads: dict[str, int] = {}
        while True:
            await asyncio.sleep(FINISH_POLL_S)
            tailed = self.bus.watched(EVENTS)
            if not tailed:
                return
            seen = await self.journal_heads(tailed)
            for run_id, seq in seen.items():
                if heads.get(run_id) != seq:
                    self._wake(EVENTS, run_id)
            heads = seen

    async def now(self) -> float:
        # ratchet_now() in SQL reads this same clock; no round trip needed.
        return time.time() + self.clock.offset

    async def check_ready(self) -> None:
        # Open connections keep working on a file removed or replaced under them, writing
        # where no other process will ever read: the path must still name their file.
        if self._conn is None:
            raise StoreNotReady("the store is not open")
        path = os.path.abspath(self.path)
        try:
            found = await asyncio.to_thread(os.stat, path)
        except OSError as e:
            raise StoreNotReady(f"the SQLite file cannot be found ({e.strerror})") from e
        if _identity(found) != self._identity:
            raise StoreNotReady("the SQLite file was replaced since it was opened")
        wanted = os.R_OK if self.read_only else os.R_OK | os.W_OK
        if not os.access(path, wanted):
            raise StoreNotReady(
                "the SQLite file is not "
                + ("readable" if self.read_only else "readable and writable")
            )
        await super().check_ready()


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _stop(poller: asyncio.Task[None] | None) -> None:
    """Cancel a poller task, on whichever loop it runs."""
    if poller is None or poller.done():
        return
    if poller.get_loop() is asyncio.get_running_loop():
        poller.cancel()
    elif not poller.get_loop().is_closed():
        poller.get_loop().call_soon_threadsafe(poller.cancel)


def _answer(
    batch: list[_Item], results: list[tuple[bool, Any]], after: list[Callable[[], None]]
) -> None:
    for (_, _, fut), (ok, value) in zip(batch, results, strict=True):
        if fut.cancelled():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)
    for hook in after:
        hook()


def _translate(e: BaseException, path: str = "") -> BaseException:
    """A database error as Ratchet's: a violated constraint or a refused value is not
    transient (retrying gives the same answer); anything else may be (errors.py)."""
    if isinstance(e, sqlite3.Error):
        cls: type[Exception] = (
            StoreConflict
            if isinstance(e, sqlite3.IntegrityError)
            else ValueRefused
            if isinstance(e, sqlite3.DataError)
            else StorageError
        )
        # A read-only file is a fact about the file: name it.
        where = f" database {path!r}" if path and "readonly" in str(e) else ""
        err = cls(f"SQLite{where}: {e}")
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


def _create_private(path: str) -> None:
    """Make the database file for its owner only (mode 0600; a folder made for it, 0700)
    before SQLite opens it: SQLite gives its -wal, -shm and -journal files the database's
    mode, so all of them are closed to other users, a sandbox's among them."""
    if path.endswith(":memory:"):
        return
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
