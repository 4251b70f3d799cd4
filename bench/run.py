"""Ratchet side by side with its peers, and against the database's own commit limit.

``python -m bench.run [--quick]`` (what ``make bench`` runs) measures, on SQLite (a file on
disk, WAL, ``synchronous=FULL``) and PostgreSQL (the local server, a database per system),
every system's adapter in ``bench/peers/`` with each measure repeated in a fresh database,
then ``ratchet server`` itself (:mod:`bench.server`) and its dashboard in Chromium
(:mod:`bench.dashboard`), and writes
``bench/results/latest.json`` (every sample) and ``bench/results/latest.md`` (median and
min–max, and the ratio Ratchet/peer). Each measure runs in a process of its
own, so one system's memory or threads never touch another's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench import agent_scale, llm_overhead, readme, server
from bench.peers import llm
from bench.peers.common import last_json
from bench.report import (
    AGENT_SCALE_PREFIX,
    DASHBOARD_KEY,
    LLM_OVERHEAD_PREFIX,
    LLM_PREFIXES,
    SERVER_PREFIX,
    agent_scale_section,
    dashboard_section,
    llm_overhead_section,
    llm_sections,
    server_section,
    write_reports,
)
from bench.report import claim_backlog_section as _claim_section

PG_ADMIN = os.environ.get("RATCHET_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
RESULTS = Path(__file__).parent / "results"
Record = Callable[[str, dict[str, Any]], None]  # records a sample under its key


@dataclass(frozen=True)
class System:
    name: str  # the adapter: bench.peers.<name>_peer
    backend: str
    variant: str = "default"
    quick: bool = True  # part of a QUICK run too (Ratchet and DBOS; the full run has all)

    @property
    def label(self) -> str:
        suffix = "" if self.variant == "default" else f" ({self.variant})"
        return f"{self.name}{suffix}"


SYSTEMS = [
    System("ratchet", "sqlite"),
    System("dbos", "sqlite"),
    System("dbos", "sqlite", "wal", quick=False),
    System("langgraph", "sqlite", quick=False),
    System("ratchet", "postgres"),
    System("dbos", "postgres"),
    System("langgraph", "postgres", quick=False),
    System("absurd", "postgres", quick=False),
]


@dataclass
class Plan:
    repeats: int
    sequential_n: int
    concurrent_n: int
    replay_steps: int
    pickup_n: int
    limit_seconds: float
    timeout: float
    # Peers whose 1,000-run pass alone takes 10-40 s (~300-1,300 steps/s) run fewer
    # workflows a pass so the whole bench fits its 15 minutes; rates stay comparable,
    # start→result latencies grow with N and are not.
    concurrent_n_for: dict[str, int] = field(default_factory=dict)
    # Peers that poll for work every 0.25-1 s: fewer pickups a repeat.
    pickup_n_for: dict[str, int] = field(default_factory=dict)
    # Extra options for a peer's recovery, e.g. a shorter lease to wait out in a quick run.
    recovery_options: dict[str, list[str]] = field(default_factory=dict)
    # Backlog sizes (runs, half queued, half waiting on a future timer) for claim latency.
    claim_backlogs: tuple[int, ...] = (0, 10_000, 50_000, 100_000)
    # Calls of each kind (wrapped, bare) a repeat of the LLM per-call overhead measure
    # (bench/llm_overhead.py), on each backend.
    llm_overhead_n: int = 300
    # Repeats of the server measures (bench/server.py), each about 40 s a backend.
    server_repeats: int = 1
    # The server's backends (a QUICK run: PostgreSQL, where many API nodes share one database).
    server_backends: tuple[str, ...] = ("sqlite", "postgres")
    # Repeats of the LLM crash bills (each a SIGKILL and a resume per system).
    bill_repeats: int = 1
    # The isolated tier (bench.sandbox): sandboxes spawned, and steps per workflow.
    sandbox_runs: int = 30
    sandbox_steps: int = 200
    # The dashboard (bench.dashboard): journal events of the long run, runs in the list, and
    # page loads of each.
    dashboard_events: int = 10_000
    dashboard_runs: int = 1_000
    dashboard_loads: int = 5
    # Agent scale (bench.agent_scale): N runs of 3 one-second model calls, per system.
    agent_scale_n: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {"ratchet": (2_000, 10_000), "dbos": (2_000,)}
    )
    agent_scale_repeats: int = 1


def plan(quick: bool) -> Plan:
    if quick:
        return Plan(
            repeats=1,
            sequential_n=10,
            concurrent_n=100,
            replay_steps=1000,
            pickup_n=10,
            limit_seconds=0.5,
            timeout=60,
            pickup_n_for={"dbos": 2, "absurd": 5},
            recovery_options={"absurd": ["--lease", "3"]},
            claim_backlogs=(0, 10_000),
            llm_overhead_n=100,
            server_repeats=1,
            sandbox_runs=10,
            sandbox_steps=50,
            dashboard_events=2_000,
            dashboard_runs=200,
            dashboard_loads=2,
            agent_scale_n={"ratchet": (200,), "dbos": (200,)},
            agent_scale_repeats=1,
            server_backends=("postgres",),
        )
    # Three repeats, two of the crash bills (counts, the same every repeat so far), one of
    # the server (its figures are medians of thousands of events already): the whole run
    # fits its 15 minutes on 2 cores (about 15.7 with two server passes).
    return Plan(
        repeats=3,
        sequential_n=30,
        concurrent_n=1000,
        replay_steps=10_000,
        pickup_n=30,
        limit_seconds=1.0,
        timeout=110,
        bill_repeats=2,
        server_repeats=1,
        concurrent_n_for={"dbos": 100, "langgraph": 200, "absurd": 500},
        pickup_n_for={"dbos": 3, "absurd": 15},
    )


class Databases:
    """A fresh database for each measure: a file in a temporary folder on disk, or a
    PostgreSQL database of the bench's own, dropped afterwards."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="ratchet-bench-", dir=_disk_tmp()))
        self.counter = 0
        # This run's databases carry its pid: benches running side by side on one server
        # neither share a database nor drop each other's.
        self.prefix = f"bench_{os.getpid()}_"

    def fresh(self, system: System) -> str:
        self.counter += 1
        if system.backend == "sqlite":
            return str(self.folder / f"{system.name}-{self.counter}.db")
        name = f"{self.prefix}{system.name}_{system.variant}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"

    def copy(self, system: System, db: str) -> str:
        """A fresh copy of database ``db``, as it is now."""
        self.counter += 1
        if system.backend == "sqlite":
            target = str(self.folder / f"{system.name}-{self.counter}.db")
            for suffix in ("", "-wal", "-shm", "-journal"):
                if os.path.exists(db + suffix):
                    shutil.copyfile(db + suffix, target + suffix)
            return target
        source = db.rsplit("/", 1)[1]
        name = f"{source}_copy"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (source,),
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
        return PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (self.prefix,)
            ).fetchall()
            for (name,) in rows:
                if name.startswith(self.prefix) or _orphaned(name):
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _orphaned(database: str) -> bool:
    """A database a bench run left behind when it was killed: its process is gone."""
    pid = database.split("_")[1]
    if not pid.isdigit():
        return False  # another tool's database (bench/server.py names its own)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _disk_tmp() -> str:
    # /tmp may be a tmpfs, which would measure memory, not a disk commit.
    here = Path(__file__).resolve().parent / "results" / ".tmp"
    here.mkdir(parents=True, exist_ok=True)
    return str(here)


