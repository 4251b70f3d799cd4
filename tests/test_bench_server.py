"""The server bench (bench/server.py) end to end on each backend in its quick variant: a real
``ratchet server`` process, a real token, a worker process writing the run and client
processes following it; and the checks and report it rests on."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from bench import server
from bench.report import server_section, write_reports


def test_quick_variant_measures_a_real_server(db_url: str) -> None:
    plan = server.plan(quick=True)
    backend = "sqlite" if db_url.startswith("sqlite") else "postgres"
    result = server.measure(backend, db_url, quick=True)
    for name in ("accept", "single", "fanout"):
        assert "error" not in result[name], result[name]
    steps = round(plan.fanout_seconds / server.STEP_S)
    for name, subscribers in (("single", 1), ("fanout", plan.fanout_subscribers)):
        got = result[name]
        # run_queued, run_started, two events a step, run_succeeded.
        assert got["events"] == 2 * steps + 3
        # Every event the worker committed (all but run_queued, written by the POST) was
        # timed at every subscriber; each subscriber had every seq once, in order.
        assert got["timed_events"] == got["events"] - 1
        assert got["subscribers"] == subscribers and got["every_event_once"] is True
        assert got["deliveries"] == subscribers * got["timed_events"]
        assert got["p50_ms"] <= got["p99_ms"] <= got["max_ms"]
        # Each event was made before its commit: from creation is never the shorter.
        assert got["created_p50_ms"] >= got["p50_ms"] and got["created_p99_ms"] >= got["p99_ms"]
        assert got["server_peak_rss_mb"] >= got["server_rss_mb"] > 0
        for fld in (
            "server_cpu_pct",
            "server_cpu_wait_pct",
            "client_cpu_pct",
            "client_cpu_wait_pct",
            "writer_cpu_pct",
        ):
            assert got[fld] >= 0, fld
    accepted = result["accept"]
    assert accepted["clients"] == plan.post_processes * plan.post_connections
    assert accepted["accepted"] > 0 and accepted["accepted_per_s"] > 0
    assert 0 < accepted["p50_ms"] <= accepted["p99_ms"]
    assert accepted["server_cpu_pct"] > 0


def _stream(seqs: list[int], at: float = 100.0) -> tuple[array[int], array[float]]:
    return array("q", seqs), array("d", [at + s / 1000 for s in seqs])


def test_a_stream_that_misses_or_repeats_an_event_is_an_error() -> None:
    # seq 1 was committed before the clients came; 2 and 3 made 1 ms before their commit.
    commits = {2: (100.0, 99.999), 3: (100.0, 99.999)}
    whole = server.deliveries([_stream([1, 2, 3]), _stream([1, 2, 3])], commits)
    assert (whole["events"], whole["timed_events"], whole["deliveries"]) == (3, 2, 4)
    assert whole["p50_ms"] == pytest.approx(2.5) and whole["max_ms"] == pytest.approx(3.0)
    assert whole["min_ms"] == pytest.approx(2.0)
    assert whole["created_p50_ms"] == pytest.approx(3.5)
    for bad in ([1, 3], [1, 2, 2, 3], [1, 3, 2], [1, 2]):
        with pytest.raises(RuntimeError, match="not seqs 1..3 once each in order"):
            server.deliveries([_stream([1, 2, 3]), _stream(bad)], commits)


def _sample(p50: float) -> dict[str, Any]:
    load = {
        "server_cpu_pct": 20.0,
        "server_cpu_wait_pct": 5.0,
        "client_cpu_pct": 10.0,
        "client_cpu_wait_pct": 2.0,
        "load_average": 3.5,
    }
    follow = {
        "p50_ms": p50,
        "p99_ms": 2 * p50,
        "created_p50_ms": p50 + 1,
        "created_p99_ms": 2 * p50 + 1,
        "server_rss_mb": 70.0,
        "server_peak_rss_mb": 75.0,
        "deliveries_per_s": 100.0,
        "subscribers": 1000,
        **load,
    }
    return {
        "accept": {"clients": 32, "accepted_per_s": 900.0, "p50_ms": 30.0, "p99_ms": 80.0, **load},
        "single": follow,
        "fanout": follow,
    }


def test_the_report_shows_each_backend_and_the_postgres_target() -> None:
    results = {
        "quick": False,
        "repeats": 1,
        "machine": {
            "date": "2026-01-01 00:00 UTC",
            "cpus": 2,
            "platform": "Linux",
            "python": "3.11",
            "sqlite": "3.40",
            "postgres": "15",
            "postgres_settings": {"fsync": "on", "synchronous_commit": "on"},
        },
        "samples": {
            "server|sqlite": [_sample(25.0)],
            "server|postgres": [
                _sample(0.8),
                _sample(1.2),
                {"accept": {"error": "no answer"}, "single": {}, "fanout": {}},
            ],
        },
    }
    section = "\n".join(server_section(results))
    assert "| measure | sqlite | postgres |" in section
    assert (
        "| commit → SSE, 1 subscriber: p50 (ms) | 25.0 (25.0–25.0) | 1.00 (0.80–1.20) |" in section
    )
    assert "| `POST /v1/runs`: runs accepted/s | 900 (900–900) | 900 (900–900) |" in section
    assert "1,000 SSE subscribers" in section and "load average 3.5–3.5" in section
    assert "- postgres, accept: no answer" in section
    report = write_reports(results)
    assert (
        "commit → SSE p50 with one subscriber 1.00 ms (from the event's creation 2.00 ms); "
        "target under 10 ms: **met**"
    ) in report
