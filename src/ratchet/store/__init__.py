"""Storage: one Store interface, a SQLite and a PostgreSQL dialect."""

from __future__ import annotations

from ratchet.config import DatabaseURL
from ratchet.store.base import Clock, HeldLease, LeaseState, Store, WorkerInfo

__all__ = ["Clock", "HeldLease", "LeaseState", "Store", "WorkerInfo", "make_store"]


def make_store(url: str, clock: Clock | None = None, *, read_only: bool = False) -> Store:
    """A store for ``url`` (``sqlite:///path`` or ``postgresql://...``), not yet opened.

    A malformed URL raises :class:`ratchet.errors.ConfigError` before anything is touched.
    ``read_only``: for callers that only read; opening never creates a database, and a
    missing one is a :class:`ratchet.errors.StorageError` that says so.
    """
    parsed = DatabaseURL.parse(url)
    if parsed.scheme == "sqlite":
        from ratchet.store.sqlite import SqliteStore

        return SqliteStore(parsed.path, clock, read_only=read_only)
    from ratchet.extras import require

    require("a postgresql:// database", "postgres")
    from ratchet.store.postgres import PostgresStore

    return PostgresStore(parsed.url, clock, read_only=read_only)
