"""What a queue's limits cost a claim: the same runs through a queue with no limit, one with a
fleet-wide concurrency limit that never binds, and one with a per-key limit, side by side.

``python -m bench.queues [--runs 1000] [--backend sqlite|postgres|both]`` starts ``runs``
one-step workflows on a fresh database of each backend (SQLite: a file, WAL; PostgreSQL: a
database of its own on the local server, dropped afterwards), then one worker
(``--concurrency 32``) in this process drives them, once per way:

- ``unlimited``: a queue with no limit (the claim is one statement, as before queues);
- ``concurrency``: ``concurrency=10_000``, which never binds, so what it shows is the cost of
  a limited claim (lock the queue's row, count what is in flight, pick within the room left);
- ``per_key``: ``per_key_concurrency=1_000`` over 10 keys (the claim also ranks the backlog
  by key), which never binds either;
- ``handoff``: ``concurrency=1``, so runs go one at a time and each waits for the previous
  one's slot: its runs/s beside ``unlimited_1`` (no limit, worker concurrency 1) is what a
  binding limit adds to each hand-off. These two drive a fifth of the runs.

Each way reports runs per second from the first start to the last result (the start is
timed apart), and the ratio to ``unlimited``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

PG_ADMIN = os.environ.get("RATCHET_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
KEYS = 10
# (way, queue limits, worker concurrency)
WAYS: list[tuple[str, dict[str, Any], int]] = [
    ("unlimited", {}, 32),
    ("concurrency", {"concurrency": 10_000}, 32),
    ("per_key", {"per_key_concurrency": 1_000}, 32),
    ("unlimited_1", {}, 1),
    ("handoff", {"concurrency": 1}, 32),
]


def drive(url: str, way: str, limits: dict[str, Any], concurrency: int, runs: int) -> float:
    """Seconds for one worker of ``concurrency`` to drive ``runs`` one-step runs of a queue
    with ``limits``, all started before it begins."""
    import ratchet

    app = ratchet.Ratchet(url)
    queue = f"q_{way}"
    app.queue(queue, **limits)

    @app.step()
    async def echo(i: int) -> int:
        return i

    @app.workflow(name=f"wf_{way}", queue=queue)
    async def wf(i: int) -> int:
        return await echo(i)

    try:
        keyed = "per_key_concurrency" in limits
        ids = [
            app.start(wf, i, concurrency_key=f"k{i % KEYS}" if keyed else None) for i in range(runs)
        ]
        began = time.perf_counter()
        app.launch(concurrency=concurrency)
        for run_id in ids:
            app.result(run_id, timeout_s=600)
        return time.perf_counter() - began
    finally:
        app.shutdown()


def backend_urls(backend: str, folder: Path) -> tuple[str, Any]:
    """A fresh database of ``backend`` and how to drop it."""
    if backend == "sqlite":
        return f"sqlite:///{folder / f'queues-{uuid.uuid4().hex[:8]}.db'}", lambda: None
    import psycopg

    name = f"ratchet_bench_queues_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return PG_ADMIN.rsplit("/", 1)[0] + f"/{name}", drop


def measure(backend: str, runs: int, folder: Path) -> dict[str, Any]:
    """Runs per second of each way on a fresh database of ``backend``."""
    out: dict[str, Any] = {"backend": backend, "runs": runs, "ways": {}}
    for way, limits, concurrency in WAYS:
        url, drop = backend_urls(backend, folder)
        n = runs if concurrency > 1 and limits.get("concurrency") != 1 else max(1, runs // 5)
        try:
            seconds = drive(url, way, limits, concurrency, n)
        finally:
            drop()
        out["ways"][way] = {
            "limits": limits,
            "worker_concurrency": concurrency,
            "runs": n,
            "seconds": round(seconds, 3),
            "runs_per_s": round(n / seconds, 1),
        }
    base = out["ways"]["unlimited"]["runs_per_s"]
    base_1 = out["ways"]["unlimited_1"]["runs_per_s"]
    for way, figures in out["ways"].items():
        against = base_1 if way in ("unlimited_1", "handoff") else base
        figures["ratio"] = round(figures["runs_per_s"] / against, 2)
    return out


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{result['backend']}: {result['runs']} one-step runs",
        f"{'way':14} {'limits':34} {'worker':>6} {'runs':>5} {'runs/s':>8} {'ratio':>6}",
    ]
    for way, f in result["ways"].items():
        limits = json.dumps(f["limits"]) if f["limits"] else "none"
        lines.append(
            f"{way:14} {limits:34} {f['worker_concurrency']:>6} {f['runs']:>5} "
            f"{f['runs_per_s']:>8} {f['ratio']:>6}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    with tempfile.TemporaryDirectory(prefix="ratchet-bench-queues-") as folder:
        results = [measure(b, args.runs, Path(folder)) for b in backends]
    print(json.dumps(results, indent=2) if args.json else "\n\n".join(map(render, results)))


if __name__ == "__main__":
    main()
