"""DBOS Transact as a benchmark peer, on a SQLite or a Postgres system database.

Durability: every DBOS step commits its output to the system database before the next
step runs. On SQLite each connection DBOS opens gets ``PRAGMA synchronous=FULL`` (fsync on
every commit); variant ``default`` keeps DBOS's rollback journal, variant ``wal`` switches
the file to ``journal_mode=WAL``. DBOS creates its SQLAlchemy engine itself, so both
pragmas are applied by a SQLAlchemy ``connect`` listener on every new connection, next to
DBOS's own listener (busy timeout, IMMEDIATE transactions). On Postgres the server's
``fsync=on`` and ``synchronous_commit=on`` apply. The effective settings are read back
and reported under ``durability``.

Workflows: ``chain`` runs K no-op steps (each ``@DBOS.step`` returning its input);
``recoverable`` is the same chain whose step ``kill_at`` blocks on its first execution.
Recovery is DBOS's own: ``DBOS.launch()`` resumes the PENDING workflows of executor
``local`` and re-executes the workflow function, each finished step returning its
recorded output.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import time
import uuid
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID, WorkflowHandle
from sqlalchemy import Engine, event

from bench.peers import common
from bench.peers.common import Probe, Result, clock, ms

PROBE = Probe()
DURABILITY: dict[str, Any] = {}
QUEUE_POLL_S = 1.0  # DBOS's default queue polling interval, used for pickup
CONCURRENT_POLL_S = 0.1  # the concurrent measure's queue polls faster than the default
RESULT_POLL_S = 0.01  # handle.get_result polling; DBOS's default is 1 s


@DBOS.step()
def noop(x: int) -> int:
    return x


@DBOS.step()
def first_step(x: int) -> int:
    PROBE.mark(f"first:{DBOS.workflow_id}")
    return x


@DBOS.step()
def blocking_step(x: int, marker: str) -> int:
    if os.path.exists(marker):
        PROBE.mark("kill_step")
        return x
    common.write_marker(marker)
    common.block_forever()


@DBOS.workflow()
def chain(steps: int, x: int) -> int:
    for _ in range(steps):
        x = noop(x)
    return x


@DBOS.workflow()
def timed_chain(steps: int, x: int) -> int:
    """``chain`` whose first step reports when it starts and whose end is recorded."""
    for i in range(steps):
        x = first_step(x) if i == 0 else noop(x)
    PROBE.mark(f"done:{DBOS.workflow_id}")
    return x


@DBOS.workflow()
def recoverable(steps: int, kill_at: int, marker: str) -> int:
    x = 0
    for i in range(1, steps + 1):
        x = blocking_step(x, marker) if i == kill_at else noop(x)
    return x


def _sqlite_pragmas(wal: bool) -> None:
    @event.listens_for(Engine, "connect")
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        if not isinstance(dbapi_conn, sqlite3.Connection):
            return
        if wal:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=FULL")
        if not DURABILITY:
            mode = dbapi_conn.execute("PRAGMA journal_mode").fetchone()[0]
            sync = dbapi_conn.execute("PRAGMA synchronous").fetchone()[0]
            DURABILITY.update(common.sqlite_durability(mode, sync))


def launch(args: argparse.Namespace) -> None:
    if args.backend == "sqlite":
        if args.variant not in ("default", "wal"):
            raise ValueError(f"unknown sqlite variant {args.variant!r} (default, wal)")
        _sqlite_pragmas(wal=args.variant == "wal")
        url = f"sqlite:///{os.path.abspath(args.db)}"
    else:
        if args.variant != "default":
            raise ValueError(f"unknown postgres variant {args.variant!r} (default)")
        DURABILITY.update(common.pg_durability(args.db))
        url = args.db
    config: DBOSConfig = {
        "name": "bench-dbos",
        "system_database_url": url,
        "application_version": "bench",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()


def sequential(args: argparse.Namespace) -> Result:
    launch(args)
    for _ in range(common.WARMUP_RUNS):
        chain(args.steps, 1)
    started = clock()
    for _ in range(args.n):
        chain(args.steps, 1)  # a direct call runs the workflow and returns its result
    seconds = clock() - started
    return {
        "seconds": seconds,
        "n": args.n,
        "steps": args.steps,
        "setting": "direct workflow call",
        "durability": DURABILITY,
    }


def _warm_up(queue: Any) -> None:
    """Wait until the queue's worker thread runs: DBOS starts it within a second of
    ``register_queue``, at its next check for new queues."""
    queue.enqueue(chain, 1, 1).get_result(polling_interval_sec=RESULT_POLL_S)


def concurrent(args: argparse.Namespace) -> Result:
    launch(args)
    setting = args.setting or "queue"
    if setting == "queue":
        poll = args.poll_interval or CONCURRENT_POLL_S
        queue = DBOS.register_queue(
            "bench_concurrent", worker_concurrency=args.concurrency, polling_interval_sec=poll
        )
        start = queue.enqueue
        _warm_up(queue)
        described = (
            f"Queue(worker_concurrency={args.concurrency}, polling_interval_sec={poll}), enqueue"
        )
    elif setting == "start_workflow":
        start = DBOS.start_workflow
        described = "DBOS.start_workflow (executor threads)"
    else:
        raise ValueError(f"unknown setting {setting!r} (queue, start_workflow)")
    chain(args.steps, 1)  # warm up the engine and connection pool
    ids = [f"c-{uuid.uuid4()}" for _ in range(args.n)]
    started_at: dict[str, float] = {}
    handles = []
    t0 = clock()
    for wf_id in ids:
        started_at[wf_id] = clock()
        with SetWorkflowID(wf_id):
            handles.append(start(timed_chain, args.steps, 1))
    for handle in handles:
        handle.get_result(polling_interval_sec=RESULT_POLL_S)
    wall = clock() - t0
    latencies = [ms(PROBE.times[f"done:{i}"] - started_at[i]) for i in ids]
    return {
        "seconds": wall,
        "n": args.n,
        "steps": args.steps,
        "steps_per_s": args.n * args.steps / wall,
        "setting": described,
        "latency": "start call -> workflow body returned (in process)",
        **common.latency_summary(latencies),
        "durability": DURABILITY,
    }


def recovery_crash(args: argparse.Namespace) -> Result:
    if os.path.exists(args.marker):
        os.unlink(args.marker)
    launch(args)
    with SetWorkflowID(common.stable_id("dbos", args.marker)):
        recoverable(args.steps, args.kill_at, args.marker)
    return {"error": "the blocking step returned; the process was not killed"}


def recovery_resume(args: argparse.Namespace) -> Result:
    if not os.path.exists(args.marker):
        return {"error": f"no marker {args.marker}: run recovery-crash first"}
    t0 = clock()
    launch(args)
    step_at = PROBE.wait("kill_step", timeout=args.timeout)
    handle: WorkflowHandle[int] = DBOS.retrieve_workflow(common.stable_id("dbos", args.marker))
    handle.get_result(polling_interval_sec=RESULT_POLL_S)
    done_at = clock()
    return {
        "to_step5_ms": ms(step_at - t0),
        "to_result_ms": ms(done_at - t0),
        "kill_at": args.kill_at,
        "peak_rss_mb": common.peak_rss_mb(),
        "recovery": (
            "DBOS.launch() re-enqueues the PENDING workflows of executor 'local' on its "
            "internal queue, dequeued at that queue's next poll (1 s interval)"
        ),
        "durability": DURABILITY,
    }


def replay(args: argparse.Namespace) -> Result:
    return common.run_replay(args, "bench.peers.dbos_peer")


def pickup(args: argparse.Namespace) -> Result:
    launch(args)
    poll = args.poll_interval or QUEUE_POLL_S
    queue = DBOS.register_queue("bench_pickup", polling_interval_sec=poll)
    _warm_up(queue)
    latencies = []
    for _ in range(args.n):
        time.sleep(random.uniform(0.0, poll))  # start at a random phase of the polling cycle
        wf_id = f"p-{uuid.uuid4()}"
        with SetWorkflowID(wf_id):
            handle = queue.enqueue(timed_chain, 1, 1)
        returned = clock()
        latencies.append(ms(PROBE.wait(f"first:{wf_id}", timeout=args.timeout) - returned))
        handle.get_result(polling_interval_sec=RESULT_POLL_S)
    return {
        "n": args.n,
        **common.latency_summary(latencies),
        "setting": f"Queue(polling_interval_sec={poll}), in-process worker",
        "durability": DURABILITY,
    }


def takeover(args: argparse.Namespace) -> Result:
    return {
        "skipped": "DBOS has no lease a running executor could take over: a dead executor's "
        "workflows are recovered when an executor with its id launches again (the recovery "
        "measure) or by DBOS Conductor, which is a hosted service"
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
    common.run("dbos", MEASURES)
