"""Absurd (absurd-sdk, sync client) as a benchmark peer. Absurd is Postgres-only.

Schema: absurd-sdk does not ship ``absurd.sql``; the ``absurdctl`` package of the same
version bundles it (``absurdctl.BUNDLED_SCHEMA_SQL``, what ``absurdctl init`` applies). It is
installed into the ``--db`` database on first use, and a queue ``bench`` is created.

Durability: the client runs in autocommit, so spawning a task, every step checkpoint
(``absurd.set_task_checkpoint_state``) and completing a run are each their own committed
transaction; the server's ``fsync=on`` and ``synchronous_commit=on`` make each commit
durable before the call returns (reported under ``durability``).

Recovery is Absurd's own: a run's claim (lease) expires ``--lease`` seconds after its last
checkpoint, and the next ``claim_task`` of any worker fails the expired run and claims the
retry, which replays finished steps from their checkpoints. ``takeover`` is the same
mechanism with a second worker already polling.

A sync client holds one connection that its worker threads share, so ``concurrent`` runs
``--workers`` clients (32 by default), each with its own connection and worker thread.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import math
import os
import random
import tempfile
import threading
import time
from typing import Any

import psycopg
from absurd_sdk import Absurd

from bench.peers import common
from bench.peers.common import Probe, Result, clock, ms

QUEUE = "bench"
TASK_TABLE = f"t_{QUEUE}"  # Absurd keeps each queue in tables named <prefix>_<queue>
RUN_TABLE = f"r_{QUEUE}"
PROBE = Probe()
DEFAULT_POLL_S = 0.25  # start_worker's default poll_interval
DEFAULT_LEASE_S = 15
REPLAY_LEASE_S = 5  # replay waits the lease out before resuming; shorter keeps the run short
TAKEOVER_LEASE_S = 2
DURABILITY: dict[str, Any] = {"commits": "autocommit: one transaction per Absurd call"}


def chain(params: dict[str, Any], ctx: Any) -> int:
    x: int = params["x"]
    probe = params.get("probe", False)
    for i in range(params["steps"]):
        if i == 0 and probe:
            x = ctx.step("s1", lambda x=x: _first(x, ctx.task_id))
        else:
            x = ctx.step(f"s{i + 1}", lambda x=x: x)
    if probe:
        PROBE.mark(f"done:{ctx.task_id}")
    return x


def _first(x: int, task_id: Any) -> int:
    PROBE.mark(f"first:{task_id}")
    return x


def recoverable(params: dict[str, Any], ctx: Any) -> int:
    x, marker = 0, params["marker"]
    for i in range(1, params["steps"] + 1):
        if i == params["kill_at"]:
            x = ctx.step(f"s{i}", lambda x=x: _blocking(x, marker))
        else:
            x = ctx.step(f"s{i}", lambda x=x: x)
    return x


def _blocking(x: int, marker: str) -> int:
    if os.path.exists(marker):
        PROBE.mark("kill_step")
        return x
    common.write_marker(marker)
    common.block_forever()


def _scalar(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    return row[0] if row else None


def install_schema(url: str) -> str:
    """Apply the bundled ``absurd.sql`` unless the schema is there; return its version."""
    import absurdctl  # type: ignore[import-untyped]

    with psycopg.connect(url, autocommit=True) as conn:
        if _scalar(conn, "SELECT to_regnamespace('absurd')") is None:
            conn.execute(absurdctl.BUNDLED_SCHEMA_SQL)
        conn.execute("SELECT absurd.create_queue(%s)", (QUEUE,))
        return str(_scalar(conn, "SELECT absurd.get_schema_version()"))


def client(url: str) -> Absurd:
    app = Absurd(url, queue_name=QUEUE)
    app.register_task(name="chain")(chain)
    app.register_task(name="recoverable")(recoverable)
    return app


def start_worker(app: Absurd, name: str, **options: Any) -> threading.Thread:
    thread = threading.Thread(
        target=app.start_worker, kwargs={"worker_id": name, **options}, daemon=True
    )
    thread.start()
    return thread


def context(args: argparse.Namespace) -> Result | None:
    """Check the backend and install the schema; a result here means: stop with it."""
    if args.backend != "postgres":
        return {"skipped": "Absurd runs on PostgreSQL only"}
    if importlib.util.find_spec("absurdctl") is None:
        return {"skipped": "absurd-sdk does not ship absurd.sql; install absurdctl for it"}
    DURABILITY.update(common.pg_durability(args.db))
    DURABILITY["schema"] = install_schema(args.db)
    DURABILITY["sdk"] = importlib.metadata.version("absurd-sdk")
    return None


def wait_completed(conn: psycopg.Connection[Any], task_ids: list[Any]) -> None:
    """Poll the queue's task table until every task is ``completed``."""
    sql = f"SELECT count(*) FROM absurd.{TASK_TABLE} WHERE task_id = ANY(%s) AND state = %s"
    while _scalar(conn, sql, (task_ids, "completed")) < len(task_ids):
        time.sleep(0.005)


