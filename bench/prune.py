"""Pruning on PostgreSQL while a worker runs the concurrent benchmark.

``python -m bench.prune [--events 1000000] [--window 20]``: in a fresh database, seed
finished runs (each with a receipt over its whole journal) holding ``--events`` journal
events that finished 40 days ago; run one worker at concurrency 64 under 64 closed-loop
clients (start a run of 10 no-op steps, wait for its result, again), as the concurrent
benchmark does; measure its throughput for ``--window`` seconds, then run ``ratchet prune
--finished-before 30d`` in a process of its own and measure the worker's throughput until
the prune ends, and again for ``--window`` seconds after it. Reported: steps/s before,
during and after the prune (the drop is against the mean of before and after), and the
longest stall: the longest time in each phase during which no step ran at all, and when
in the phase it began (the prune's phase includes starting its process). Writes
``bench/results/prune.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

import ratchet

PG_ADMIN = os.environ.get("RATCHET_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
RESULTS = Path(__file__).parent / "results"
STEPS = 10
CLIENTS = 64
EVENTS_PER_RUN = 20

SEED = """
INSERT INTO runs (run_id, workflow, workflow_version, input, status, output, created_at,
                  updated_at)
SELECT 'old-' || r, 'bench', '1', '{"args":[],"kwargs":{}}', 'succeeded', '1',
       now() - interval '41 days', now() - interval '40 days'
FROM generate_series(%(first)s::int, %(last)s::int) AS r;
INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, at, prev_hash, hash)
SELECT 'old-' || r, s, 'step_completed', s || ':noop', 1, '{"output": 1}',
       now() - interval '40 days', md5(r || ':' || s - 1) || md5('p'),
       md5(r || ':' || s) || md5('p')
FROM generate_series(%(first)s::int, %(last)s::int) AS r,
     generate_series(1, %(per_run)s::int) AS s;
INSERT INTO run_receipts (run_id, seq, key_id, envelope, signed_at)
SELECT 'old-' || r, %(per_run)s::int, 'bench', '{}', now() - interval '40 days'
FROM generate_series(%(first)s::int, %(last)s::int) AS r;
"""


def _seed(url: str, events: int, log: Any) -> int:
    runs = events // EVENTS_PER_RUN
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, runs + 1, 10_000):  # in slices: no single huge transaction
            last = min(runs, first + 9_999)
            for statement in SEED.split(";"):
                if statement.strip():
                    conn.execute(
                        statement, {"first": first, "last": last, "per_run": EVENTS_PER_RUN}
                    )
        conn.execute("VACUUM ANALYZE")
        total = conn.execute("SELECT count(*) FROM journal_events").fetchone()
    log(
        f"seeded {runs} runs, {total[0] if total else 0} events in "
        f"{time.monotonic() - started:.1f}s"
    )
    return runs


def _app(url: str, stamps: list[float]) -> tuple[ratchet.Ratchet, ratchet.WorkflowDef]:
    app = ratchet.Ratchet(url)

    @app.step()
    async def noop(i: int) -> int:
        stamps.append(time.monotonic())
        return i

    @app.workflow(name="bench")
    async def bench() -> int:
        for i in range(1, STEPS + 1):
            await noop(i)
        return STEPS

    return app, bench


def _phase(stamps: list[float], start: float, end: float) -> dict[str, float]:
    inside = [t for t in stamps if start <= t <= end]
    gaps = [(b - a, a) for a, b in zip([start, *inside], [*inside, end], strict=True)]
    longest, at = max(gaps)
    return {
        "seconds": round(end - start, 2),
        "steps": len(inside),
        "steps_per_s": round(len(inside) / (end - start), 1),
        "longest_stall_ms": round(1000 * longest, 1),
        "longest_stall_at_s": round(at - start, 2),
        "stalls_over_100ms": sum(1 for g, _ in gaps if g > 0.1),
    }


async def _measure(url: str, window: float, log: Any) -> dict[str, Any]:
    stamps: list[float] = []
    app, wf = _app(url, stamps)
    await app.launch_async(concurrency=CLIENTS)
    stop = asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            await app.result_async(await app.start_async(wf), timeout_s=120)

    clients = [asyncio.create_task(client()) for _ in range(CLIENTS)]
    try:
        await asyncio.sleep(3)  # warm up
        base_start = time.monotonic()
        await asyncio.sleep(window)
        base_end = prune_start = time.monotonic()
        env = {**os.environ, "RATCHET_DATA_DIR": str(RESULTS / ".tmp")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ratchet.cli",
            "prune",
            "--finished-before",
            "30d",
            "--db",
            url,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate()
        prune_end = time.monotonic()
        if proc.returncode != 0:
            raise SystemExit(f"ratchet prune failed: {err.decode()}")
        log(out.decode().strip())
        await asyncio.sleep(window)  # a second baseline, after: the machine's drift
        after_end = time.monotonic()
    finally:
        stop.set()
        await asyncio.gather(*clients, return_exceptions=True)
        await app.shutdown_async()
    before = _phase(stamps, base_start, base_end)
    during = _phase(stamps, prune_start, prune_end)
    after = _phase(stamps, prune_end, after_end)
    baseline = (before["steps_per_s"] + after["steps_per_s"]) / 2
    drop = 100 * (1 - during["steps_per_s"] / baseline)
    return {
        "before": before,
        "during_prune": during,
        "after": after,
        "prune": out.decode().strip(),
        "throughput_drop_pct": round(drop, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--window", type=float, default=20.0, help="seconds of baseline before the prune starts"
    )
    args = parser.parse_args()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    name = f"ratchet_prune_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    try:
        app = ratchet.Ratchet(url)
        _ = app.store  # migrations
        app.shutdown()
        _seed(url, args.events, log)
        result = asyncio.run(_measure(url, args.window, log))
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    result |= {"events": args.events, "clients": CLIENTS, "steps_per_run": STEPS}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "prune.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
