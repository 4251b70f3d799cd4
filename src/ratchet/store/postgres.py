"""The PostgreSQL store: many workers on many machines, one database as the coordinator.

Transactions run on psycopg's pooled connections in a thread pool sized to the connection
pool, so the asyncio engine never blocks on the network. Idle workers wait on
``LISTEN ratchet_ready``; every transaction that makes a run ready sends ``NOTIFY`` in the
same commit, and workers still poll as a fallback for a lost notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from ratchet.errors import StorageError
from ratchet.store.base import Clock, Store, Tx
from ratchet.store.queries import load_migrations, load_queries

T = TypeVar("T")
log = logging.getLogger("ratchet.store")


class PostgresStore(Store):
    dialect = "postgresql"

    def __init__(self, url: str, clock: Clock | None = None, pool_size: int = 8) -> None:
        super().__init__(clock)
        self.url = url
        self.queries = load_queries("postgres")
        self._pool_size = pool_size
        self._pool: psycopg_pool.ConnectionPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._listen: psycopg.AsyncConnection[Any] | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def open(self) -> None:
        if self._pool is not None:
            return
        pool = psycopg_pool.ConnectionPool(
            self.url, min_size=1, max_size=self._pool_size, open=False,
            kwargs={"autocommit": False}, name="ratchet",
        )
        try:
            await asyncio.to_thread(pool.open, True, 10.0)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            await asyncio.to_thread(pool.close)
            raise StorageError(f"cannot connect to PostgreSQL: {e}") from e
        self._pool = pool
        self._executor = ThreadPoolExecutor(self._pool_size, thread_name_prefix="ratchet-pg")
        await self._loop_run(self._migrate)

    async def close(self) -> None:
        if self._listen_task is not None:
            self._listen_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listen_task
            self._listen_task = None
        if self._listen is not None:
            with contextlib.suppress(Exception):
                await self._listen.close()
            self._listen = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._pool is not None:
            await asyncio.to_thread(self._pool.close)
            self._pool = None

    def _migrate(self) -> None:
        assert self._pool is not None
        with self._pool.connection() as conn, conn.transaction():
            # One migrator at a time across every process starting against this database.
            conn.execute(self.queries["migrations_lock"])
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version integer PRIMARY KEY, name text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
            for version, name, sql in load_migrations("postgres"):
                if version in done:
                    continue
                conn.execute(sql.encode())
                conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                             (version, name))

    async def _loop_run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn)
        except psycopg.Error as e:
            raise StorageError(f"PostgreSQL: {e}") from e

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._pool is None:
            raise StorageError("store is not open")
        return await self._loop_run(lambda: self._tx(fn, args))

    def _tx(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        assert self._pool is not None
        with self._pool.connection() as conn:
            skew = self.clock.offset
            if getattr(conn, "_ratchet_skew", 0.0) != skew:
                conn.execute("SELECT set_config('ratchet.skew', %s, false)", (repr(skew),))
                conn.commit()
                conn._ratchet_skew = skew  # type: ignore[attr-defined]
            with conn.transaction(), conn.cursor() as cur:
                tx = Tx(cur, self.queries)
                result = fn(tx, *args)
        return result

    # -- dialect hooks ---------------------------------------------------------------------

    def _ids(self, ids: Sequence[str]) -> Any:
        return list(ids)

    def _announce(self, tx: Tx, queue: str) -> None:
        tx.one("notify_ready", {"queue": queue})

    async def _listen_loop(self) -> None:
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                self._listen = conn
                await conn.execute("LISTEN ratchet_ready")
                self._ready.set()  # anything may have happened while not listening
                async for _ in conn.notifies():
                    self._ready.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("action=listen_lost error=%s", e)
                self._ready.set()
                await asyncio.sleep(0.5)

    async def wait_ready(self, timeout: float) -> None:
        if self._listen_task is None:
            self._listen_task = asyncio.create_task(self._listen_loop(), name="ratchet-listen")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            pass
        self._ready.clear()