def adapter(system: System, measure: str, db: str, timeout: float, *extra: str) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        f"bench.peers.{system.name}_peer",
        measure,
        "--backend",
        system.backend,
        "--db",
        db,
        "--variant",
        system.variant,
        "--timeout",
        str(timeout),
        *extra,
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 15)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {timeout + 15:g} s"}
    return last_json(done.stdout, done.stderr)


def sandbox_measure(p: Plan) -> dict[str, Any]:
    """The isolated tier's spawn-to-first-step latency and per-step overhead (SQLite)."""
    argv = [
        sys.executable,
        "-m",
        "bench.sandbox",
        "--json",
        "--runs",
        str(p.sandbox_runs),
        "--steps",
        str(p.sandbox_steps),
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=p.timeout * 5)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {p.timeout * 5:g} s"}
    return last_json(done.stdout, done.stderr)


def dashboard_measure(p: Plan, record: Record) -> None:
    """The dashboard's time to first render in Chromium (SQLite), in a process of its own."""
    argv = [
        sys.executable,
        "-m",
        "bench.dashboard",
        "--json",
        "--events",
        str(p.dashboard_events),
        "--runs",
        str(p.dashboard_runs),
        "--repeats",
        str(p.dashboard_loads),
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=p.timeout * 10)
    except subprocess.TimeoutExpired:
        record(DASHBOARD_KEY, {"error": f"no answer within {p.timeout * 10:g} s"})
        return
    record(DASHBOARD_KEY, last_json(done.stdout, done.stderr))


