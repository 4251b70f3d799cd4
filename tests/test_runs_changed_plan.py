"""The live runs list's probe (``ui_runs_changed``) reads one entry of an index, however
many runs the tenant has: it runs about once a second per tenant in every server process."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from typing import Any

import psycopg
from test_claim_plan import _rows_read

from ratchet.store import make_store
from ratchet.store.queries import load_queries

RUNS = 20_000  # over two tenants


def _migrate(url: str) -> None:
    async def go() -> None:
        store = make_store(url)
        await store.open()
        await store.close()

    asyncio.run(go())


def test_postgres_probe_reads_one_index_entry(pg_url: str) -> None:
    _migrate(pg_url)
    sql = load_queries("postgres")["ui_runs_changed"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, workflow, workflow_version, input, status, queue, "
            "priority, tenant_id, created_at, updated_at) "
            "SELECT 'r' || i, 'wf', '1', '{}', 'succeeded', 'default', 0, "
            "CASE WHEN i %% 2 = 0 THEN 'acme' ELSE 'globex' END, to_timestamp(i), "
            "to_timestamp(i) FROM generate_series(1, %s) i",
            (RUNS,),
        )
        conn.execute("ANALYZE runs")
        row = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + sql, {"tenant_id": "acme"}
        ).fetchone()
        assert row is not None
        [plan] = row
        read = _rows_read(plan[0]["Plan"])
        assert read <= 2, f"read {read} rows: {json.dumps(plan)}"
        assert "runs_tenant_changed" in json.dumps(plan), json.dumps(plan)
        row = conn.execute(sql, {"tenant_id": "acme"}).fetchone()
        assert row is not None and row[0] == f"r{RUNS}"


def test_sqlite_probe_reads_the_index_in_order(sqlite_url: str) -> None:
    _migrate(sqlite_url)
    conn = sqlite3.connect(sqlite_url[len("sqlite:///") :])
    conn.create_function("ratchet_now", 0, time.time)
    # No ANALYZE: a deployment rarely runs it, and the plan must hold without statistics.
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "INSERT INTO runs (run_id, workflow, workflow_version, input, status, queue, priority, "
        "tenant_id, created_at, updated_at) SELECT 'r' || i, 'wf', '1', '{}', 'succeeded', "
        "'default', 0, CASE WHEN i % 2 = 0 THEN 'acme' ELSE 'globex' END, i, i FROM n",
        (RUNS,),
    )
    conn.commit()
    sql = load_queries("sqlite")["ui_runs_changed"]
    params: dict[str, Any] = {"tenant_id": "acme"}
    plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    assert not any("TEMP B-TREE" in step for step in plan), plan
    assert any("runs_tenant_changed" in step for step in plan), plan
    assert conn.execute(sql, params).fetchone()[0] == f"r{RUNS}"
    conn.close()