def sequential(args: argparse.Namespace) -> Result:
    if (stop := context(args)) is not None:
        return stop
    app = client(args.db)

    def run_one() -> None:
        task_id = app.spawn("chain", {"x": 1, "steps": args.steps})["task_id"]
        app.work_batch(worker_id="bench-seq", claim_timeout=DEFAULT_LEASE_S)
        snapshot = app.fetch_task_result(task_id)
        if snapshot is None or snapshot.state != "completed":
            raise RuntimeError(f"task {task_id} did not complete: {snapshot}")

    for _ in range(common.WARMUP_RUNS):
        run_one()
    started = clock()
    for _ in range(args.n):
        run_one()
    seconds = clock() - started
    return {
        "seconds": seconds,
        "n": args.n,
        "steps": args.steps,
        "setting": "spawn, work_batch in the calling thread, fetch_task_result",
        "durability": DURABILITY,
    }


def concurrent(args: argparse.Namespace) -> Result:
    if (stop := context(args)) is not None:
        return stop
    workers = args.workers or 32
    per_worker = args.concurrency or 1
    poll = args.poll_interval or DEFAULT_POLL_S
    for i in range(workers):
        start_worker(
            client(args.db),
            f"bench-c{i}",
            concurrency=per_worker,
            poll_interval=poll,
            claim_timeout=DEFAULT_LEASE_S,
        )
    app = client(args.db)
    warm = app.spawn("chain", {"x": 1, "steps": 1})["task_id"]
    with psycopg.connect(args.db, autocommit=True) as conn:
        wait_completed(conn, [warm])
        started_at: dict[str, float] = {}
        t0 = clock()
        for _ in range(args.n):
            spawned_at = clock()
            task = app.spawn("chain", {"x": 1, "steps": args.steps, "probe": True})
            started_at[str(task["task_id"])] = spawned_at
        wait_completed(conn, list(started_at))
        wall = clock() - t0
    latencies = [ms(PROBE.times[f"done:{t}"] - s) for t, s in started_at.items()]
    return {
        "seconds": wall,
        "n": args.n,
        "steps": args.steps,
        "steps_per_s": args.n * args.steps / wall,
        "setting": (
            f"{workers} Absurd clients (one connection each), "
            f"start_worker(concurrency={per_worker}, poll_interval={poll})"
        ),
        "latency": "start call -> task body returned (in process)",
        **common.latency_summary(latencies),
        "durability": DURABILITY,
    }


def _task_id(conn: psycopg.Connection[Any], key: str) -> Any:
    sql = f"SELECT task_id FROM absurd.{TASK_TABLE} WHERE idempotency_key = %s"
    return _scalar(conn, sql, (key,))


def _lease_left_s(conn: psycopg.Connection[Any], task_id: Any) -> float:
    """Seconds until the claim of the task's running run expires (0 if none is running)."""
    sql = (
        "SELECT extract(epoch FROM max(claim_expires_at) - clock_timestamp()) "
        f"FROM absurd.{RUN_TABLE} WHERE task_id = %s AND state = 'running'"
    )
    left = _scalar(conn, sql, (task_id,))
    return max(float(left), 0.0) if left is not None else 0.0


def lease(args: argparse.Namespace) -> int:
    return math.ceil(args.lease) if args.lease else DEFAULT_LEASE_S


def recovery_crash(args: argparse.Namespace) -> Result:
    if (stop := context(args)) is not None:
        return stop
    if os.path.exists(args.marker):
        os.unlink(args.marker)
    app = client(args.db)
    params = {"steps": args.steps, "kill_at": args.kill_at, "marker": args.marker}
    app.spawn("recoverable", params, idempotency_key=common.stable_id("absurd", args.marker))
    app.start_worker(
        worker_id="bench-crash",
        claim_timeout=lease(args),
        poll_interval=args.poll_interval or DEFAULT_POLL_S,
    )
    return {"error": "the worker stopped; the process was not killed"}


