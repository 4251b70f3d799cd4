"""A tag filter (``ratchet runs --tag``, ``GET /v1/runs?tag=``, the dashboard) finds the
tagged runs along an index, on both backends: what it reads follows the runs that match,
not the runs stored (20,000 here, 10 of them tagged)."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

import psycopg
from test_claim_plan import _rows_read
from test_runs_changed_plan import _migrate

from ratchet.store.queries import load_queries

RUNS = 20_000
TAGGED = 10  # every 2,000th run: customer=acme; every run: env=prod


def _params(**more: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "tenant_id": "acme",
        "tags": json.dumps({"customer": "acme"}),
        "limit": 51,
    }
    keys = ("status", "workflow", "parent", "text", "created_after", "created_before")
    params |= dict.fromkeys(keys) | {"cursor_at": None, "cursor_id": None}
    return params | more


def test_postgres_tag_filters_read_the_tagged_runs_along_the_gin_index(pg_url: str) -> None:
    _migrate(pg_url)
    queries = load_queries("postgres")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, workflow, workflow_version, input, status, queue, "
            "priority, tenant_id, created_at, updated_at, tags) "
            "SELECT 'r' || i, 'wf', '1', '{}', 'succeeded', 'default', 0, 'acme', "
            "to_timestamp(i), to_timestamp(i), CASE WHEN i %% 2000 = 0 "
            'THEN \'{"customer": "acme", "env": "prod"}\' ELSE \'{"env": "prod"}\' END::jsonb '
            "FROM generate_series(1, %s) i",
            (RUNS,),
        )
        conn.execute("ANALYZE runs")
        for name in ("runs_page_tagged", "runs_filter_tagged", "runs_count_tagged"):
            row = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + queries[name], _params()
            ).fetchone()
            assert row is not None
            [plan] = row
            read = _rows_read(plan[0]["Plan"])
            assert read <= TAGGED, f"{name} read {read} rows: {json.dumps(plan)}"
            assert "runs_tags" in json.dumps(plan), json.dumps(plan)
        rows = conn.execute(queries["runs_page_tagged"], _params()).fetchall()
        assert [r[0] for r in rows] == [f"r{i}" for i in range(RUNS, 0, -2000)]


def test_sqlite_tag_filters_read_the_tagged_runs_along_their_index(sqlite_url: str) -> None:
    _migrate(sqlite_url)
    conn = sqlite3.connect(sqlite_url[len("sqlite:///") :])
    conn.create_function("ratchet_now", 0, time.time)
    # No ANALYZE: a deployment rarely runs it, and the plan must hold without statistics.
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "INSERT INTO runs (run_id, workflow, workflow_version, input, status, queue, priority, "
        "tenant_id, created_at, updated_at, tags) SELECT 'r' || i, 'wf', '1', '{}', "
        "'succeeded', 'default', 0, 'acme', i, i, CASE WHEN i % 2000 = 0 "
        """THEN '{"customer": "acme", "env": "prod"}' ELSE '{"env": "prod"}' END FROM n""",
        (RUNS,),
    )
    conn.commit()
    assert conn.execute("SELECT count(*) FROM run_tags").fetchone()[0] == RUNS + TAGGED
    queries = load_queries("sqlite")
    for name in ("runs_page_tagged", "runs_filter_tagged", "runs_count_tagged"):
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + queries[name], _params())]
        assert any("run_tags_match" in step for step in plan), plan
        # Each run matched is looked up by its id; no run is read otherwise.
        assert not any(step.startswith("SCAN r") for step in plan), plan
        assert any(step.startswith("SEARCH r ") for step in plan), plan
    rows = conn.execute(queries["runs_page_tagged"], _params()).fetchall()
    assert [r[0] for r in rows] == [f"r{i}" for i in range(RUNS, 0, -2000)]
    both = json.dumps({"customer": "acme", "env": "prod"})
    assert conn.execute(queries["runs_count_tagged"], _params(tags=both)).fetchone()[0] == TAGGED
    conn.close()
