"""The claim reads indexes in order and stops at its limit: its work does not grow with
the backlog (runs queued behind the head, or waiting on future timers)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from typing import Any

import psycopg

from ratchet.store import make_store
from ratchet.store.queries import load_queries

BACKLOG = 20_000  # half queued, half waiting on a timer far in the future
LIMIT = 16


def _rows_read(plan: dict[str, Any]) -> int:
    """Rows of ``runs`` that the scans of a plan (EXPLAIN ANALYZE, JSON) read, loops and
    rows removed by a filter included."""
    own = 0
    if "Scan" in plan["Node Type"] and plan.get("Relation Name") == "runs":
        loops = plan.get("Actual Loops", 1)
        own = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
    return own + sum(_rows_read(p) for p in plan.get("Plans", []))


def test_postgres_claim_reads_a_bounded_number_of_rows(pg_url: str) -> None:
    async def migrate() -> None:
        store = make_store(pg_url)
        await store.open()
        await store.close()

    asyncio.run(migrate())
    q = load_queries("postgres")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, workflow, workflow_version, input, status, queue, "
            "priority, not_before, created_at, updated_at) "
            "SELECT 'r' || i, 'wf', '1', '{}', CASE WHEN i %% 2 = 0 THEN 'queued' ELSE "
            "'waiting' END, 'default', 0, CASE WHEN i %% 2 = 0 THEN NULL ELSE "
            "to_timestamp(1e10) END, to_timestamp(i), to_timestamp(i) "
            "FROM generate_series(1, %s) i",
            (BACKLOG,),
        )
        conn.execute("ANALYZE runs")
        claim = {
            "queues": ["default"],
            "limit": LIMIT,
            "worker_id": "w",
            "ttl": 10.0,
            "served_workflows": ["wf"],
            "served_versions": ["1"],
        }
        for name, params in (("timers_due", {"limit": 100}), ("claim_ready", claim)):
            with conn.transaction(force_rollback=True):  # EXPLAIN ANALYZE runs the claim
                row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + q[name], params).fetchone()
                assert row is not None
                [plan] = row
                read = _rows_read(plan[0]["Plan"])
                assert read <= 4 * LIMIT, f"{name} read {read} rows: {json.dumps(plan)}"


def test_sqlite_claim_reads_indexes_in_order(sqlite_url: str) -> None:
    async def migrate() -> None:
        store = make_store(sqlite_url)
        await store.open()
        await store.close()

    asyncio.run(migrate())
    conn = sqlite3.connect(sqlite_url[len("sqlite:///") :])
    conn.create_function("ratchet_now", 0, time.time)
    # No ANALYZE: a deployment rarely runs it, and the plan must hold without statistics.
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "INSERT INTO runs (run_id, workflow, workflow_version, input, status, queue, priority, "
        "not_before, created_at, updated_at) SELECT 'r' || i, 'wf', '1', '{}', CASE WHEN "
        "i % 2 = 0 THEN 'queued' ELSE 'waiting' END, 'default', 0, CASE WHEN i % 2 = 0 "
        "THEN NULL ELSE 1e12 END, i, i FROM n",
        (BACKLOG,),
    )
    conn.commit()
    q = load_queries("sqlite")
    params = {"limit": LIMIT, "queue": "default", "served": '[["wf", "1"]]'}
    for name in ("timers_due", "claim_pick"):
        sql = q[name]
        plan = [
            r[3]
            for r in conn.execute(
                "EXPLAIN QUERY PLAN " + sql, {k: v for k, v in params.items() if f":{k}" in sql}
            )
        ]
        assert not any("TEMP B-TREE" in step or step.startswith("SCAN runs") for step in plan), (
            name,
            plan,
        )
        assert any("runs_timers" in step or "runs_queued" in step for step in plan), (name, plan)
    conn.close()
