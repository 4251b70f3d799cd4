"""Worker processes for the crash tests: spawn, signal and watch them, and read what they
left behind (the invocation log, the database).

Every wait polls an observable state (a process's state in /proc, a line in a log, a row
in the database) every few milliseconds until a deadline; nothing sleeps hoping a state
has been reached.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import crash_app
import psycopg
from waiting import wait_for

import ratchet


class WorkerProc:
    """One worker process (``python tests/support/crash_app.py``), its output in a file."""

    def __init__(
        self, name: str, worker_id: str, popen: subprocess.Popen[bytes], output: Path
    ) -> None:
        self.name = name
        self.worker_id = worker_id
        self.popen = popen
        self.output = output

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def state(self) -> str | None:
        """The kernel's state letter (``R``, ``S``, ``T`` for stopped...), None once gone."""
        if not self.alive():
            return None
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return None
        return stat.rsplit(")", 1)[1].split()[0]

    def kill(self) -> None:
        """SIGKILL (a stopped process dies too) and reap."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def cont(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM: a graceful shutdown."""
        os.kill(self.pid, signal.SIGTERM)

    def wait_exit(self, timeout: float = 15.0) -> int:
        wait_for(
            lambda: not self.alive(),
            timeout=timeout,
            what=f"worker {self.name} to exit",
            detail=self.log,
        )
        return int(self.popen.returncode)

    def wait_stopped(self, timeout: float = 15.0) -> None:
        wait_for(
            lambda: self.state() == "T",
            timeout=timeout,
            what=f"worker {self.name} to be stopped",
            detail=self.log,
        )

    def wait_log(self, needle: str, timeout: float = 15.0) -> str:
        """Wait until the worker's output contains ``needle``; return the line."""

        def probe() -> str | None:
            return next((line for line in self.log().splitlines() if needle in line), None)

        return wait_for(
            probe,
            timeout=timeout,
            what=f"{needle!r} in the output of worker {self.name}",
            detail=self.log,
        )

    def wait_started(self, timeout: float = 15.0) -> None:
        """Registered, own runs reclaimed, loops running."""
        self.wait_log(f"action=worker_started worker_id={self.worker_id} ", timeout)


