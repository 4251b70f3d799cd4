"""Ratchet under the same measures as its peers (see bench/peers/common.py).

Ratchet runs with its defaults: SQLite in WAL mode with ``synchronous=FULL``, PostgreSQL
with the server's ``fsync=on``/``synchronous_commit=on``; the worker runs in the measuring
process (as DBOS's does), concurrency 64 for the concurrent measure. Recovery uses a
stable worker id, so a restarted worker reclaims its run at once; ``takeover`` measures a
second, already-running worker taking the run after the first is killed, with the default
settings (it sees the death; the lease TTL and the sweep do not come into it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ratchet
import ratchet.store.postgres  # imported up front, as the peers' drivers are: engine start
import ratchet.store.sqlite  # is opening the store, not loading Python modules
from bench.peers.common import (
    WARMUP_RUNS,
    Probe,
    Result,
    clock,
    latency_summary,
    ms,
    peak_rss_mb,
    run,
    run_replay,
    stable_id,
    write_marker,
)
from ratchet.config import DEFAULT_LEASE_TTL, DEFAULT_RECOVERY_INTERVAL
from ratchet.model import NewRun

WORKER_ID = "bench-worker"


def _url(args: argparse.Namespace) -> str:
    return f"sqlite:///{args.db}" if args.backend == "sqlite" else str(args.db)


def _app(
    args: argparse.Namespace,
    probe: Probe | None = None,
    *,
    lease_ttl: float | None = None,
    recovery_interval: float | None = 0.5,
    block: bool = False,
) -> tuple[ratchet.Ratchet, ratchet.WorkflowDef]:
    """An app with one workflow of ``--steps`` no-op steps. With ``block``, step
    ``--kill-at`` writes the marker and blocks the first time it runs (no marker yet).
    The lease TTL is ``lease_ttl``, else ``RATCHET_LEASE_TTL``, else the default; the
    recovery interval ``recovery_interval`` (None: the default)."""
    app = ratchet.Ratchet(_url(args), lease_ttl=lease_ttl, recovery_interval=recovery_interval)
    steps, kill_at, marker = args.steps, args.kill_at, args.marker

    @app.step()
    async def noop(i: int) -> int:
        if probe is not None:
            probe.mark(f"step{i}")
        if block and i == kill_at and not os.path.exists(marker):
            write_marker(marker)
            await asyncio.sleep(3600)
        return i

    # The replay bench builds runs of 10,000 steps on purpose: no step limit for them.
    @app.workflow(name="bench", guards=ratchet.Guards(max_steps=None))
    async def bench() -> int:
        for i in range(1, steps + 1):
            await noop(i)
        return steps

    return app, bench


async def _with_worker(app: ratchet.Ratchet, body: Any, **options: Any) -> Any:
    worker = app.worker(**options)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await worker.started.wait()
    try:
        return await body()
    finally:
        stop.set()
        await task


def sequential(args: argparse.Namespace) -> Result:
    app, wf = _app(args)

    async def body() -> float:
        for _ in range(WARMUP_RUNS):
            await app.result_async(await app.start_async(wf))
        started = clock()
        for _ in range(args.n):
            await app.result_async(await app.start_async(wf))
        return clock() - started

    seconds = asyncio.run(_with_worker(app, body, concurrency=1))
    return {"seconds": seconds, "n": args.n, "steps": args.steps}


def concurrent(args: argparse.Namespace) -> Result:
    app, wf = _app(args)
    concurrency = args.concurrency or 64

    async def one(t0: float) -> float:
        await app.result_async(await app.start_async(wf))
        return clock() - t0

    async def body() -> tuple[float, list[float]]:
        started = clock()
        latencies = await asyncio.gather(*(one(started) for _ in range(args.n)))
        return clock() - started, [ms(x) for x in latencies]

    seconds, latencies = asyncio.run(_with_worker(app, body, concurrency=concurrency))
    return {
        "seconds": seconds,
        "steps_per_s": args.n * args.steps / seconds,
        "setting": f"one worker, concurrency {concurrency}",
        **latency_summary(latencies),
    }


def recovery_crash(args: argparse.Namespace) -> Result:
    app, wf = _app(args, block=True)

    async def body() -> None:
        await app.start_async(wf, run_id=stable_id("ratchet", args.marker))
        await asyncio.sleep(3600)  # step --kill-at blocks; the orchestrator kills us

    asyncio.run(_with_worker(app, body, worker_id=WORKER_ID))
    return {"error": "the blocking step was never killed"}


def recovery_resume(args: argparse.Namespace) -> Result:
    probe = Probe()
    started = clock()  # the new worker's engine starts here: store opened, worker launched
    app, _ = _app(args, probe, block=True)
    run_id = stable_id("ratchet", args.marker)

    async def body() -> None:
        await app.result_async(run_id)

    asyncio.run(_with_worker(app, body, worker_id=WORKER_ID))
    done = clock()
    return {
        "to_step5_ms": ms(probe.wait(f"step{args.kill_at}", 0) - started),
        "to_result_ms": ms(done - started),
        "peak_rss_mb": peak_rss_mb(),
    }


def takeover(args: argparse.Namespace) -> Result:
    """Worker A (a child process) is killed in step --kill-at; this process's worker B,
    already running with the default settings (lease TTL 15 s, sweep 30 s), sees A die and
    takes its run over."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    marker = str(workdir / "takeover.marker")
    argv = [
        sys.executable,
        "-m",
        "bench.peers.ratchet_peer",
        "recovery-crash",
        "--backend",
        args.backend,
        "--db",
        args.db,
        "--steps",
        str(args.steps),
        "--kill-at",
        str(args.kill_at),
        "--marker",
        marker,
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RATCHET_LEASE_TTL",)}
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(marker):
            if child.poll() is not None:
                return {"error": "worker A exited before reaching the blocking step"}
            time.sleep(0.005)
        probe = Probe()
        args.marker = marker
        app, _ = _app(args, probe, recovery_interval=None, block=True)
        run_id = stable_id("ratchet", marker)

        async def body() -> float:
            child.send_signal(signal.SIGKILL)
            killed = clock()
            child.wait()
            await app.result_async(run_id)
            return killed

        killed = asyncio.run(_with_worker(app, body, worker_id="bench-worker-b"))
        return {
            "takeover_ms": ms(probe.wait(f"step{args.kill_at}", 0) - killed),
            "lease_ttl_s": DEFAULT_LEASE_TTL,
            "sweep_s": DEFAULT_RECOVERY_INTERVAL,
        }
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for path in workdir.iterdir():
            path.unlink()
        workdir.rmdir()


def _graph_app(
    args: argparse.Namespace, probe: Probe | None = None, *, block: bool = False
) -> ratchet.Ratchet:
    """An app with graph ``chain``: a loop of ``--steps`` iterations over a tool node. With
    ``block``, iteration ``--kill-at`` (counted from 1) writes the marker and blocks the
    first time it runs (no marker yet)."""
    app = ratchet.Ratchet(_url(args), recovery_interval=0.5)
    kill_at, marker = args.kill_at, args.marker

    @app.tool
    async def tick(i: int) -> int:
        if probe is not None:
            probe.mark(f"tick{i}")
        if block and i == kill_at and not os.path.exists(marker):
            write_marker(marker)
            await asyncio.sleep(3600)
        return i

    app.graph(
        {
            "name": "chain",
            "guards": {"max_steps": None},
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "each",
                    "type": "loop",
                    "data": {
                        "over": "{{ input.items }}",
                        "item": "i",
                        "body": ["tick"],
                        "max_iterations": args.steps,
                    },
                },
                {"id": "tick", "type": "tool", "data": {"tool": "tick", "args": {"i": "{{ i }}"}}},
            ],
            "edges": [{"from": "start", "to": "each"}, {"from": "each", "to": "tick"}],
        }
    )
    return app


