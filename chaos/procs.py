"""The campaign's worker processes: start, kill, pause and watch them.

A :class:`Fleet` has a fixed number of slots; each slot runs one worker process at a time
(``python -m chaos.app``), restarted after it dies under the same worker id (it reclaims its
own runs at once) or a new one. A slot may live in a network namespace, for partitions.

Whether a SIGKILL death was a crash point's is decided from what the runner knows: the
process was armed (``RATCHET_CRASH_AT``), died by SIGKILL, and the runner sent none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

from ratchet.engine.faults import POINTS

ROOT = Path(__file__).resolve().parent.parent
CRASH_POINT_TARGET = 3  # hits of each crash point per campaign, at least
STARTED = b"action=worker_started"  # the worker's log line once it works


@dataclass(slots=True)
class Exit:
    """A worker process that ended."""

    slot: int
    worker_id: str
    returncode: int
    armed: str | None
    by_runner: bool
    at: float

    @property
    def crash_point(self) -> str | None:
        """The crash point that killed it, if one did."""
        if self.returncode == -signal.SIGKILL and self.armed and not self.by_runner:
            return self.armed.partition(":")[0]
        return None


@dataclass(slots=True)
class Slot:
    """A place for one worker process at a time, and what the runner knows of it."""

    index: int
    env: dict[str, str]
    netns: str | None = None
    popen: subprocess.Popen[bytes] | None = None
    worker_id: str = ""
    generation: int = 0
    armed: str | None = None
    killed_by_runner: bool = False
    paused: bool = False
    restart_at: float | None = None
    reclaim_next: bool = False
    restart_delay: float = 0.3
    logs: list[Path] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)  # every worker id it has run under
    up_pid: int | None = None  # the process whose log showed it started working

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def up(self) -> bool:
        """Whether its worker is running and has started working (registered, reclaimed its
        runs, claiming): a process still importing or connecting holds no run yet, and a
        fault on it would cost nothing. Read from the head of its log, once per process."""
        if not self.alive() or self.popen is None or not self.logs:
            return False
        if self.up_pid != self.popen.pid:
            try:
                with self.logs[-1].open("rb") as f:
                    head = f.read(1 << 16)
            except OSError:
                return False
            if STARTED not in head:
                return False
            self.up_pid = self.popen.pid
        return True


class Arming:
    """Which crash point each (re)started worker is armed with: the points in a seeded,
    shuffled rotation, skipping those already hit ``target`` times, so that every point is
    hit at least that often; once all are, a start is armed only sometimes."""

    def __init__(self, rng: Random, target: int, rate_after: float = 0.3) -> None:
        self.rng = rng
        self.target = target
        self.rate_after = rate_after
        self.hits = dict.fromkeys(POINTS, 0)
        self._rotation: list[str] = []

    def _next_point(self) -> str:
        if not self._rotation:
            self._rotation = list(POINTS)
            self.rng.shuffle(self._rotation)
        return self._rotation.pop()

    def next(self) -> str | None:
        """``point:nth`` for the next start, or None."""
        nth = self.rng.randint(1, 5)
        roll = self.rng.random()
        if all(n >= self.target for n in self.hits.values()):
            return f"{self._next_point()}:{nth}" if roll < self.rate_after else None
        for _ in range(len(POINTS)):
            point = self._next_point()
            if self.hits[point] < self.target:
                return f"{point}:{nth}"
        return None

    def hit(self, point: str) -> None:
        self.hits[point] += 1


class Fleet:
    """The worker slots. Every method is safe to call from any thread."""

    def __init__(self, workdir: Path, slots: list[Slot], concurrency: int) -> None:
        self.workdir = workdir
        self.slots = slots
        self.concurrency = concurrency
        self.lock = threading.RLock()
        self.starts = 0

    def start(self, slot: Slot, *, reclaim: bool, arm: str | None) -> None:
        """Start the slot's worker: under its last id when ``reclaim``, else a new one;
        armed with crash point ``arm``."""
        with self.lock:
            if not reclaim or not slot.worker_id:
                slot.generation += 1
                slot.worker_id = f"w{slot.index}-{slot.generation}"
            slot.ids.add(slot.worker_id)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "CHAOS_"))}
            env.update(slot.env)
            env.update(
                CHAOS_WORKER_ID=slot.worker_id,
                CHAOS_CONCURRENCY=str(self.concurrency),
                PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            )
            if arm:
                env["RATCHET_CRASH_AT"] = arm
            self.starts += 1
            log = self.workdir / f"worker-{slot.index}-{self.starts:04d}-{slot.worker_id}.log"
            cmd = [sys.executable, "-m", "chaos.app"]
            if slot.netns:
                cmd = ["ip", "netns", "exec", slot.netns, *cmd]
            with log.open("wb") as sink:
                slot.popen = subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=self.workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
            slot.logs.append(log)
            slot.armed = arm
            slot.killed_by_runner = False
            slot.paused = False
            slot.restart_at = None

    def kill(self, slot: Slot) -> bool:
        """SIGKILL the slot's process (stopped ones too); False if it was not running."""
        with self.lock:
            if not slot.alive() or slot.popen is None:
                return False
            slot.killed_by_runner = True
            os.kill(slot.popen.pid, signal.SIGKILL)
            return True

    def pause(self, slot: Slot) -> bool:
        with self.lock:
            if not slot.alive() or slot.paused or slot.popen is None:
                return False
            os.kill(slot.popen.pid, signal.SIGSTOP)
            slot.paused = True
            return True

    def resume(self, slot: Slot, pid: int | None = None) -> None:
        """SIGCONT the slot's process (only if it is still process ``pid``, when given)."""
        with self.lock:
            if slot.popen is None or not slot.alive():
                slot.paused = False
                return
            if pid is not None and slot.popen.pid != pid:
                return
            os.kill(slot.popen.pid, signal.SIGCONT)
            slot.paused = False

    def reap(self) -> list[Exit]:
        """The processes that ended since the last call."""
        out = []
        now = time.time()
        with self.lock:
            for slot in self.slots:
                if slot.popen is None or slot.popen.poll() is None or slot.restart_at is not None:
                    continue
                out.append(
                    Exit(
                        slot.index,
                        slot.worker_id,
                        int(slot.popen.returncode),
                        slot.armed,
                        slot.killed_by_runner,
                        now,
                    )
                )
                slot.restart_at = float("inf")  # the caller schedules the restart
        return out

    def stop_all(self, grace_s: float = 10.0) -> None:
        """SIGCONT, then SIGTERM every worker (they hand back their runs), SIGKILL after
        ``grace_s``."""
        with self.lock:
            live = [s for s in self.slots if s.alive() and s.popen is not None]
            for slot in live:
                assert slot.popen is not None
                os.kill(slot.popen.pid, signal.SIGCONT)
                slot.paused = False
                slot.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for slot in live:
            assert slot.popen is not None
            try:
                slot.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                slot.popen.kill()
                slot.popen.wait(timeout=10)

    def kill_all(self) -> None:
        with self.lock:
            for slot in self.slots:
                if slot.popen is not None and slot.popen.poll() is None:
                    slot.popen.kill()
                    slot.popen.wait(timeout=10)
