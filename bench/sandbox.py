"""The isolated tier's costs, on SQLite (a fresh file, WAL, synchronous=FULL).

``python -m bench.sandbox [--runs N] [--steps K] [--json]``:

* spawn → first step reported: for N isolated runs one after the other, from the
  sandbox's row (written just before bubblewrap is started) to its first ``step_started``
  in the journal; p50 and p99 in milliseconds. It is the price of a sandbox per attempt:
  bubblewrap's namespaces, the interpreter starting, the workflow's module imported, the
  journal read over the report channel.
* per-step overhead: the same workflow of K trivial steps run isolated and in-process;
  microseconds per step of each (first ``step_started`` to last ``step_completed``) and
  the difference, which is what reporting a step over the channel adds.

Needs bubblewrap; ``bench/run.py`` runs it as part of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import ratchet

app = ratchet.Ratchet("sqlite:///unused-inside-the-sandbox.db")


@app.step
def tick(i: int) -> int:
    return i + 1


async def _steps(k: int) -> int:
    total = 0
    for i in range(k):
        total += await tick(i)
    return total


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(memory_mb=256, timeout_s=300))
async def isolated_steps(k: int) -> int:
    return await _steps(k)


@app.workflow()
async def process_steps(k: int) -> int:
    return await _steps(k)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _step_span_us(events: list[ratchet.Event], k: int) -> float:
    start = next(e.at for e in events if e.kind == "step_started")
    end = [e.at for e in events if e.kind == "step_completed"][-1]
    return (end - start) / k * 1e6


def measure(runs: int, steps: int) -> dict[str, Any]:
    if shutil.which("bwrap") is None:
        return {"skipped": "bubblewrap is not installed"}
    with tempfile.TemporaryDirectory() as folder:
        bench_app = ratchet.Ratchet(f"sqlite:///{Path(folder) / 'bench.db'}")
        bench_app.workflows.update(app.workflows)
        with bench_app:
            bench_app.launch()
            first_ms: list[float] = []
            for _ in range(runs):
                run_id = bench_app.start(isolated_steps, 1)
                bench_app.result(run_id, timeout_s=120)
                [row] = bench_app.sandboxes(run_id)
                started = next(e.at for e in bench_app.events(run_id) if e.kind == "step_started")
                first_ms.append((started - row.started_at) * 1000)
            per_step: dict[str, float] = {}
            for name, wf in (("process", process_steps), ("isolated", isolated_steps)):
                run_id = bench_app.start(wf, steps)
                bench_app.result(run_id, timeout_s=300)
                per_step[name] = _step_span_us(bench_app.events(run_id), steps)
    return {
        "runs": runs,
        "steps": steps,
        "spawn_to_first_step_ms": {
            "p50": round(statistics.median(first_ms), 1),
            "p99": round(_pct(first_ms, 0.99), 1),
        },
        "step_us": {k: round(v) for k, v in per_step.items()},
        "step_overhead_us": round(per_step["isolated"] - per_step["process"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="one JSON line, for bench/run.py")
    args = parser.parse_args()
    # Run as ``-m`` this module is __main__; the harness imports bench.sandbox inside each
    # sandbox, so the workflows measured are that module's.
    from bench import sandbox

    result = sandbox.measure(args.runs, args.steps)
    if args.json:
        print(json.dumps(result))
        return
    if "skipped" in result:
        print(f"skipped: {result['skipped']}")
        sys.exit(0)
    first = result["spawn_to_first_step_ms"]
    print(
        f"spawn → first step reported: p50 {first['p50']} ms, p99 {first['p99']} ms "
        f"({args.runs} sandboxes)"
    )
    print(
        f"per step: in-process {result['step_us']['process']} µs, isolated "
        f"{result['step_us']['isolated']} µs, overhead {result['step_overhead_us']} µs "
        f"({args.steps} steps)"
    )


if __name__ == "__main__":
    main()
