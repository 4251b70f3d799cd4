"""The README's Performance tables are written from a full bench run's results, between
their markers, and never from a quick run; a bench run drops only its own databases."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench import readme
from bench.report import write_reports
from bench.run import _orphaned


def _results(quick: bool = False) -> dict[str, Any]:
    def sample(system: str, zero_s: float, ten_s: float, sps: float) -> dict[str, list[Any]]:
        return {
            f"sequential0|{system}": [{"n": 10, "seconds": zero_s}],
            f"sequential10|{system}": [{"n": 10, "seconds": ten_s}],
            f"concurrent|{system}": [{"steps_per_s": sps, "n": 100}],
        }

    samples = (
        sample("ratchet|sqlite|default", 0.01, 0.03, 9000.0)
        | sample("dbos|sqlite|default", 0.02, 0.25, 300.0)
        | {"limit|sqlite|1": [{"commits_per_s": 5000.0, "commit_us": 200.0}]}
    )
    machine = {
        "date": "2031-01-02 03:04 UTC",
        "cpus": 2,
        "platform": "Linux-test",
        "python": "3.11.7",
        "sqlite": "3.40.1",
        "postgres": "15.20 (Debian)",
        "postgres_settings": {"fsync": "on", "synchronous_commit": "on"},
    }
    return {"quick": quick, "repeats": 1, "samples": samples, "machine": machine, "elapsed_s": 60.0}


def _readme(tmp_path: Path) -> Path:
    path = tmp_path / "README.md"
    path.write_text(
        f"# Title\n\n## Performance\n\n{readme.START}\nold table\n{readme.END}\n\n## Next\n",
        "utf-8",
    )
    return path


def test_a_full_run_rewrites_only_the_block_between_the_markers(tmp_path: Path) -> None:
    results = _results()
    write_reports(results)
    path = _readme(tmp_path)
    assert readme.update(results, path)
    text = path.read_text("utf-8")
    assert "old table" not in text
    assert text.startswith("# Title\n\n## Performance\n\n" + readme.START)
    assert text.endswith(readme.END + "\n\n## Next\n")
    assert "from the full run of 2031-01-02 03:04 UTC on 2 cores" in text
    # 2 ms / 10 steps per workflow = 200 µs a step for Ratchet, 2,300 µs for DBOS.
    row = next(line for line in text.splitlines() if line.startswith("| sequential"))
    assert row.startswith("| sequential: per-step overhead (µs) | 200 ")
    assert "ratio 0.09" in row
    assert readme.update(results, path)  # idempotent: the markers are kept
    assert path.read_text("utf-8") == text


def test_the_real_readme_has_the_markers() -> None:
    text = readme.README.read_text("utf-8")
    assert text.count(readme.START) == 1 and text.count(readme.END) == 1
    assert text.index(readme.START) < text.index(readme.END)


def test_without_markers_nothing_is_written(tmp_path: Path) -> None:
    results = _results()
    write_reports(results)
    path = tmp_path / "README.md"
    path.write_text("# no markers\n", "utf-8")
    assert not readme.update(results, path)
    assert path.read_text("utf-8") == "# no markers\n"


def test_databases_of_live_runs_are_kept_and_of_dead_ones_dropped() -> None:
    assert not _orphaned(f"bench_{os.getpid()}_ratchet_default")
    dead = 2**22 + 12345  # above the kernel's pid_max default: never a live process
    assert _orphaned(f"bench_{dead}_ratchet_default")
    assert not _orphaned("bench_server_123")


def test_the_report_says_how_long_the_run_took_and_where() -> None:
    results = _results() | {"spent_s": {"replay": 30.0, "sequential10": 12.5}}
    text = write_reports(json.loads(json.dumps(results)))
    assert "The run took 1.0 min (replay 30 s, sequential10 12 s)." in text


def test_the_benchmarks_page_gets_the_report_without_the_sections_it_tells_itself(
    tmp_path: Path,
) -> None:
    results = _results()
    report = write_reports(results)
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nintro\n\n{readme.START}\n{readme.END}\n\n## Prose\n")
    assert readme.update_page(report + "\n## The dashboard\n\nits own words\n", page)
    text = page.read_text("utf-8")
    assert "### The database's own limit" in text and "### sqlite" in text
    assert "### Targets" in text and "its own words" not in text
    assert "# Benchmark results" not in text  # the report's title is the page's own
    assert text.endswith(readme.END + "\n\n## Prose\n")
    assert "The run took 1.0 min." in text
