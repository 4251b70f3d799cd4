"""Agent scale: N runs started at once, each making 3 model calls that take 1 s, driven by
one worker process with concurrency N (the ideal: everything done 3 s after the starts).

A model call is a step that awaits a one-second ``asyncio.sleep`` (the wait of a slow
model, with no network in the way), so what is measured is the engine: starting N runs,
claiming them, journaling 3 steps each, parking N coroutines on timers and finishing N
runs. Per system and backend it reports the time to start all N (one ``app.start_many``
call for Ratchet; a ``DBOSClient.enqueue`` per workflow for DBOS, which has no batch
enqueue), the time from the first start and from the last start to all done, and the
worker's peak RSS (``VmHWM``).

The client (this process) and the worker (a process of its own, started first and ready
before the clock starts) share the database. "All done" is seen by counting finished runs
every 25 ms.

``python -m bench.agent_scale --system ratchet --backend sqlite --n 2000 --db PATH``
prints one JSON object; :func:`measure` is what ``bench.run`` calls.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.peers.common import last_json

CALLS = 3
CALL_S = 1.0
DONE_POLL_S = 0.025
DBOS_QUEUE = "agents"
DBOS_POLL_S = 0.1  # the queue's polling interval (DBOS's default is 1 s)


# -- Ratchet ------------------------------------------------------------------------------


def ratchet_app(url: str) -> tuple[Any, Any]:
    import ratchet

    app = ratchet.Ratchet(url)

    @app.step
    async def call_model(turn: int) -> str:
        await asyncio.sleep(CALL_S)  # the model thinking
        return f"reply {turn}"

    @app.workflow(name="agent")
    async def agent(i: int) -> str:
        reply = ""
        for turn in range(1, CALLS + 1):
            reply = await call_model(turn)
        return reply

    return app, agent


class _GcClock:
    """The worker's CPU time (every thread) from ready on, and how much of it went to the
    cyclic garbage collector, by generation."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._began = 0.0
        self._cpu = time.process_time()
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._began
            self.count[info["generation"]] += 1

    def report(self) -> dict[str, Any]:
        return {
            "cpu_s": round(time.process_time() - self._cpu, 2),
            "gc_s": round(sum(self.seconds), 3),
            "gc_by_generation": [
                f"{c}x {s:.3f}s" for c, s in zip(self.count, self.seconds, strict=True)
            ],
        }


async def _ratchet_worker(url: str, n: int) -> None:
    app, _ = ratchet_app(url)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await app.launch_async(concurrency=n)
    clock = _GcClock()
    print("ready", flush=True)
    await stop.wait()
    print(json.dumps(clock.report()), flush=True)
    await app.shutdown_async()


def _ratchet_client(
    url: str, n: int, worker: subprocess.Popen[str], timeout: float
) -> dict[str, Any]:
    app, agent = ratchet_app(url)
    try:
        app.store  # noqa: B018 - connected before the clock starts
        first = time.perf_counter()
        ids = app.start_many(agent, [(i,) for i in range(n)])
        last = time.perf_counter()
        assert len(ids) == n
        done = _wait_done(
            lambda: app.count_runs("succeeded") + app.count_runs("failed"), n, last, timeout
        )
        failed = app.count_runs("failed")
    finally:
        app.shutdown()
    return _figures(
        first,
        last,
        done,
        worker,
        failed=failed,
        setting=f"app.start_many of {n:,} runs; worker concurrency {n:,}",
    )


# -- DBOS ---------------------------------------------------------------------------------


def _dbos_url(backend: str, db: str) -> str:
    return f"sqlite:///{os.path.abspath(db)}" if backend == "sqlite" else db


def _dbos_worker(backend: str, db: str, n: int) -> None:
    from dbos import DBOS

    from bench.peers import dbos_peer

    @DBOS.step()
    async def call_model(turn: int) -> str:
        await asyncio.sleep(CALL_S)
        return f"reply {turn}"

    @DBOS.workflow()
    async def agent(i: int) -> str:
        reply = ""
        for turn in range(1, CALLS + 1):
            reply = await call_model(turn)
        return reply

    dbos_peer.launch(
        argparse.Namespace(
            backend=backend, db=db, variant="wal" if backend == "sqlite" else "default"
        )
    )
    DBOS.register_queue(DBOS_QUEUE, worker_concurrency=n, polling_interval_sec=DBOS_POLL_S)
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM})
    os._exit(0)


