"""One campaign on one backend: set the world up, inject the faults, heal, drain, check.

Threads: the main thread walks the fault schedule; a supervisor reaps and restarts worker
processes (and tells crash-point deaths from the runner's own kills); a submitter starts
runs at a steady pace (some from several callers at once under one run id); a signaller
sends each signal a parked run waits for; a canceller cancels the runs chosen for it once
they are busy. Timers end pauses and partitions.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from chaos import app as chaos_app
from chaos import collect
from chaos.check import DupStart, check_all
from chaos.cluster import PrivateCluster
from chaos.faults import Partition, Postgres, SqliteDisk, kill_a_sandbox
from chaos.lanes import LANES, Lane, lane_seconds
from chaos.plan import DUP_CALLERS, Fault, RunSpec, fault_schedule, run_specs
from chaos.procs import CRASH_POINT_TARGET, ROOT, Arming, Exit, Fleet, Slot
from chaos.receiver import read_log
from chaos.recovery import Recovery, Window, by_cause, recoveries
from chaos.report import assemble
from ratchet.errors import InvalidInput, StorageError

# The server to fault: by default a cluster of the campaign's own (chaos.cluster), never a
# server others use. Opt-in: another server's maintenance database, whose local cluster on
# the URL's port is the one restarted and stopped. Each campaign creates a database of its
# own in it.
PG_ADMIN_URL = os.environ.get("CHAOS_PG_ADMIN_URL") or os.environ.get("RATCHET_CHAOS_POSTGRES")
TTL = chaos_app.LEASE_TTL
SWEEP = chaos_app.RECOVERY_INTERVAL
SUPERVISE_S = 0.02
# A database outage is put down as the cause of a recovery when it began within this long
# of the worker outage (the lease, a sweep, a restart), not merely some time before the
# run's next drive.
OUTAGE_REACH_S = 3 * TTL


@dataclass(frozen=True, slots=True)
class Config:
    """What a campaign runs: backend, seed, sizes, and faults to leave out."""

    backend: str
    seed: int
    runs: int
    faults: int
    long: bool = False
    keep: bool = False
    workers: int = 3
    concurrency: int = chaos_app.CONCURRENCY
    gap_s: tuple[float, float] = (0.3, 1.2)
    tmpfs_mb: int = 96
    skip: tuple[str, ...] = ()
    pg_admin_url: str | None = PG_ADMIN_URL  # None: a cluster of the campaign's own

    @classmethod
    def long_campaign(cls, **kw: Any) -> Config:
        """A long campaign: faults denser, on a fleet of five workers (kills and pauses of
        different workers in flight at once, two version-2 slots) of 8 runs at a time, so
        that 2,500 faults fit in about 23 minutes."""
        # 8 on both backends. On PostgreSQL more would take five pools of 16 connections
        # each, beside the campaign's own clients, past a max_connections of 100; on SQLite,
        # at 24 each worker started a sandbox for every held isolated run at once after a
        # heal, and on two busy cores none of them reported a step before the drain ended.
        return cls(**{"long": True, "workers": 5, "concurrency": 8, "gap_s": (0.3, 0.8), **kw})


class Campaign:
    """One campaign on one backend; :meth:`run` returns its report."""

    def __init__(self, config: Config) -> None:
        self.cfg = config
        tag = f"{config.seed}:{config.backend}"
        self.rng_plan = Random(f"{tag}:plan")
        self.rng_faults = Random(f"{tag}:faults")
        self.rng_restart = Random(f"{tag}:restart")
        self.arming = Arming(Random(f"{tag}:arm"), CRASH_POINT_TARGET + 1)
        self.phase = "setup"  # setup | faults | healing | stopping
        self.injected: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.not_run: dict[str, str] = {}
        self.details: Counter[str] = Counter()
        self.timings: dict[str, list[float]] = {}
        self.outages: dict[str, list[tuple[float, str]]] = {}
        self.windows: list[Window] = []  # the database down or full
        self.exits: Counter[str] = Counter()
        self.exit_notes: list[str] = []
        self.submitted: list[str] = []
        self.unconfirmed: list[str] = []
        self.submit_retries = 0
        self.signals_sent = 0
        self.signal_errors = 0
        self.to_cancel: dict[str, float] = {}  # run id -> delay once seen busy
        self.cancel_requested: dict[str, float] = {}
        self.cancel_errors = 0
        self.dup_starts: dict[str, DupStart] = {}
        self.dup_clients: list[Any] = []
        self.timers: list[threading.Timer] = []
        self.stop_threads = threading.Event()
        self.lock = threading.RLock()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{config.backend}-{config.seed}-"))
        self.runner_log = (self.workdir / "runner.log").open("a", buffering=1)
        # The client's own library logs (connection pool warnings during server restarts)
        # go to the work folder, not over the report.
        self.lib_log = logging.FileHandler(self.workdir / "runner-lib.log")
        self.lib_log.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        logging.getLogger().addHandler(self.lib_log)
        self.pg: Postgres | None = None
        self.private: PrivateCluster | None = None
        self.checked = False  # the invariants were checked (a failing campaign keeps its data)
        self.partition: Partition | None = None
        self.disk: SqliteDisk | None = None
        self.receiver: subprocess.Popen[bytes] | None = None
        self.client: Any = None
        self.fleet: Fleet | None = None
        self.url = ""

    # -- bookkeeping ---------------------------------------------------------------------------

    def log(self, message: str) -> None:
        self.runner_log.write(f"{time.time():.3f} {message}\n")

    def outage(self, kind: str, at: float, worker_id: str) -> None:
        """A worker stopped working at ``at``: recovery is measured from here."""
        with self.lock:
            self.outages.setdefault(kind, []).append((at, worker_id))

    def count(self, kind: str) -> None:
        with self.lock:
            self.injected[kind] += 1

    def window(self, began: float, kind: str) -> None:
        """A fault that kept the database from being written, from ``began`` until now."""
        with self.lock:
            self.injected[kind] += 1
            self.windows.append(Window(began, time.time(), kind))

    # -- the whole campaign --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Set up, inject, heal, drain, check; always tear down (server started again,
        tmpfs unmounted, namespace removed, processes killed)."""
        began = time.time()
        clean = False
        report: dict[str, Any] = {}
        try:
            print(
                f"chaos: {self.cfg.backend}: seed {self.cfg.seed}, {self.cfg.runs} runs, "
                f"{self.cfg.faults} scheduled faults; work folder {self.workdir}",
                flush=True,
            )
            self.setup()
            schedule = fault_schedule(
                self.rng_faults, self.cfg.backend, self.cfg.faults, self.cfg.workers, self.cfg.gap_s
            )
            specs = run_specs(self.rng_plan, self.cfg.runs)
            threads = [
                threading.Thread(target=self.supervise, name="supervisor", daemon=True),
                threading.Thread(
                    target=self.submit,
                    args=(specs, expected_s(schedule) * 0.9),
                    name="submitter",
                    daemon=True,
                ),
                threading.Thread(target=self.signaller, name="signaller", daemon=True),
                threading.Thread(target=self.canceller, name="canceller", daemon=True),
            ]
            self.phase = "faults"
            for slot in self.fleet_slots():
                self.start_worker(slot, reclaim=False)
            for t in threads:
                t.start()
            fault_began = time.monotonic()
            self.inject(schedule)
            threads[1].join()
            fault_s = time.monotonic() - fault_began
            self.heal()
            drain = self.drain()
            self.phase = "stopping"
            self.stop_threads.set()
            snapshot = self.statuses_now()
            assert self.fleet is not None
            self.fleet.stop_all()
            self.stop_receiver()
            report = self.check(began, fault_s, drain, snapshot)
            self.checked = True
            clean = report["violations"]["count"] == 0 and not self.cfg.keep
        finally:
            self.teardown(clean)
        report["workdir"] = None if clean else str(self.workdir)
        return report

    def fleet_slots(self) -> list[Slot]:
        assert self.fleet is not None
        return self.fleet.slots

    @property
    def v2_slots(self) -> list[int]:
        """The slots that run the new release: slot 2 (not slot 0, the partitioned one,
        if it can be helped), and every other slot from there in a larger fleet, so that
        killing one version-2 worker leaves another (of five: slots 2 and 4)."""
        first = min(chaos_app.V2_SLOT, self.cfg.workers - 1)
        return list(range(first, self.cfg.workers, 2)) if self.cfg.workers > 3 else [first]

    # -- setup and teardown --------------------------------------------------------------------

    def setup(self) -> None:
        """The database (a fresh PostgreSQL database, or SQLite on its tmpfs), the client,
        the receiver, the partition's namespace and the worker slots."""
        cfg = self.cfg
        for kind in cfg.skip:
            self.not_run[kind] = "skipped on request (--skip)"
        if cfg.backend == "postgres":
            dbname = f"chaos_{cfg.seed}_{int(time.time())}"
            admin_url = cfg.pg_admin_url
            if admin_url is None:
                self.private = PrivateCluster()  # held before it starts: teardown removes it
                self.private.start()
                admin_url = self.private.admin_url
            self.pg = Postgres(admin_url, dbname, self.private)
            print(f"chaos: postgres: faulting {self.pg.target}", flush=True)
            self.pg.ensure_up()
            self.pg.create_db()
            self.url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{dbname}"))
            if self.pg.unavailable:
                for kind in ("pg_restart", "pg_stop"):
                    self.not_run.setdefault(kind, self.pg.unavailable)
        else:
            self.disk = SqliteDisk(self.workdir / "db", cfg.tmpfs_mb * max(1, cfg.runs // 600))
            if self.disk.unavailable:
                self.not_run.setdefault("disk_full", self.disk.unavailable)
            self.url = f"sqlite:///{self.disk.db_path}"
        # The client knows every workflow of the new release, to start runs of all.
        self.client = chaos_app.build(self.url, version="2")
        _ = self.client.store  # migrate once, before any worker starts
        # Duplicate starts come from clients of their own, each with its own connection.
        self.dup_clients = [chaos_app.build(self.url, version="2") for _ in range(DUP_CALLERS)]
        for client in self.dup_clients:
            _ = client.store
        port = self.start_receiver()
        receiver_url = f"http://127.0.0.1:{port}/deliver"
        slots = [
            Slot(i, {"CHAOS_DB_URL": self.url, "CHAOS_RECEIVER_URL": receiver_url})
            for i in range(cfg.workers)
        ]
        # A rolling deploy: some slots run the new release, the others the old one.
        for index in self.v2_slots:
            slots[index].env["CHAOS_APP_VERSION"] = "2"
        if cfg.backend == "postgres" and "partition" not in self.not_run:
            self.partition = Partition(int(time.time()) % 1000, self.workdir)
            self.partition.setup([urlsplit(self.url).port or 5432, port])
            if self.partition.unavailable:
                self.not_run.setdefault("partition", self.partition.unavailable)
            else:
                host = self.partition.host_ip
                slots[0].netns = self.partition.ns
                slots[0].env.update(
                    {
                        "CHAOS_DB_URL": self.url.replace(
                            urlsplit(self.url).hostname or "", host, 1
                        ),
                        "CHAOS_RECEIVER_URL": f"http://{host}:{port}/deliver",
                    }
                )
        elif self.disk is not None:
            self.disk.start_checkpointer(self.workdir)
        self.fleet = Fleet(self.workdir, slots, cfg.concurrency)
        self.log(f"setup url={self.url} receiver={receiver_url}")

    def start_receiver(self) -> int:
        port_file = self.workdir / "receiver.port"
        # The child keeps its own copy of the log's descriptor; ours is closed at once.
        with (self.workdir / "receiver.out").open("wb") as sink:
            self.receiver = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "chaos.receiver",
                    str(self.workdir / "receiver.jsonl"),
                    str(port_file),
                ],
                cwd=self.workdir,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            )
        deadline = time.monotonic() + 15
        while not port_file.exists():
            if self.receiver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the receiver did not start: "
                    + (self.workdir / "receiver.out").read_text(errors="replace")
                )
            time.sleep(0.02)
        return int(port_file.read_text())

    def stop_receiver(self) -> None:
        if self.receiver is not None and self.receiver.poll() is None:
            self.receiver.kill()
            self.receiver.wait(timeout=10)

    def teardown(self, clean: bool) -> None:
        self.stop_threads.set()
        for timer in self.timers:
            timer.cancel()
        if self.fleet is not None:
            self.fleet.kill_all()
        self.stop_receiver()
        if self.partition is not None:
            self.partition.teardown()
        for client in [self.client, *self.dup_clients]:
            if client is not None:
                with contextlib.suppress(Exception):
                    client.shutdown()
        if self.disk is not None:
            self.disk.teardown(keep=None if clean else self.workdir / "db-copy")
        if self.private is not None:
            # Stopped, and removed unless the campaign ran to its checks and keeps its
            # evidence (a violation, or --keep); an error or Ctrl-C removes it too.
            keep = self.checked and not clean
            self.private.remove(keep=keep)
            if keep and self.pg is not None:
                print(
                    f"chaos: kept database {self.pg.dbname} in the stopped cluster "
                    f"{self.private.root} (start it: {self.private.start_command()})",
                    flush=True,
                )
        elif self.pg is not None:
            self.pg.ensure_up()
            if clean:
                with contextlib.suppress(Exception):
                    self.pg.drop_db()
            else:
                print(f"chaos: kept database {self.pg.dbname}", flush=True)
        self.runner_log.close()
        logging.getLogger().removeHandler(self.lib_log)
        self.lib_log.close()
        if clean:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- workers -------------------------------------------------------------------------------

    def start_worker(self, slot: Slot, *, reclaim: bool) -> None:
        assert self.fleet is not None
        arm = self.arming.next() if self.phase == "faults" else None
        self.fleet.start(slot, reclaim=reclaim, arm=arm)
        self.log(
            f"start slot={slot.index} worker={slot.worker_id} armed={arm} "
            f"pid={slot.popen.pid if slot.popen else None}"
        )

    def supervise(self) -> None:
        """Reap worker processes as they end; restart them when their time comes."""
        assert self.fleet is not None
        while not self.stop_threads.is_set():
            for ex in self.fleet.reap():
                self.on_exit(ex)
            now = time.time()
            with self.fleet.lock:
                for slot in self.fleet.slots:
                    if (
                        slot.restart_at is not None
                        and slot.restart_at <= now
                        and self.phase in ("faults", "healing")
                    ):
                        self.start_worker(slot, reclaim=slot.reclaim_next)
            time.sleep(SUPERVISE_S)

    def on_exit(self, ex: Exit) -> None:
        """Account for a worker that ended (a crash point, a kill of ours, anything else)
        and schedule its restart."""
        assert self.fleet is not None
        slot = self.fleet.slots[ex.slot]
        point = ex.crash_point
        if point is not None:
            self.arming.hit(point)
            self.count("crash_point")
            self.outage("crash_point", ex.at, ex.worker_id)
            reclaim = self.rng_restart.random() < 0.5
            delay = self.rng_restart.uniform(0.05, 0.8)
            self.log(f"crash_point {ex.armed} worker={ex.worker_id}")
        elif ex.by_runner:
            reclaim, delay = slot.reclaim_next, slot.restart_delay
        else:
            tail = slot.logs[-1].read_text(errors="replace")[-1500:] if slot.logs else ""
            error = next(
                (
                    line
                    for line in reversed(tail.splitlines())
                    if line.startswith("ratchet.errors.")
                ),
                "",
            )
            # A worker that cannot reach its database when it starts exits: expected while
            # the disk is full, the server is down or its connection was just terminated.
            kind = (
                "storage_error_at_start"
                if error.startswith("ratchet.errors.StorageError")
                else f"exit {ex.returncode}"
            )
            self.exits[kind] += 1
            if kind != "storage_error_at_start":
                last = (tail.strip().splitlines() or [""])[-1]
                self.exit_notes.append(f"{ex.worker_id} {kind}: {last[-300:]}")
            self.log(f"unexpected {kind} worker={ex.worker_id} armed={ex.armed}")
            reclaim, delay = True, 0.5
        if self.phase == "healing":
            delay = 0.0
        slot.reclaim_next = reclaim
        slot.restart_at = (ex.at + delay) if self.phase in ("faults", "healing") else None

    # -- runs and signals ----------------------------------------------------------------------

    def submit(self, specs: list[RunSpec], window_s: float) -> None:
        """Start one run per spec, evenly over ``window_s``; a start that fails (the
        server is down, the disk full) is retried under the same run id."""
        began = time.monotonic()
        interval = window_s / max(1, len(specs))
        for i, spec in enumerate(specs):
            wait = began + i * interval - time.monotonic()
            if wait > 0 and self.stop_threads.wait(wait):
                return
            run_id = f"r{self.cfg.seed}-{i:05d}"
            if spec.callers > 1:
                confirmed = self.start_together(spec, run_id)
            else:
                confirmed = self.start_once(self.client, spec, run_id, counted=True) == run_id
            if confirmed:
                self.submitted.append(run_id)
                if spec.cancel_after_s is not None:
                    with self.lock:
                        self.to_cancel[run_id] = spec.cancel_after_s
            else:
                self.unconfirmed.append(run_id)

    def start_once(
        self,
        client: Any,
        spec: RunSpec,
        run_id: str,
        *,
        counted: bool = False,
        plan: list[str] | None = None,
    ) -> str:
        """One caller's start: the id it got back, or ``Type: message`` of what it raised.
        A storage failure (the server down, the disk full) is retried for up to 120 s;
        any other error is the answer."""
        give_up = time.monotonic() + 120
        while True:
            try:
                return str(client.start(spec.workflow, plan=plan or spec.plan, run_id=run_id))
            except StorageError as e:
                if counted:
                    self.submit_retries += 1
                if time.monotonic() > give_up:
                    self.log(f"submit gave up run={run_id}: {e}")
                    return f"{type(e).__name__}: {e}"
                time.sleep(0.2)
            except Exception as e:
                self.log(f"submit run={run_id}: {type(e).__name__}: {e}")
                if counted and not isinstance(e, InvalidInput):
                    # The single caller keeps going, as before, on anything unexpected.
                    self.submit_retries += 1
                    if time.monotonic() <= give_up:
                        time.sleep(0.2)
                        continue
                return f"{type(e).__name__}: {e}"

    def start_together(self, spec: RunSpec, run_id: str) -> bool:
        """Start ``run_id`` from every duplicate client at once (a barrier lines them up),
        then once more with another input, which must be refused. Whether it exists."""
        results = [""] * len(self.dup_clients)
        barrier = threading.Barrier(len(self.dup_clients))

        def call(n: int) -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=30)
            results[n] = self.start_once(self.dup_clients[n], spec, run_id)

        callers = [
            threading.Thread(target=call, args=(n,), name=f"dup-start-{n}", daemon=True)
            for n in range(len(self.dup_clients))
        ]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        conflict = None
        if run_id in results:
            conflict = self.start_once(self.client, spec, run_id, plan=[*spec.plan, "work"])
        self.dup_starts[run_id] = DupStart(run_id, results, conflict)
        self.log(f"duplicate start run={run_id} results={results} conflict={conflict}")
        return run_id in results

    def signaller(self) -> None:
        """Send each signal a parked run waits for (once per run and name)."""
        signalled: set[tuple[str, str]] = set()
        while not self.stop_threads.wait(0.2):
            try:
                waiting = collect.waiting_for_signals(self.url)
            except Exception:
                continue
            for run_id, name in waiting:
                if (run_id, name) in signalled:
                    continue
                try:
                    self.client.signal(run_id, name, {"from": "campaign"})
                    signalled.add((run_id, name))
                    self.signals_sent += 1
                except Exception as e:
                    self.signal_errors += 1
                    self.log(f"signal {run_id} {name}: {e}")

    def canceller(self) -> None:
        """Cancel each run chosen for it a seeded while after it is first seen busy (a
        step in flight, or waiting on its children), faults or not."""
        seen: dict[str, float] = {}
        while not self.stop_threads.wait(0.1):
            with self.lock:
                pending = {
                    r: d for r, d in self.to_cancel.items() if r not in self.cancel_requested
                }
            if not pending:
                continue
            try:
                now_busy = collect.busy(self.url, pending)
            except Exception:
                continue
            now = time.time()
            for run_id in now_busy:
                seen.setdefault(run_id, now)
            for run_id, first in seen.items():
                if run_id not in pending or now < first + pending[run_id]:
                    continue
                asked = time.time()
                try:
                    status = self.client.cancel(run_id)
                except Exception as e:
                    self.cancel_errors += 1
                    self.log(f"cancel {run_id}: {e}")
                    continue
                with self.lock:
                    self.cancel_requested[run_id] = asked
                self.log(f"cancel run={run_id} status={status}")

    # -- faults --------------------------------------------------------------------------------

    def inject(self, schedule: list[Fault]) -> None:
        """Walk the fault schedule. Faults that hold their injector while they heal (a
        server restart or stop, a full disk, a checkpoint kill, a partition, the wait for
        a sandbox) go to a lane of their own (see :data:`LANES`), so the schedule walks on
        and other faults land meanwhile; a lane injects its faults one after another."""
        lanes = {name: Lane(name, self.apply_one) for name in sorted(set(LANES.values()))}
        try:
            for n, fault in enumerate(schedule, start=1):
                time.sleep(fault.gap_s)
                lane = LANES.get(fault.kind)
                if lane is None:
                    self.apply_one(fault)
                else:
                    lanes[lane].put(fault)
                if n % 25 == 0:
                    print(
                        f"chaos: {self.cfg.backend}: {n}/{len(schedule)} faults, "
                        f"{len(self.submitted)} runs submitted",
                        flush=True,
                    )
        finally:
            for lane_ in lanes.values():
                lane_.close()

    def apply_one(self, fault: Fault) -> None:
        """Inject ``fault``; one that fails to inject is counted skipped."""
        try:
            self.apply(fault)
        except Exception as e:
            self.log(f"fault {fault.kind} failed to inject: {e!r}")
            self.skip(fault.kind)

    def skip(self, kind: str) -> None:
        with self.lock:
            self.skipped[kind] += 1

    def eligible(self, start: int) -> Slot | None:
        """The first slot from ``start`` on whose worker is up (started working, not
        paused) and reachable."""
        slots = self.fleet_slots()
        for i in range(len(slots)):
            slot = slots[(start + i) % len(slots)]
            if (
                slot.up()
                and not slot.paused
                and slot.restart_at is None
                and not (slot.netns and self.partition and self.partition.is_down)
            ):
                return slot
        return None

    def worker_pids(self) -> set[int]:
        """The pids of the campaign's worker processes now (the parents of its sandboxes)."""
        return {s.popen.pid for s in self.fleet_slots() if s.popen is not None and s.alive()}

    def later(self, seconds: float, fn: Any) -> None:
        timer = threading.Timer(seconds, fn)
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

    def apply(self, fault: Fault) -> None:
        """Inject one fault, or count it skipped when its target is not there."""
        kind, p = fault.kind, fault.params
        if kind in self.not_run:
            return
        assert self.fleet is not None
        if kind == "worker_kill":
            with self.fleet.lock:
                slot = self.eligible(p["slot"])
                if slot is None:
                    self.skip(kind)
                    return
                slot.reclaim_next = p["reclaim"]
                slot.restart_delay = p["restart_delay_s"]
                wid = slot.worker_id
                if self.fleet.kill(slot):
                    self.outage(kind, time.time(), wid)
                    self.count(kind)
                    self.log(f"kill worker={wid} reclaim={p['reclaim']}")
        elif kind == "worker_pause":
            with self.fleet.lock:
                slot = self.eligible(p["slot"])
                if slot is None or slot.popen is None:
                    self.skip(kind)
                    return
                pid, wid = slot.popen.pid, slot.worker_id
                if self.fleet.pause(slot):
                    self.outage(kind, time.time(), wid)
                    self.count(kind)
                    self.log(f"pause worker={wid} for {p['ttls']}xTTL")
                    fleet = self.fleet
                    self.later(p["ttls"] * TTL, lambda: fleet.resume(slot, pid))
        elif kind == "pg_terminate":
            assert self.pg is not None
            done, listen = self.pg.terminate(Random(p["rng_seed"]), p["how_many"], p["listen_only"])
            if done:
                self.count(kind)
                self.details["pg_backends_terminated"] += done
                self.details["pg_listen_backends_terminated"] += listen
            else:
                self.skip(kind)
        elif kind == "pg_restart":
            assert self.pg is not None
            began = time.time()
            self.timings.setdefault(kind, []).append(self.pg.restart())
            self.window(began, kind)
            self.log("pg restarted")
        elif kind == "pg_stop":
            assert self.pg is not None
            began = time.time()
            self.timings.setdefault(kind, []).append(self.pg.stop_for(2 * TTL))
            self.window(began, kind)
            self.log("pg stopped and started")
        elif kind == "partition":
            assert self.partition is not None
            slot = self.fleet.slots[0]
            # The partitioned worker may be restarting or paused just now: wait for it.
            deadline = time.monotonic() + 3 * TTL
            while self.partition.is_down or self.eligible(0) is not slot:
                if time.monotonic() > deadline:
                    self.skip(kind)
                    return
                time.sleep(0.05)
            self.partition.down()
            label = f"partition_{p['ttls']:g}xTTL"
            self.count(label)
            if p["ttls"] >= 1:  # shorter ones must not cost the lease
                self.outage(label, time.time(), slot.worker_id)
            self.log(f"partition worker={slot.worker_id} for {p['ttls']}xTTL")
            # Its lane waits for the link to come back: partitions of one link never overlap.
            time.sleep(p["ttls"] * TTL)
            self.partition.up()
        elif kind == "checkpoint_kill":
            assert self.disk is not None
            self.disk.start_checkpointer(self.workdir)
            time.sleep(p["after_s"])
            victim = None
            with self.fleet.lock:
                if p["with_worker"] is not None:
                    victim = self.eligible(p["with_worker"])
                if self.disk.kill_checkpointer():
                    self.count(kind)
                    if victim is not None and self.fleet.kill(victim):
                        self.outage(kind, time.time(), victim.worker_id)
                        victim.reclaim_next = True
                        self.details["workers_killed_with_checkpointer"] += 1
                else:
                    self.skip(kind)
            self.disk.start_checkpointer(self.workdir)
        elif kind == "sandbox_kill":
            # Isolated runs are few and their sandboxes short-lived: wait a while for one.
            pick, deadline = Random(p["pick"]), time.monotonic() + 2 * TTL
            while not kill_a_sandbox(pick, self.worker_pids()):
                if time.monotonic() > deadline:
                    self.skip(kind)
                    return
                time.sleep(0.05)
            self.count(kind)
            self.log("killed a sandbox")
        elif kind == "disk_full":
            assert self.disk is not None
            began = time.time()
            written = self.disk.fill()
            self.log(f"disk full ({written} bytes filler) for {p['hold_s']}s")
            time.sleep(p["hold_s"])
            self.disk.free()
            self.window(began, kind)

    # -- healing and draining ------------------------------------------------------------------

    def heal(self) -> None:
        """End every fault: partitions up, zombies continued, disk freed, server up, every
        slot running (unarmed from now on)."""
        self.phase = "healing"
        for timer in self.timers:
            timer.cancel()
        if self.partition is not None and self.partition.is_down:
            self.partition.up()
        if self.disk is not None:
            self.disk.free()
            self.disk.kill_checkpointer()
        if self.pg is not None:
            self.pg.ensure_up()
        assert self.fleet is not None
        with self.fleet.lock:
            for slot in self.fleet.slots:
                if slot.paused:
                    self.fleet.resume(slot)
                if slot.restart_at is not None:
                    slot.restart_at = min(slot.restart_at, time.time())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(s.up() for s in self.fleet.slots):
            time.sleep(0.05)
        self.log("healed")

    def statuses_now(self) -> Counter[str]:
        for _ in range(50):
            try:
                return collect.status_counts(self.url)
            except Exception:
                time.sleep(0.2)
        return collect.status_counts(self.url)

    def drain(self) -> dict[str, Any]:
        """Wait for the runs to finish: up to TTL + sweep + 5 s without progress (no run
        finished and nothing journaled: on a loaded machine a run's next step may take
        longer than that, but a stuck fleet journals nothing), and at most a few minutes in
        all (more for a long campaign)."""
        quiet_s = TTL + SWEEP + 5.0
        began = time.monotonic()
        cap = began + (300.0 if self.cfg.long else 180.0)
        deadline = began + quiet_s
        last: tuple[int, int] | None = None
        while True:
            counts = self.statuses_now()
            remaining = sum(
                n for s, n in counts.items() if s not in ("succeeded", "failed", "cancelled")
            )
            now = time.monotonic()
            if remaining == 0 or now > deadline or now > cap:
                break
            with contextlib.suppress(Exception):
                progress = (-remaining, collect.journal_size(self.url))
                if last is None or progress[0] > last[0] or progress[1] > last[1]:
                    deadline = max(deadline, now + quiet_s)
                last = progress
            time.sleep(0.25)
        return {"seconds": round(time.monotonic() - began, 2), "remaining": remaining}

    # -- the verdict ---------------------------------------------------------------------------

    def check(
        self, began: float, fault_s: float, drain: dict[str, Any], snapshot: Counter[str]
    ) -> dict[str, Any]:
        """Collect the evidence, check the invariants, assemble the report."""
        arrivals = read_log(self.workdir / "receiver.jsonl")
        v2_workers = {wid for i in self.v2_slots for wid in self.fleet_slots()[i].ids}
        ev = collect.evidence(
            self.url,
            self.submitted,
            arrivals,
            time.time(),
            chaos_app.MAX_ATTEMPTS,
            deliveries_per_step=chaos_app.DELIVERIES,
            cancel_requested=dict(self.cancel_requested),
            v2_only=chaos_app.V2_ONLY,
            v2_workers=v2_workers,
            dup_starts=dict(self.dup_starts),
        )
        findings = check_all(ev)
        from_logs = collect.log_figures(p for s in self.fleet_slots() for p in s.logs)
        recs = recoveries(
            ev.events,
            [
                (t, worker_id, kind)
                for kind, at in sorted(self.outages.items())
                for t, worker_id in at
            ],
        )
        return assemble(
            self,
            findings,
            from_logs,
            self.recovery(recs, ev.runs),
            {
                "duration_s": round(time.time() - began, 1),
                "fault_phase_s": round(fault_s, 1),
                "drain": drain,
                "statuses_at_drain_end": dict(snapshot),
            },
        )

    def recovery(self, recs: list[Recovery], runs: dict[str, Any]) -> dict[str, Any]:
        """The recovery samples by fault and by cause, and the slowest ones."""
        workflows = {run_id: row.workflow for run_id, row in runs.items()}
        causes = by_cause(
            recs,
            workflows,
            self.windows,
            chaos_app.V2_ONLY,
            chaos_app.ISOLATED,
            within=OUTAGE_REACH_S,
        )
        faults: dict[str, list[float]] = {}
        for r in recs:
            faults.setdefault(r.fault, []).append(r.seconds)
        slowest = sorted(recs, key=lambda r: -r.seconds)[:10]
        return {
            "all": [r.seconds for r in recs],
            "outside_partitions": [x for c, xs in causes.items() if c != "partition" for x in xs],
            "by_fault": dict(sorted(faults.items())),
            "by_cause": causes,
            "slowest": [
                {
                    "run_id": r.run_id,
                    "seconds": round(r.seconds, 3),
                    "fault": r.fault,
                    "next_drive": f"{r.reason} by {r.by}",
                    "workflow": workflows.get(r.run_id),
                    "cause": next(
                        iter(
                            by_cause(
                                [r],
                                workflows,
                                self.windows,
                                chaos_app.V2_ONLY,
                                chaos_app.ISOLATED,
                                within=OUTAGE_REACH_S,
                            )
                        )
                    ),
                }
                for r in slowest
            ],
        }


def expected_s(schedule: list[Fault]) -> float:
    """About how long injecting ``schedule`` takes: the gaps, or the busiest lane's work
    when that is longer (see :mod:`chaos.lanes`)."""
    return max([sum(f.gap_s for f in schedule), *lane_seconds(schedule, TTL).values()])
