"""What the wrapped LLM client adds to a call, against the bare SDK call and one commit.

``python -m bench.run --llm-overhead-only`` (and every ``make bench``, ``QUICK=1`` with fewer
calls) measures, on SQLite and on PostgreSQL: the median latency of chat completions sent
through ``ratchet.llm.wrap(openai.AsyncOpenAI())`` inside a workflow (each call one
journaled step: its ``step_started`` committed before the request, its response journaled
with the next boundary) and of the same calls through the bare ``AsyncOpenAI``, to the
same local provider (``ratchet.llm.server``, no delay, no fault); and, right beside, one
commit of the database (:mod:`bench.limit`, one client). The target: the wrapped call costs
at most one commit plus 100 µs more than the bare one.

The calls are interleaved in one workflow, each side going first every other time, so a
drift in the machine's speed touches both alike. The workflow runs in a process of its
own (``python -m bench.llm_overhead --calls ...``), the provider in the bench's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.peers.common import WARMUP_RUNS, clock, last_json

ROOT = Path(__file__).resolve().parents[1]
MODEL = "gpt-4.1-mini"
TARGET_EXTRA_US = 100.0  # beyond one commit


def _url(backend: str, db: str) -> str:
    return f"sqlite:///{db}" if backend == "sqlite" else db


def calls(backend: str, db: str, n: int, timeout: float) -> dict[str, Any]:
    """In this process: ``n`` wrapped and ``n`` bare calls, interleaved, in one workflow
    driven by a worker of concurrency 1; their medians in µs. The provider's address comes
    from ``OPENAI_BASE_URL``, as the SDK reads it for its users."""
    import openai

    import ratchet
    import ratchet.llm

    app = ratchet.Ratchet(_url(backend, db))
    wrapped = ratchet.llm.wrap(openai.AsyncOpenAI())
    bare = openai.AsyncOpenAI()

    async def timed(client: Any, i: int) -> float:
        t0 = clock()
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"ping {i}"}]
        )
        return (clock() - t0) * 1e6

    @app.workflow(name="llm_overhead", guards=ratchet.Guards(max_steps=None))
    async def overhead(n: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"wrapped": [], "bare": []}
        for i in range(n + WARMUP_RUNS):
            order = ("wrapped", "bare") if i % 2 else ("bare", "wrapped")
            for side in order:
                us = await timed(wrapped if side == "wrapped" else bare, i)
                if i >= WARMUP_RUNS:
                    out[side].append(us)
        return out

    async def main() -> dict[str, list[float]]:
        worker = app.worker(concurrency=1)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        await worker.started.wait()
        try:
            result: dict[str, list[float]] = await app.result_async(
                await app.start_async(overhead, n), timeout_s=timeout
            )
            return result
        finally:
            stop.set()
            await task

    samples = asyncio.run(main())
    wrapped_us = statistics.median(samples["wrapped"])
    bare_us = statistics.median(samples["bare"])
    return {
        "backend": backend,
        "n": n,
        "wrapped_us": round(wrapped_us, 1),
        "bare_us": round(bare_us, 1),
        "overhead_us": round(wrapped_us - bare_us, 1),
    }


def _commit_us(backend: str, db: str, seconds: float) -> float | None:
    argv = [
        sys.executable,
        "-m",
        "bench.limit",
        "--backend",
        backend,
        "--db",
        db,
        "--clients",
        "1",
        "--seconds",
        str(seconds),
    ]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=seconds * 4 + 60)
    value = last_json(done.stdout, done.stderr).get("commit_us")
    return float(value) if isinstance(value, int | float) else None


def measure(
    backend: str, db: str, limit_db: str, n: int, timeout: float, limit_seconds: float = 1.0
) -> dict[str, Any]:
    """One sample on ``backend``: the calls (database ``db``) in a child process against a
    provider served from here, then one commit's µs on ``limit_db``."""
    from ratchet.llm.server import LocalProvider, serve

    provider = LocalProvider()
    with serve(provider) as base:
        argv = [
            sys.executable,
            "-m",
            "bench.llm_overhead",
            "--calls",
            "--backend",
            backend,
            "--db",
            db,
            "--n",
            str(n),
            "--timeout",
            str(timeout),
        ]
        env = {**os.environ, "OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": "local"}
        try:
            done = subprocess.run(
                argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout + 30
            )
        except subprocess.TimeoutExpired:
            return {"backend": backend, "error": f"no answer within {timeout + 30:g} s"}
        faults = provider.stats()["faults"]
    answer = last_json(done.stdout, done.stderr)
    if faults:
        return {
            "backend": backend,
            "error": f"the provider applied {faults} fault(s) during the run",
        }
    if "wrapped_us" not in answer:
        return {"backend": backend, **answer}
    commit = _commit_us(backend, limit_db, limit_seconds)
    if commit is None:
        return {**answer, "error": "the commit limit gave no figure"}
    return {
        **answer,
        "commit_us": round(commit, 1),
        "setting": (
            "SQLite (WAL, synchronous=FULL)"
            if backend == "sqlite"
            else "PostgreSQL (fsync=on, synchronous_commit=on)"
        )
        + "; each wrapped call one journaled step",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--calls",
        action="store_true",
        help="run the calls in this process (the provider is elsewhere)",
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres"), required=True)
    parser.add_argument("--db", required=True, help="SQLite file path or PostgreSQL URL")
    parser.add_argument("--n", type=int, default=300, help="calls of each kind")
    parser.add_argument("--timeout", type=float, default=110.0)
    parser.add_argument("--limit-db", help="database for the commit measure (not --calls)")
    args = parser.parse_args()
    if args.n < 1:
        parser.error(f"--n must be at least 1, got {args.n}")
    if args.calls:
        print(json.dumps(calls(args.backend, args.db, args.n, args.timeout)))
        return
    if not args.limit_db:
        parser.error("--limit-db is needed to measure one commit")
    print(json.dumps(measure(args.backend, args.db, args.limit_db, args.n, args.timeout)))


if __name__ == "__main__":
    main()
