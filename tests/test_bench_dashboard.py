"""The dashboard bench (bench/dashboard.py) end to end on a small run: a real worker fills
SQLite, the real app serves it on uvicorn and Chromium loads its pages; and the report
section ``make bench`` writes from its samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import dashboard
from bench.report import dashboard_section, write_reports

ROOT = Path(__file__).resolve().parent.parent


def test_the_quick_variant_times_both_pages_in_chromium() -> None:
    if not Path(dashboard.CHROMIUM).exists():
        pytest.skip(f"no Chromium at {dashboard.CHROMIUM}")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.dashboard",
            "--json",
            "--events",
            "203",
            "--runs",
            "5",
            "--repeats",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["events"], result["runs"], result["repeats"]) == (203, 6, 2), result
    ms = result["ms"]
    assert sorted(ms) == ["html", "list", "rows", "run"]
    for loads in ms.values():
        assert len(loads) == 2 and all(x > 0 for x in loads)
    # The HTML arrives before the waterfall is painted.
    assert all(html < run for html, run in zip(ms["html"], ms["run"], strict=True))


def _sample(rows_ms: float) -> dict[str, object]:
    return {
        "events": 9999,
        "runs": 1001,
        "repeats": 3,
        "fill_s": 5.0,
        "load_average": [1.5, 1.0, 1.0],
        "ms": {
            "html": [100.0, 120.0, 110.0],
            "run": [300.0, 310.0, 320.0],
            "rows": [rows_ms] * 3,
            "list": [90.0, 95.0, 99.0],
        },
    }


def test_the_report_has_a_dashboard_section_and_its_targets() -> None:
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
        "samples": {"dashboard|sqlite": [_sample(1200.0)]},
    }
    section = "\n".join(dashboard_section(results))
    assert "| run page, 9,999 events: all rows in the DOM | 1,200 (1,200–1,200) |" in section
    assert "| runs list, 1,001 runs: first contentful paint | 95.0 (90.0–99.0) |" in section
    assert "Load average 1.5–1.5" in section
    report = write_reports(results)
    assert (
        "dashboard: run page of 9,999 events, all rows in 1,200 ms; target under 1 s: **missed**"
    ) in report
    assert "dashboard: runs list of 1,001 runs in 95.0 ms; target under 1 s: **met**" in report
    skipped = {**results, "samples": {"dashboard|sqlite": [{"skipped": "no Chromium"}]}}
    assert dashboard_section(skipped)[-1] == "Not measured: no Chromium"