def graph_crash(args: argparse.Namespace) -> Result:
    app = _graph_app(args, block=True)

    async def body() -> None:
        await app.start_async(
            "chain",
            {"items": list(range(1, args.steps + 1))},
            run_id=stable_id("ratchet-graph", args.marker),
        )
        await asyncio.sleep(3600)  # iteration --kill-at blocks; the orchestrator kills us

    asyncio.run(_with_worker(app, body, worker_id=WORKER_ID))
    return {"error": "the blocking node was never killed"}


def graph_resume(args: argparse.Namespace) -> Result:
    """The graph run's worker restarts: time from the engine's start to the open node
    (iteration --kill-at) starting again, and to the result."""
    probe = Probe()
    started = clock()
    app = _graph_app(args, probe, block=True)
    run_id = stable_id("ratchet-graph", args.marker)

    async def body() -> None:
        await app.result_async(run_id)

    asyncio.run(_with_worker(app, body, worker_id=WORKER_ID))
    done = clock()
    return {
        "to_open_node_ms": ms(probe.wait(f"tick{args.kill_at}", 0) - started),
        "to_result_ms": ms(done - started),
        "peak_rss_mb": peak_rss_mb(),
    }


def replay(args: argparse.Namespace) -> Result:
    return run_replay(args, "bench.peers.ratchet_peer")


