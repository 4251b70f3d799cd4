"""The named queries: both dialects define the same set, apart from the few that only one
dialect needs (listed here, each with its reason)."""

from __future__ import annotations

from ratchet.store.queries import load_queries

# Queries one dialect has and the other does without.
DIALECT_ONLY = {
    "sqlite": {
        # The workers whose liveness lock is to be tested: SQLite tests a file's byte locks
        # in Python, PostgreSQL tests advisory locks in SQL (worker_lock, workers_dead).
        "workers_locking",
    },
    "postgres": {
        "notify",  # LISTEN/NOTIFY; SQLite wakes its own process and polls for others
        "migrations_lock",  # an advisory lock; SQLite's BEGIN IMMEDIATE already serialises
        # A worker's liveness: a session advisory lock, taken, let go, and tested for the
        # workers that died (SQLite locks a byte of a file beside the database).
        "worker_lock",
        "worker_unlock",
        "workers_dead",
        # Single-statement forms of the hot path (SQLite has no data-modifying CTEs).
        "append_events",
        "claim_ready",
        "create_run",
        "create_runs",
    },
}


def test_both_dialects_define_the_same_named_queries() -> None:
    sqlite, postgres = set(load_queries("sqlite")), set(load_queries("postgres"))
    assert sqlite - DIALECT_ONLY["sqlite"] == postgres - DIALECT_ONLY["postgres"], (
        f"only in sqlite: {sorted(sqlite - postgres - DIALECT_ONLY['sqlite'])}; "
        f"only in postgres: {sorted(postgres - sqlite - DIALECT_ONLY['postgres'])}"
    )
    # The exceptions are real: each names a query its dialect defines.
    assert DIALECT_ONLY["sqlite"] <= sqlite and DIALECT_ONLY["postgres"] <= postgres


def test_every_query_has_a_body() -> None:
    for dialect in ("sqlite", "postgres"):
        for name, sql in load_queries(dialect).items():
            assert sql.strip(), f"{dialect}: query {name} is empty"