class Harness:
    """One crash test's world: its database, a client app on it, its worker processes, the
    invocation log and the gates the steps block on. ``app`` is the module whose ``build``
    gives the workflows and which, run as a script, is the worker (``crash_app``, or
    another built the same way)."""

    def __init__(self, db_url: str, root: Path, app: ModuleType = crash_app) -> None:
        self.db_url = db_url
        self.script = str(Path(str(app.__file__)))
        self.root = root
        self.invocation_log = root / "invocations.jsonl"
        self.gates = root / "gates"
        self.gates.mkdir()
        self.procs: list[WorkerProc] = []
        self.app: ratchet.Ratchet = app.build(db_url)
        _ = self.app.store  # migrate once, here, before any worker starts

    # -- processes -------------------------------------------------------------------------

    def spawn(
        self,
        name: str,
        *,
        worker_id: str | None = None,
        lease_ttl: float = 5.0,
        recovery_interval: float = 30.0,
        concurrency: int = 4,
        crash_at: str | None = None,
        pause_at: str | None = None,
        grace: float | None = None,
        env_extra: dict[str, str] | None = None,
    ) -> WorkerProc:
        """Start a worker process. ``crash_at``/``pause_at`` arm the engine's crash points
        (``RATCHET_CRASH_AT`` / ``RATCHET_PAUSE_AT``); ``grace`` is its shutdown grace
        period (the worker's default when None)."""
        worker_id = worker_id or name
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "CRASH_"))}
        env.update(
            CRASH_DB_URL=self.db_url,
            CRASH_WORKER_ID=worker_id,
            CRASH_LEASE_TTL=repr(lease_ttl),
            CRASH_RECOVERY_INTERVAL=repr(recovery_interval),
            CRASH_CONCURRENCY=str(concurrency),
            CRASH_LOG=str(self.invocation_log),
            CRASH_GATES=str(self.gates),
            PYTHONUNBUFFERED="1",
        )
        if crash_at:
            env["RATCHET_CRASH_AT"] = crash_at
        if pause_at:
            env["RATCHET_PAUSE_AT"] = pause_at
        if grace is not None:
            env["CRASH_GRACE"] = repr(grace)
        env.update(env_extra or {})
        output = self.root / f"worker-{name}-{uuid.uuid4().hex[:6]}.log"
        with output.open("wb") as sink:
            popen = subprocess.Popen(
                [sys.executable, self.script],
                env=env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        proc = WorkerProc(name, worker_id, popen, output)
        self.procs.append(proc)
        return proc

    def open_gate(self, name: str) -> None:
        (self.gates / name).touch()

    def close(self) -> None:
        """Kill every worker still there (stopped ones included), print their output (shown
        when the test failed) and close the client."""
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            print(
                f"----- worker {proc.name} ({proc.worker_id}, pid {proc.pid}, "
                f"exit {proc.popen.returncode}) -----\n{proc.log()}"
            )
        self.app.shutdown()

    def worker_logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log()[-3000:]}" for p in self.procs)

    # -- the invocation log ----------------------------------------------------------------

    def invocations(self, event: str = "invoke") -> list[dict[str, Any]]:
        """What steps did, in the order they did it (complete lines only)."""
        if not self.invocation_log.exists():
            return []
        text = self.invocation_log.read_text()
        lines = text.splitlines(keepends=True)
        rows = [json.loads(line) for line in lines if line.endswith("\n")]
        return [r for r in rows if r["event"] == event]

    def calls(self) -> Counter[str]:
        """How many times each step's code was invoked."""
        return Counter(r["step_id"] for r in self.invocations())

    def wait_invoked(
        self, step_id: str, attempt: int = 1, event: str = "invoke", timeout: float = 15.0
    ) -> dict[str, Any]:
        """Wait until the invocation log shows ``step_id``'s ``attempt`` doing ``event``."""

        def probe() -> dict[str, Any] | None:
            return next(
                (
                    r
                    for r in self.invocations(event)
                    if r["step_id"] == step_id and r["attempt"] == attempt
                ),
                None,
            )

        return wait_for(
            probe,
            timeout=timeout,
            what=f"step {step_id} attempt {attempt} to {event}",
            detail=self.worker_logs,
        )

    # -- the database ----------------------------------------------------------------------

    def wait_status(self, run_id: str, status: str, timeout: float = 15.0) -> ratchet.RunRecord:
        """Wait for the run to reach ``status``; a run ending otherwise fails at once."""

        def probe() -> ratchet.RunRecord | None:
            rec = self.app.get(run_id)
            if rec.status == status:
                return rec
            if rec.status.terminal:
                raise AssertionError(
                    f"run {run_id} ended {rec.status} ({rec.error}), "
                    f"not {status}\n{self.worker_logs()}"
                )
            return None

        return wait_for(
            probe, timeout=timeout, what=f"run {run_id} to be {status}", detail=self.worker_logs
        )

    def wait_parked(
        self, run_id: str, waiting_for: str, timeout: float = 15.0
    ) -> ratchet.RunRecord:
        """Wait until the run is ``waiting`` on ``waiting_for`` (a prefix) with its lease
        released."""

        def probe() -> ratchet.RunRecord | None:
            rec = self.app.get(run_id)
            parked = (
                rec.status == "waiting"
                and (rec.waiting_for or "").startswith(waiting_for)
                and self.lease(run_id)[0] is None
            )
            return rec if parked else None

        return wait_for(
            probe,
            timeout=timeout,
            what=f"run {run_id} to park on {waiting_for}",
            detail=self.worker_logs,
        )

    def unseen(self, worker_id: str) -> None:
        """Make the worker's death invisible to the others (its row says it holds no
        liveness lock, as an earlier version's would): only its leases' expiry tells."""
        sql = "UPDATE workers SET liveness_lock = {} WHERE worker_id = {}"
        if self.db_url.startswith("sqlite:///"):
            path = self.db_url[len("sqlite:///") :]
            with sqlite3.connect(path, timeout=30) as conn:
                changed = conn.execute(sql.format("0", "?"), (worker_id,)).rowcount
            conn.close()
        else:
            with psycopg.connect(self.db_url) as pg:
                changed = pg.execute(sql.format("false", "%s"), (worker_id,)).rowcount
        assert changed == 1, f"no workers row for {worker_id}"

    def lease(self, run_id: str) -> tuple[str | None, int, float]:
        """The run's ``run_locks`` row: ``(worker_id, epoch, expires_at)``; for a finished
        run, whose row is gone, ``(None, its last epoch, 0)``."""
        expires = (
            "l.expires_at"
            if self.db_url.startswith("sqlite:///")
            else "extract(epoch FROM l.expires_at)::float8"
        )  # a timestamptz
        sql = (
            "SELECT l.worker_id, coalesce(l.epoch, r.lease_epoch), "
            f"coalesce({expires}, 0) FROM runs r "
            "LEFT JOIN run_locks l ON l.run_id = r.run_id WHERE r.run_id = {} "
            "AND (l.run_id IS NOT NULL OR r.status IN ('succeeded', 'failed', 'cancelled'))"
        )
        if self.db_url.startswith("sqlite:///"):
            path = self.db_url[len("sqlite:///") :]
            with sqlite3.connect(path, timeout=30) as conn:
                row = conn.execute(sql.format("?"), (run_id,)).fetchone()
            conn.close()
        else:
            with psycopg.connect(self.db_url) as pg:
                row = pg.execute(sql.format("%s"), (run_id,)).fetchone()
        assert row is not None, f"run {run_id} has no run_locks row"
        return row[0], int(row[1]), float(row[2])