def pickup(args: argparse.Namespace) -> Result:
    args.steps = 1
    probe = Probe()
    app, wf = _app(args, probe)

    async def body() -> list[float]:
        samples = []
        for i in range(args.n + WARMUP_RUNS):
            probe.reset("step1")
            await asyncio.sleep(0.05)  # the worker is idle and waiting again
            run_id = await app.start_async(wf)
            returned = clock()
            await app.result_async(run_id)
            if i >= WARMUP_RUNS:
                samples.append(ms(probe.times["step1"] - returned))
        return samples

    samples = asyncio.run(_with_worker(app, body))
    return {
        **latency_summary(samples),
        "n": args.n,
        "setting": "LISTEN/NOTIFY" if args.backend == "postgres" else "in-process wake-up",
    }


def claim_backlog(args: argparse.Namespace) -> Result:
    """Claim latency with ``--n`` runs in the database, half queued, half waiting on a
    timer an hour ahead: each sample claims one run from the head of the queue."""
    app, wf = _app(args)
    samples_n = 40

    async def body() -> list[float]:
        store = await app._astore()
        half = args.n // 2
        if args.backend == "postgres":
            fill = (
                "INSERT INTO runs (run_id, workflow, workflow_version, input, status, "
                "priority, not_before, created_at, updated_at) SELECT 'b' || i, %s, %s, "
                "'{}', CASE WHEN i <= %s THEN 'queued' ELSE 'waiting' END, 0, CASE WHEN "
                "i <= %s THEN NULL ELSE ratchet_now() + interval '1 hour' END, "
                "to_timestamp(i), to_timestamp(i) FROM generate_series(1, %s) i"
            )
        else:
            fill = (
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                "WHERE i < ?) INSERT INTO runs (run_id, workflow, workflow_version, input, "
                "status, priority, not_before, created_at, updated_at) SELECT 'b' || i, ?, "
                "?, '{}', CASE WHEN i <= ? THEN 'queued' ELSE 'waiting' END, 0, CASE WHEN "
                "i <= ? THEN NULL ELSE ratchet_now() + 3600 END, i, i FROM n"
            )
        params = (
            (wf.name, wf.version, half, half, args.n)
            if args.backend == "postgres"
            else (args.n, wf.name, wf.version, half, half)
        )
        if args.n:
            await store._run(lambda tx: tx._cur.execute(fill, params))
        # The runs the samples claim, at the head of the queue (older than the backlog), so
        # every sample claims one run whatever N is.
        for i in range(samples_n + WARMUP_RUNS):
            await store.create_run(
                NewRun(f"head-{i}", wf.name, wf.version, {"args": [], "kwargs": {}})
            )
        older = (
            "-created_at"
            if args.backend == "sqlite"  # timestamptz on PostgreSQL
            else "to_timestamp(-extract(epoch FROM created_at))"
        )
        await store._run(
            lambda tx: tx._cur.execute(
                f"UPDATE runs SET created_at = {older} WHERE run_id LIKE 'head-%'"
            )
        )
        if args.backend == "postgres":
            await store._run(lambda tx: tx._cur.execute("ANALYZE runs"))
        served = [(wf.name, wf.version)]
        samples = []
        for _ in range(samples_n + WARMUP_RUNS):
            t0 = clock()
            await store.claim(WORKER_ID, 30.0, 1, ["default"], served)
            samples.append(ms(clock() - t0))
        return samples[WARMUP_RUNS:]

    samples = asyncio.run(body())
    return {**latency_summary(samples), "backlog": args.n, "samples": samples_n}


MEASURES = {
    "claim-backlog": claim_backlog,
    "sequential": sequential,
    "concurrent": concurrent,
    "recovery-crash": recovery_crash,
    "recovery-resume": recovery_resume,
    "replay": replay,
    "graph-crash": graph_crash,
    "graph-resume": graph_resume,
    "pickup": pickup,
    "takeover": takeover,
}

if __name__ == "__main__":
    run("ratchet", MEASURES)
