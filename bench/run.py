"""Ratchet side by side with its peers, and against the database's own commit limit.

``python -m bench.run [--quick]`` (what ``make bench`` runs) measures, on SQLite (a file on
disk, WAL, ``synchronous=FULL``) and PostgreSQL (the local server, a database per system),
every system's adapter in ``bench/peers/`` with each measure repeated in a fresh database,
and writes ``bench/results/latest.json`` (every sample) and ``bench/results/latest.md``
(median and min–max, and the ratio Ratchet/peer). Each measure runs in a process of its
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

from bench.report import write_reports

PG_ADMIN = os.environ.get("RATCHET_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class System:
    name: str  # the adapter: bench.peers.<name>_peer
    backend: str
    variant: str = "default"

    @property
    def label(self) -> str:
        suffix = "" if self.variant == "default" else f" ({self.variant})"
        return f"{self.name}{suffix}"


SYSTEMS = [
    System("ratchet", "sqlite"),
    System("dbos", "sqlite"),
    System("dbos", "sqlite", "wal"),
    System("langgraph", "sqlite"),
    System("ratchet", "postgres"),
    System("dbos", "postgres"),
    System("langgraph", "postgres"),
    System("absurd", "postgres"),
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
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def plan(quick: bool) -> Plan:
    if quick:
        return Plan(repeats=2, sequential_n=20, concurrent_n=200, replay_steps=2000,
                    pickup_n=15, limit_seconds=0.5, timeout=60)
    return Plan(repeats=5, sequential_n=50, concurrent_n=1000, replay_steps=10_000,
                pickup_n=50, limit_seconds=1.5, timeout=110)


class Databases:
    """A fresh database for each measure: a file in a temporary folder on disk, or a
    PostgreSQL database of the bench's own, dropped afterwards."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="ratchet-bench-", dir=_disk_tmp()))
        self.counter = 0

    def fresh(self, system: System) -> str:
        self.counter += 1
        if system.backend == "sqlite":
            return str(self.folder / f"{system.name}-{self.counter}.db")
        name = f"bench_{system.name}_{system.variant}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE 'bench\\_%'").fetchall()
            for (name,) in rows:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _disk_tmp() -> str:
    # /tmp may be a tmpfs, which would measure memory, not a disk commit.
    here = Path(__file__).resolve().parent / "results" / ".tmp"
    here.mkdir(parents=True, exist_ok=True)
    return str(here)


def adapter(system: System, measure: str, db: str, timeout: float, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", f"bench.peers.{system.name}_peer", measure,
            "--backend", system.backend, "--db", db, "--variant", system.variant,
            "--timeout", str(timeout), *extra]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 15)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {timeout + 15:g} s"}
    return _last_json(done.stdout, done.stderr)


def _last_json(stdout: str, stderr: str) -> dict[str, Any]:
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return {"error": (stderr or stdout)[-400:] or "no output"}


def recovery(system: System, db: str, timeout: float) -> dict[str, Any]:
    """Kill a worker in step 5 of 10 with SIGKILL, then time a fresh one's recovery."""
    folder = Path(tempfile.mkdtemp(prefix="recovery-", dir=_disk_tmp()))
    marker = folder / "step5.marker"
    common = ["--backend", system.backend, "--db", db, "--variant", system.variant,
              "--steps", "10", "--kill-at", "5", "--marker", str(marker),
              "--timeout", str(timeout)]
    module = f"bench.peers.{system.name}_peer"
    child = subprocess.Popen([sys.executable, "-m", module, "recovery-crash", *common],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not marker.exists():
            if child.poll() is not None:
                out, err = child.communicate()
                answer = _last_json(out, err)
                return answer if "skipped" in answer else {"error": f"crash run ended: {answer}"}
            if time.monotonic() > deadline:
                return {"error": "step 5 never started"}
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        child.wait()
        done = subprocess.run([sys.executable, "-m", module, "recovery-resume", *common],
                              capture_output=True, text=True, timeout=timeout + 15)
        return _last_json(done.stdout, done.stderr)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        shutil.rmtree(folder, ignore_errors=True)


def limit(backend: str, db: str, clients: int, seconds: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.limit", "--backend", backend, "--db", db,
            "--clients", str(clients), "--seconds", str(seconds)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds * 4 + 60)
    return _last_json(done.stdout, done.stderr)


def run(quick: bool, only: set[str] | None, log: Callable[[str], None]) -> dict[str, Any]:
    p = plan(quick)
    dbs = Databases()
    samples: dict[str, list[dict[str, Any]]] = {}

    def record(key: str, value: dict[str, Any]) -> None:
        samples.setdefault(key, []).append(value)
        shown = {k: v for k, v in value.items() if k not in ("peer", "measure", "backend")}
        log(f"{key}: {json.dumps(shown)[:160]}")

    systems = [s for s in SYSTEMS if only is None or s.name in only]
    try:
        for _ in range(p.repeats):
            for backend in ("sqlite", "postgres"):
                for clients in (1, 8):
                    db = dbs.fresh(System("limit", backend))
                    record(f"limit|{backend}|{clients}",
                           limit(backend, db, clients, p.limit_seconds))
            for system in systems:
                key = f"{system.name}|{system.backend}|{system.variant}"
                for steps in (0, 10):
                    record(f"sequential{steps}|{key}",
                           adapter(system, "sequential", dbs.fresh(system), p.timeout,
                                   "--steps", str(steps), "--n", str(p.sequential_n)))
                record(f"concurrent|{key}",
                       adapter(system, "concurrent", dbs.fresh(system), p.timeout,
                               "--n", str(p.concurrent_n), "--steps", "10"))
                record(f"recovery|{key}", recovery(system, dbs.fresh(system), p.timeout))
                if system.name == "ratchet":
                    record(f"takeover|{key}",
                           adapter(system, "takeover", dbs.fresh(system), p.timeout,
                                   "--steps", "10", "--kill-at", "5"))
                record(f"replay|{key}",
                       adapter(system, "replay", dbs.fresh(system), p.timeout,
                               "--steps", str(p.replay_steps)))
                record(f"pickup|{key}",
                       adapter(system, "pickup", dbs.fresh(system), p.timeout,
                               "--n", str(p.pickup_n)))
    finally:
        dbs.close()
    return {
        "quick": quick,
        "repeats": p.repeats,
        "plan": {"sequential_n": p.sequential_n, "concurrent_n": p.concurrent_n,
                 "replay_steps": p.replay_steps, "pickup_n": p.pickup_n},
        "machine": machine(),
        "samples": samples,
    }


def machine() -> dict[str, Any]:
    with psycopg.connect(PG_ADMIN) as conn:
        pg = conn.execute("SHOW server_version").fetchone()
        settings = {name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                    for name in ("fsync", "synchronous_commit")}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        default=os.environ.get("QUICK") not in (None, "", "0"))
    parser.add_argument("--only", help="comma-separated systems, e.g. ratchet,dbos")
    args = parser.parse_args()
    started = time.monotonic()
    only = set(args.only.split(",")) if args.only else None

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {line}", flush=True)

    results = run(args.quick, only, log)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    markdown = write_reports(results)
    (RESULTS / "latest.md").write_text(markdown)
    print(markdown)
    print(f"elapsed {results['elapsed_s']} s; wrote {RESULTS / 'latest.json'} and latest.md")


if __name__ == "__main__":
    main()
