"""What the store's verb modules need of a database: the :class:`Dialect`.

The verbs (``runs``, ``leases``, ``journal``, ...) are written once, as transaction bodies
over named queries; they reach the database only through these hooks, which
:class:`ratchet.store.base.Store` declares and each dialect (``sqlite.py``,
``postgres.py``) implements: how and where a transaction runs, how a list of ids or of
served ``(workflow, version)`` pairs is passed, how waiters are woken once a
transaction commits, and how a worker's liveness is held and tested. The hooks keep their
underscore: they are the store package's own plumbing, not something for the engine or
the API to call.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, TypeVar

from ratchet.store.transaction import Tx

__all__ = ["Dialect"]

T = TypeVar("T")


class Dialect(Protocol):
    """The hooks a :class:`ratchet.store.base.Store` offers its verb modules."""

    @property
    def json_text_canonical(self) -> bool:
        """Whether JSON comes back as the canonical text it was written as (not jsonb)."""
        ...

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(tx, *args)`` in one transaction, off the event loop."""
        ...

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a read-only ``fn(tx, *args)``; dialects may serve it beside the writes."""
        ...

    async def _look(self, fn: Callable[..., T], *args: Any) -> T | None:
        """:meth:`_read`, for a worker's look at who died; dialects make sure first that
        this process's own liveness locks are still held, and answer None (no look) while
        the others may be taking theirs again."""
        ...

    def _dead(self, tx: Tx, worker_id: str) -> list[str]:
        """Within ``tx``: the workers (other than ``worker_id``) that took a liveness lock
        and no longer hold it."""
        ...

    async def _hold(self, worker_id: str) -> bool:
        """Take ``worker_id``'s liveness lock; False when a live worker holds it."""
        ...

    def _ids(self, ids: Sequence[str]) -> Any:
        """A list of ids (or other strings) as the dialect's queries take it."""
        ...

    def _served(self, served: Collection[tuple[str, str]]) -> dict[str, Any]:
        """``(workflow, version)`` pairs as the parameters the dialect's queries take."""
        ...

    def _announce(self, tx: Tx, channel: str, key: str = "") -> None:
        """Once ``tx`` commits, wake the waiters on ``channel`` (see ``ratchet.store.bus``)."""
        ...

    def _journaled(self, tx: Tx, run_id: str) -> None:
        """``tx`` appends to ``run_id``'s journal: wake its tails on commit."""
        ...

    def _insert_batch(
        self, tx: Tx, runs: list[dict[str, Any]], events: list[dict[str, Any]]
    ) -> list[str]:
        """Insert a batch of new runs and their first events; the ids inserted."""
        ...