def _dbos_client(
    backend: str, db: str, n: int, worker: subprocess.Popen[str], timeout: float
) -> dict[str, Any]:
    from dbos import DBOSClient
    from sqlalchemy import text

    client = DBOSClient(system_database_url=_dbos_url(backend, db))
    table = "workflow_status" if backend == "sqlite" else "dbos.workflow_status"
    engine = client._sys_db.engine

    def finished() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        f"SELECT count(*) FROM {table} WHERE status IN ('SUCCESS', 'ERROR') "
                        "AND name LIKE '%agent'"
                    )
                ).scalar()
                or 0
            )

    options: Any = {"workflow_name": "_dbos_worker.<locals>.agent", "queue_name": DBOS_QUEUE}
    try:
        first = time.perf_counter()
        for i in range(n):
            client.enqueue(options, i)
        last = time.perf_counter()
        done = _wait_done(finished, n, last, timeout)
        with engine.connect() as conn:
            failed = int(
                conn.execute(text(f"SELECT count(*) FROM {table} WHERE status = 'ERROR'")).scalar()
                or 0
            )
    finally:
        client.destroy()
    return _figures(
        first,
        last,
        done,
        worker,
        failed=failed,
        setting=f"DBOSClient.enqueue x {n:,} (no batch enqueue); "
        f"Queue(worker_concurrency={n:,}, polling_interval_sec="
        f"{DBOS_POLL_S})" + ("; WAL" if backend == "sqlite" else ""),
    )


# -- the measure --------------------------------------------------------------------------


def _wait_done(count: Any, n: int, since: float, timeout: float) -> float | None:
    deadline = since + timeout
    while time.perf_counter() < deadline:
        if count() >= n:
            return time.perf_counter()
        time.sleep(DONE_POLL_S)
    return None


def _peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _figures(
    first: float,
    last: float,
    done: float | None,
    worker: subprocess.Popen[str],
    *,
    failed: int,
    setting: str,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "start_s": round(last - first, 3),
        "setting": setting,
        "peak_rss_mb": _peak_rss_mb(worker.pid),
        "model_call": f"{CALLS} steps awaiting asyncio.sleep({CALL_S:g})",
    }
    if done is None:
        out["error"] = "not all runs finished within the timeout"
        return out
    out |= {"from_first_s": round(done - first, 3), "from_last_s": round(done - last, 3)}
    if failed:
        out["error"] = f"{failed} runs failed"
    return out


def measure(system: str, backend: str, db: str, n: int, timeout: float) -> dict[str, Any]:
    """One measure in fresh processes (this module as the client, and its worker)."""
    argv = [
        sys.executable,
        "-m",
        "bench.agent_scale",
        "--system",
        system,
        "--backend",
        backend,
        "--db",
        db,
        "--n",
        str(n),
        "--timeout",
        str(timeout),
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {timeout + 60:g} s", "n": n}
    return last_json(done.stdout, done.stderr) | {"n": n}


def _run(args: argparse.Namespace) -> dict[str, Any]:
    worker_said: dict[str, Any] = {}
    answer = _measure(args, worker_said)
    return answer | {"worker_" + k: v for k, v in worker_said.items()}


def _measure(args: argparse.Namespace, worker_said: dict[str, Any]) -> dict[str, Any]:
    url = (
        f"sqlite:///{args.db}" if args.backend == "sqlite" and args.system == "ratchet" else args.db
    )
    argv = [
        sys.executable,
        "-m",
        "bench.agent_scale",
        "--worker",
        "--system",
        args.system,
        "--backend",
        args.backend,
        "--db",
        args.db,
        "--n",
        str(args.n),
    ]
    worker = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    spy = None
    try:
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "ready":
            return {"error": "the worker did not start"}
        if args.profile:  # the worker under py-spy: collapsed stacks, for flame graphs
            spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "-o",
                    args.profile,
                    "--pid",
                    str(worker.pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # attached
        if args.system == "ratchet":
            return _ratchet_client(url, args.n, worker, args.timeout)
        return _dbos_client(args.backend, args.db, args.n, worker, args.timeout)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        if worker.stdout is not None:
            said = last_json(worker.stdout.read(), "")  # the worker's own figures (GC)
            if "gc_s" in said:
                worker_said.update(said)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", choices=("ratchet", "dbos"), default="ratchet")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--db", required=True, help="a SQLite file or a PostgreSQL URL")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--profile", help="record the worker with py-spy into this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.system == "ratchet":
            url = f"sqlite:///{args.db}" if args.backend == "sqlite" else args.db
            asyncio.run(_ratchet_worker(url, args.n))
        else:
            _dbos_worker(args.backend, args.db, args.n)
        return
    print(json.dumps(_run(args)), flush=True)


if __name__ == "__main__":
    main()