def recovery(system: System, db: str, timeout: float, *extra: str) -> dict[str, Any]:
    """Kill a worker in step 5 of 10 with SIGKILL, then time a fresh one's recovery."""
    folder = Path(tempfile.mkdtemp(prefix="recovery-", dir=_disk_tmp()))
    marker = folder / "step5.marker"
    common = [
        "--backend",
        system.backend,
        "--db",
        db,
        "--variant",
        system.variant,
        "--steps",
        "10",
        "--kill-at",
        "5",
        "--marker",
        str(marker),
        "--timeout",
        str(timeout),
        *extra,
    ]
    module = f"bench.peers.{system.name}_peer"
    child = subprocess.Popen(
        [sys.executable, "-m", module, "recovery-crash", *common],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while not marker.exists():
            if child.poll() is not None:
                out, err = child.communicate()
                answer = last_json(out, err)
                return answer if "skipped" in answer else {"error": f"crash run ended: {answer}"}
            if time.monotonic() > deadline:
                return {"error": "step 5 never started"}
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        child.wait()
        done = subprocess.run(
            [sys.executable, "-m", module, "recovery-resume", *common],
            capture_output=True,
            text=True,
            timeout=timeout + 15,
        )
        return last_json(done.stdout, done.stderr)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        shutil.rmtree(folder, ignore_errors=True)


def replay(
    system: System, dbs: Databases, steps: int, repeats: int, timeout: float, graph: bool = False
) -> list[dict[str, Any]]:
    """Build a run with ``steps`` completed steps and one left (its worker SIGKILLed in the
    last), snapshot the database, then resume a fresh copy of it ``repeats`` times. With
    ``graph``, the run is Ratchet's graph ``chain`` (a loop over a tool node), resumed at
    its first open node."""
    crash, resume = (
        ("graph-crash", "graph-resume") if graph else ("recovery-crash", "recovery-resume")
    )
    folder = Path(tempfile.mkdtemp(prefix="replay-", dir=_disk_tmp()))
    marker = folder / "last.marker"
    built = dbs.fresh(system)
    common = [
        "--backend",
        system.backend,
        "--variant",
        system.variant,
        "--steps",
        str(steps + 1),
        "--kill-at",
        str(steps + 1),
        "--marker",
        str(marker),
        "--timeout",
        str(timeout),
    ]
    module = f"bench.peers.{system.name}_peer"
    child = subprocess.Popen(
        [sys.executable, "-m", module, crash, "--db", built, *common],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started, deadline = time.monotonic(), time.monotonic() + timeout
        while not marker.exists():
            if child.poll() is not None:
                out, err = child.communicate()
                answer = last_json(out, err)
                return [answer if "skipped" in answer else {"error": f"build ended: {answer}"}]
            if time.monotonic() > deadline:
                return [{"error": f"step {steps + 1} never started"}]
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait()
        build_s = time.monotonic() - started
        results = []
        for _ in range(repeats):
            copy = dbs.copy(system, built)
            done = subprocess.run(
                [sys.executable, "-m", module, resume, "--db", copy, *common],
                capture_output=True,
                text=True,
                timeout=timeout + 15,
            )
            answer = last_json(done.stdout, done.stderr)
            if "to_step5_ms" in answer:
                # A lease the killed worker held is waited out by peers that need it; that
                # wait is recovery, not replay.
                answer["to_last_step_ms"] = answer["to_step5_ms"] - answer.get("lease_wait_ms", 0)
            if "to_step5_ms" in answer or "to_open_node_ms" in answer:
                answer["steps"], answer["build_s"] = steps, round(build_s, 1)
            results.append(answer)
        return results
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        shutil.rmtree(folder, ignore_errors=True)


def limit(backend: str, db: str, clients: int, seconds: float) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "bench.limit",
        "--backend",
        backend,
        "--db",
        db,
        "--clients",
        str(clients),
        "--seconds",
        str(seconds),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds * 4 + 60)
    return last_json(done.stdout, done.stderr)


# The families of measures a run makes (``--measures`` picks some; a full run makes all).
MEASURES = (
    "replay",
    "graphreplay",
    "limit",
    "sequential",
    "concurrent",
    "recovery",
    "takeover",
    "pickup",
    "claimbacklog",
    "llm",
    "agentscale",
    "llmoverhead",
    "server",
    "sandbox",
    "dashboard",
)


def run(
    quick: bool, only: set[str] | None, log: Callable[[str], None], measures: set[str] | None = None
) -> dict[str, Any]:
    p = plan(quick)

    def want(measure: str) -> bool:
        return measures is None or measure in measures

    dbs = Databases()
    samples: dict[str, list[dict[str, Any]]] = {}
    # Seconds spent by each family of measures (a key's first field), so a run that outgrows
    # its budget shows where the time went.
    spent: dict[str, float] = {}
    last = [time.monotonic()]

    def record(key: str, value: dict[str, Any]) -> None:
        now = time.monotonic()
        family = key.split("|", 1)[0]
        spent[family] = spent.get(family, 0.0) + now - last[0]
        last[0] = now
        samples.setdefault(key, []).append(value)
        shown = {k: v for k, v in value.items() if k not in ("peer", "measure", "backend")}
        log(f"{key}: {json.dumps(shown)[:160]}")

    systems = [s for s in SYSTEMS if (only is None or s.name in only) and (s.quick or not quick)]
    try:
        for system in systems:  # each replay builds once and resumes a copy per repeat
            key = f"{system.name}|{system.backend}|{system.variant}"
            if want("replay"):
                for answer in replay(system, dbs, p.replay_steps, p.repeats, p.timeout):
                    record(f"replay|{key}", answer)
            if system.name == "ratchet" and want("graphreplay"):
                # Building a graph run of that many iterations takes longer than a code one.
                for answer in replay(
                    system, dbs, p.replay_steps, p.repeats, p.timeout * 3, graph=True
                ):
                    record(f"graphreplay|{key}", answer)
        for _ in range(p.repeats):
            for backend in ("sqlite", "postgres"):
                for clients in (1, 8):
                    if not want("limit"):
                        continue
                    db = dbs.fresh(System("limit", backend))
                    record(
                        f"limit|{backend}|{clients}", limit(backend, db, clients, p.limit_seconds)
                    )
            for system in systems:
                key = f"{system.name}|{system.backend}|{system.variant}"
                for steps in (0, 10):
                    if not want("sequential"):
                        continue
                    record(
                        f"sequential{steps}|{key}",
                        adapter(
                            system,
                            "sequential",
                            dbs.fresh(system),
                            p.timeout,
                            "--steps",
                            str(steps),
                            "--n",
                            str(p.sequential_n),
                        ),
                    )
                n = p.concurrent_n_for.get(system.name, p.concurrent_n)
                if want("concurrent"):
                    answer = adapter(
                        system,
                        "concurrent",
                        dbs.fresh(system),
                        p.timeout,
                        "--n",
                        str(n),
                        "--steps",
                        "10",
                    )
                    record(f"concurrent|{key}", answer | {"n": n})
                if want("recovery"):
                    record(
                        f"recovery|{key}",
                        recovery(
                            system,
                            dbs.fresh(system),
                            p.timeout,
                            *p.recovery_options.get(system.name, []),
                        ),
                    )
                if system.name == "ratchet" and want("takeover"):
                    record(
                        f"takeover|{key}",
                        adapter(
                            system,
                            "takeover",
                            dbs.fresh(system),
                            p.timeout,
                            "--steps",
                            "10",
                            "--kill-at",
                            "5",
                        ),
                    )
                if want("pickup"):
                    record(
                        f"pickup|{key}",
                        adapter(
                            system,
                            "pickup",
                            dbs.fresh(system),
                            p.timeout,
                            "--n",
                            str(p.pickup_n_for.get(system.name, p.pickup_n)),
                        ),
                    )
                if system.name == "ratchet" and want("claimbacklog"):
                    for backlog in p.claim_backlogs:
                        record(
                            f"claimbacklog|{system.backend}|{backlog}",
                            adapter(
                                system,
                                "claim-backlog",
                                dbs.fresh(system),
                                p.timeout,
                                "--n",
                                str(backlog),
                            ),
                        )
        if want("llm"):
            llm_measures(p, dbs, {s.name for s in systems}, record)
        if want("agentscale"):
            agent_scale_measures(p, dbs, {s.name for s in systems}, record)
        if only is None or "ratchet" in only:
            if want("llmoverhead"):
                llm_overhead_measures(p, dbs, record)
            if want("server"):
                server_measures(quick, p, dbs, record)
            if want("sandbox"):
                record("sandbox|sqlite", sandbox_measure(p))
            if want("dashboard"):
                dashboard_measure(p, record)
    finally:
        dbs.close()
    return {
        "quick": quick,
        "repeats": p.repeats,
        "spent_s": {family: round(seconds, 1) for family, seconds in spent.items()},
        "plan": {
            "sequential_n": p.sequential_n,
            "concurrent_n": p.concurrent_n,
            "replay_steps": p.replay_steps,
            "pickup_n": p.pickup_n,
            "claim_backlogs": list(p.claim_backlogs),
        },
        "machine": machine(),
        "samples": samples,
    }


def claim_only(quick: bool, log: Callable[[str], None]) -> dict[str, Any]:
    """Just the claim-latency measure, on both backends (its report has only that table)."""
    p = plan(quick)
    dbs = Databases()
    samples: dict[str, list[dict[str, Any]]] = {}
    try:
        for _ in range(p.repeats):
            for backend in ("sqlite", "postgres"):
                system = System("ratchet", backend)
                for backlog in p.claim_backlogs:
                    key = f"claimbacklog|{backend}|{backlog}"
                    answer = adapter(
                        system, "claim-backlog", dbs.fresh(system), p.timeout, "--n", str(backlog)
                    )
                    samples.setdefault(key, []).append(answer)
                    log(f"{key}: {json.dumps(answer)[:160]}")
    finally:
        dbs.close()
    return {
        "quick": quick,
        "repeats": p.repeats,
        "machine": machine(),
        "samples": samples,
        "plan": {"claim_backlogs": list(p.claim_backlogs)},
    }


def llm_measures(p: Plan, dbs: Databases, names: set[str], record: Record) -> None:
    """The crash bill of each system's agent (SQLite), ``p.bill_repeats`` times each."""
    for _ in range(p.bill_repeats):
        for name in llm.SYSTEMS:
            if name in names:
                record(
                    f"llmbill|{name}",
                    llm.crash_bill(name, dbs.fresh(System(name, "sqlite")), p.timeout),
                )


def llm_overhead_measures(p: Plan, dbs: Databases, record: Record) -> None:
    """The wrapped client's per-call overhead against the bare SDK and one commit
    (bench/llm_overhead.py), on both backends, ``p.repeats`` times each."""
    for _ in range(p.repeats):
        for backend in ("sqlite", "postgres"):
            record(
                f"{LLM_OVERHEAD_PREFIX}{backend}",
                llm_overhead.measure(
                    backend,
                    dbs.fresh(System("ratchet", backend)),
                    dbs.fresh(System("limit", backend)),
                    p.llm_overhead_n,
                    p.timeout,
                    p.limit_seconds,
                ),
            )


def agent_scale_measures(p: Plan, dbs: Databases, names: set[str], record: Record) -> None:
    """N runs of 3 one-second model calls at once, one worker process (bench.agent_scale),
    per system, backend and N, ``p.agent_scale_repeats`` times."""
    for _ in range(p.agent_scale_repeats):
        for backend in ("sqlite", "postgres"):
            for name, sizes in p.agent_scale_n.items():
                if name not in names:
                    continue
                for n in sizes:
                    db = dbs.fresh(System(name, backend))
                    answer = agent_scale.measure(name, backend, db, n, p.timeout * 2)
                    record(
                        f"{AGENT_SCALE_PREFIX}{name}|{backend}|{n}",
                        answer | {"load_average": os.getloadavg()},
                    )


def server_measures(quick: bool, p: Plan, dbs: Databases, record: Record) -> None:
    """``ratchet server`` on each of ``p.server_backends`` (bench/server.py),
    ``p.server_repeats`` times."""
    for _ in range(p.server_repeats):
        for backend in p.server_backends:
            db = dbs.fresh(System("server", backend))
            url = f"sqlite:///{db}" if backend == "sqlite" else db
            record(f"{SERVER_PREFIX}{backend}", server.measure(backend, url, quick))


def family_only(
    quick: bool,
    log: Callable[[str], None],
    measures: Callable[[Plan, Databases, Record], None],
    repeats: int,
) -> dict[str, Any]:
    """Just one family of measures (its report has only its sections), each sample logged."""
    p = plan(quick)
    dbs = Databases()
    samples: dict[str, list[dict[str, Any]]] = {}

    def record(key: str, value: dict[str, Any]) -> None:
        samples.setdefault(key, []).append(value)
        shown = {k: v for k, v in value.items() if k not in ("requests", "peer", "measure")}
        log(f"{key}: {json.dumps(shown)[:300]}")

    try:
        measures(p, dbs, record)
    finally:
        dbs.close()
    return {"quick": quick, "repeats": repeats, "machine": machine(), "samples": samples}


def machine() -> dict[str, Any]:
    with psycopg.connect(PG_ADMIN) as conn:
        pg = conn.execute("SHOW server_version").fetchone()
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("fsync", "synchronous_commit")
        }
    import sqlite3

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "postgres": pg[0] if pg else "?",
        "postgres_settings": settings,
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _merged(
    measured: dict[str, Any], prefixes: tuple[str, ...], run_key: str, quick: bool
) -> dict[str, Any]:
    """The latest full results with one family of measures (samples keyed by
    ``prefixes``) replaced by ``measured``, as --claim-only does; written back, both files."""
    results: dict[str, Any] = json.loads((RESULTS / "latest.json").read_text())
    results["samples"] = {
        k: v for k, v in results["samples"].items() if not k.startswith(prefixes)
    } | measured["samples"]
    results[run_key] = {
        "date": measured["machine"]["date"],
        "quick": quick,
        "repeats": measured["repeats"],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    (RESULTS / "latest.md").write_text(write_reports(results))
    return results


def _update_readme(results: dict[str, Any]) -> None:
    """The README's tables follow a full run (never a quick one)."""
    if results.get("quick"):
        return
    if readme.update(results):
        print(f"rewrote the Performance tables of {readme.README}")
    if readme.update_page((RESULTS / "latest.md").read_text()):
        print(f"rewrote the latest full run's tables of {readme.BENCHMARKS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", default=os.environ.get("QUICK") not in (None, "", "0")
    )
    parser.add_argument("--only", help="comma-separated systems, e.g. ratchet,dbos")
    parser.add_argument(
        "--measures",
        help="comma-separated measures, e.g. replay,graphreplay,recovery,pickup "
        f"(of {', '.join(MEASURES)}); written to measures.json and "
        "measures.md, leaving the full run's latest.* as they are",
    )
    parser.add_argument(
        "--claim-only",
        action="store_true",
        help="measure only claim latency against backlog size (Ratchet)",
    )
    parser.add_argument(
        "--llm-only",
        action="store_true",
        help="measure only the LLM crash bill and the wrapped client's overhead",
    )
    parser.add_argument(
        "--llm-overhead-only",
        action="store_true",
        help="measure only the wrapped LLM client's per-call overhead",
    )
    parser.add_argument(
        "--server-only",
        action="store_true",
        help="measure only ratchet server: starts/s and SSE latency",
    )
    parser.add_argument(
        "--dashboard-only",
        action="store_true",
        help="measure only the dashboard's time to first render (Chromium)",
    )
    parser.add_argument(
        "--agent-scale-only",
        action="store_true",
        help="measure only agent scale: N runs of 3 one-second model calls (Ratchet and DBOS)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="re-write latest.md from latest.json without measuring",
    )
    args = parser.parse_args()
    if args.report_only:
        results = json.loads((RESULTS / "latest.json").read_text())
        (RESULTS / "latest.md").write_text(write_reports(results))
        _update_readme(results)
        print((RESULTS / "latest.md").read_text())
        return
    started = time.monotonic()
    only = set(args.only.split(",")) if args.only else None

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {line}", flush=True)

    if args.claim_only:
        # Merged into the latest full results: that measure's figures are replaced, the
        # others kept as they were measured.
        claim = claim_only(args.quick, log)
        results = json.loads((RESULTS / "latest.json").read_text())
        results["samples"] = {
            k: v for k, v in results["samples"].items() if not k.startswith("claimbacklog|")
        } | claim["samples"]
        results.setdefault("plan", {})["claim_backlogs"] = claim["plan"]["claim_backlogs"]
        results["claim_backlog_run"] = {
            "date": claim["machine"]["date"],
            "quick": args.quick,
            "repeats": claim["repeats"],
        }
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "latest.json").write_text(json.dumps(results, indent=1, sort_keys=True))
        (RESULTS / "latest.md").write_text(write_reports(results))
        print("\n".join(_claim_section(results)))
        return
    if args.llm_only:

        def both(p: Plan, dbs: Databases, record: Record) -> None:
            llm_measures(p, dbs, set(llm.SYSTEMS), record)
            llm_overhead_measures(p, dbs, record)

        measured = family_only(args.quick, log, both, plan(args.quick).bill_repeats)
        results = _merged(measured, LLM_PREFIXES, "llm_run", args.quick)
        results = _merged(measured, (LLM_OVERHEAD_PREFIX,), "llm_overhead_run", args.quick)
        print("\n".join(llm_sections(results) + llm_overhead_section(results)))
        return
    if args.llm_overhead_only:
        measured = family_only(
            args.quick,
            log,
            lambda p, dbs, record: llm_overhead_measures(p, dbs, record),
            plan(args.quick).repeats,
        )
        results = _merged(measured, (LLM_OVERHEAD_PREFIX,), "llm_overhead_run", args.quick)
        print("\n".join(llm_overhead_section(results)))
        return
    if args.server_only:
        measured = family_only(
            args.quick,
            log,
            lambda p, dbs, record: server_measures(args.quick, p, dbs, record),
            plan(args.quick).server_repeats,
        )
        results = _merged(measured, (SERVER_PREFIX,), "server_run", args.quick)
        print("\n".join(server_section(results)))
        return
    if args.dashboard_only:
        measured = family_only(
            args.quick, log, lambda p, dbs, record: dashboard_measure(p, record), 1
        )
        results = _merged(measured, (DASHBOARD_KEY,), "dashboard_run", args.quick)
        print("\n".join(dashboard_section(results)))
        return
    if args.agent_scale_only:
        measured = family_only(
            args.quick,
            log,
            lambda p, dbs, record: agent_scale_measures(
                p, dbs, only or {"ratchet", "dbos"}, record
            ),
            plan(args.quick).agent_scale_repeats,
        )
        results = _merged(measured, (AGENT_SCALE_PREFIX,), "agent_scale_run", args.quick)
        print("\n".join(agent_scale_section(results)))
        return
    measures = set(args.measures.split(",")) if args.measures else None
    unknown = sorted((measures or set()) - set(MEASURES))
    if unknown:
        parser.error(f"unknown measures {', '.join(unknown)}: choose from {', '.join(MEASURES)}")
    results = run(args.quick, only, log, measures)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    RESULTS.mkdir(exist_ok=True)
    name = "latest" if measures is None else "measures"
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    markdown = write_reports(results)
    (RESULTS / f"{name}.md").write_text(markdown)
    if only is None and measures is None:
        _update_readme(results)
    print(markdown)
    print(f"elapsed {results['elapsed_s']} s; wrote {RESULTS / name}.json and {name}.md")


if __name__ == "__main__":
    main()