def recovery_resume(args: argparse.Namespace) -> Result:
    if (stop := context(args)) is not None:
        return stop
    with psycopg.connect(args.db, autocommit=True) as conn:
        task_id = _task_id(conn, common.stable_id("absurd", args.marker))
        if task_id is None:
            return {"error": "no task for this marker: run recovery-crash first"}
        lease_left = _lease_left_s(conn, task_id)
        t0 = clock()
        poll = args.poll_interval or DEFAULT_POLL_S
        start_worker(client(args.db), "bench-resume", poll_interval=poll, claim_timeout=lease(args))
        step_at = PROBE.wait("kill_step", timeout=args.timeout)
        wait_completed(conn, [task_id])
        done_at = clock()
    return {
        "to_step5_ms": ms(step_at - t0),
        "to_result_ms": ms(done_at - t0),
        "kill_at": args.kill_at,
        "lease_wait_ms": ms(lease_left),
        "peak_rss_mb": common.peak_rss_mb(),
        "recovery": (
            f"worker (poll_interval={poll}) reclaims the run once its "
            f"{lease(args)} s claim has expired"
        ),
        "durability": DURABILITY,
    }


def replay(args: argparse.Namespace) -> Result:
    if (stop := context(args)) is not None:
        return stop
    args.lease = args.lease or REPLAY_LEASE_S

    def wait_out_lease(marker: str) -> None:
        with psycopg.connect(args.db, autocommit=True) as conn:
            task_id = _task_id(conn, common.stable_id("absurd", marker))
            time.sleep(_lease_left_s(conn, task_id) + 0.05)

    result = common.run_replay(args, "bench.peers.absurd_peer", before_resume=wait_out_lease)
    if "to_last_step_ms" in result:
        result["lease"] = f"{args.lease:g} s claim waited out before the resume process (not timed)"
    return result


def pickup(args: argparse.Namespace) -> Result:
    if (stop := context(args)) is not None:
        return stop
    poll = args.poll_interval or DEFAULT_POLL_S
    start_worker(client(args.db), "bench-pickup", poll_interval=poll, claim_timeout=DEFAULT_LEASE_S)
    app = client(args.db)
    latencies = []
    with psycopg.connect(args.db, autocommit=True) as conn:
        wait_completed(conn, [app.spawn("chain", {"x": 1, "steps": 1})["task_id"]])
        for _ in range(args.n):
            time.sleep(random.uniform(0.0, poll))  # a random phase of the polling cycle
            task_id = app.spawn("chain", {"x": 1, "steps": 1, "probe": True})["task_id"]
            returned = clock()
            first = PROBE.wait(f"first:{task_id}", timeout=args.timeout)
            latencies.append(ms(first - returned))
            wait_completed(conn, [task_id])
    return {
        "n": args.n,
        **common.latency_summary(latencies),
        "setting": f"start_worker(poll_interval={poll}) idle in a thread",
        "durability": DURABILITY,
    }


def takeover(args: argparse.Namespace) -> Result:
    """Worker B, already polling in this process, takes over once worker A (a child
    process, SIGKILLed in step ``--kill-at``) lets its claim expire."""
    if (stop := context(args)) is not None:
        return stop
    args.lease = args.lease or TAKEOVER_LEASE_S
    poll = args.poll_interval or DEFAULT_POLL_S
    deadline = time.monotonic() + args.timeout - 5.0
    with tempfile.TemporaryDirectory(prefix="bench-takeover-") as workdir:
        worker_a = common.CrashedChild(args, "bench.peers.absurd_peer", workdir)
        try:
            worker_a.start(deadline)
        except RuntimeError as exc:
            return {"error": str(exc)}
        start_worker(client(args.db), "bench-b", poll_interval=poll, claim_timeout=lease(args))
        killed = worker_a.kill()
        step_at = PROBE.wait("kill_step", timeout=max(deadline - time.monotonic(), 1.0))
    return {
        "takeover_ms": ms(step_at - killed),
        "lease_ttl_s": lease(args),
        "poll_interval_s": poll,
        "setting": "claim expiry; worker B's claim_task fails A's run and claims the retry",
    }


MEASURES = {
    "sequential": sequential,
    "concurrent": concurrent,
    "recovery-crash": recovery_crash,
    "recovery-resume": recovery_resume,
    "replay": replay,
    "pickup": pickup,
    "takeover": takeover,
}

if __name__ == "__main__":
    common.run("absurd", MEASURES)
