"""The pieces every transaction is made of: the :class:`Tx` a body runs its named queries
on, the :class:`Clock` the store adds to the database's time, and the future that keeps a
store call's answer from being lost to its caller's cancellation.

A transaction body is a plain function ``body(tx, *args)``; a dialect runs it in one
transaction (see :class:`ratchet.store.dialect.Dialect`), which commits when it returns
and rolls back when it raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["Clock", "Cursor", "FirmFuture", "Tx", "firm_future", "settled"]

T = TypeVar("T")


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
    """A new :class:`FirmFuture` on ``loop``."""
    return FirmFuture(loop=loop)


class Clock:
    """An offset added to the database's clock. Tests move it forward to expire leases
    and timers without sleeping through them; in production it stays at zero."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class Cursor(Protocol):
    """What a transaction needs of a driver's cursor (sqlite3's and psycopg's both fit)."""

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
