"""Memory, CPU and process limits for a sandbox: cgroups where this machine lets the
worker create them (v2 with the memory, pids and cpu controllers delegated, or the v1
hierarchies), else rlimits set just before bubblewrap starts.

A sandbox joins its cgroup before bubblewrap runs (its launcher, :mod:`ratchet.sandbox.launch`,
writes its own pid, then becomes bubblewrap), so nothing the sandbox forks can start
outside it. rlimits are weaker: the address-space limit bounds each process rather than
the sandbox, and the process-count limit counts every process of the sandbox's user (for
a worker running as root, ``nobody``: all its sandboxes together, and anything else that
runs as ``nobody``); :attr:`Limits.name` says which applies, and the docs tell users to
prefer a machine with cgroups.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from ratchet.sandbox.spec import Sandbox

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
_V1 = ("memory", "pids", "cpu")


class Cell:
    """One sandbox's limits: what puts the sandbox under them (the ``cgroup.procs`` files
    its launcher joins, the rlimits it sets), what they measured once it is gone, and
    their removal."""

    def __init__(
        self, dirs: list[Path], join: list[str], rlimits: dict[str, int] | None = None
    ) -> None:
        self.dirs = dirs
        self.join = join
        self.rlimits = rlimits or {}

    def kill_all(self) -> None:
        """SIGKILL every process still in the cgroup (the sandbox's own init normally
        takes them all with it)."""
        for d in self.dirs:
            with contextlib.suppress(OSError):
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)

    def peak_memory(self) -> int | None:
        for d in self.dirs:
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                with contextlib.suppress(OSError, ValueError):
                    return int((d / name).read_text())
        return None

    def oom_killed(self) -> bool:
        for d in self.dirs:
            for name in ("memory.oom_control", "memory.events"):
                with contextlib.suppress(OSError, ValueError):
                    for line in (d / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill" and int(value) > 0:
                            return True
        return False

    def remove(self) -> None:
        for d in self.dirs:
            with contextlib.suppress(OSError):
                d.rmdir()


class Limits:
    """How this machine limits sandboxes: ``cgroup v2``, ``cgroup v1`` or ``rlimit``."""

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self.root = root
        self.name = self._detect()

    def _detect(self) -> str:
        v2 = self.root / "cgroup.controllers"
        if v2.exists():
            wanted = {"memory", "pids", "cpu"}
            with contextlib.suppress(OSError):
                parent = self.root / "ratchet"
                parent.mkdir(exist_ok=True)
                (self.root / "cgroup.subtree_control").write_text("+memory +pids +cpu")
                if wanted <= set((self.root / "cgroup.subtree_control").read_text().split()):
                    (parent / "cgroup.subtree_control").write_text("+memory +pids +cpu")
                    return "cgroup v2"
        if all((self.root / c).is_dir() for c in _V1):
            with contextlib.suppress(OSError):
                for c in _V1:
                    (self.root / c / "ratchet").mkdir(exist_ok=True)
                return "cgroup v1"
        return "rlimit"

    def cell(self, sandbox_id: str, spec: Sandbox) -> Cell:
        """Create the limits of one sandbox."""
        memory = spec.memory_mb * 1024 * 1024
        quota = max(1000, int(spec.cpus * PERIOD_US))
        if self.name == "cgroup v2":
            d = self.root / "ratchet" / sandbox_id
            d.mkdir()
            (d / "memory.max").write_text(str(memory))
            with contextlib.suppress(OSError):  # no swap to bound on many machines
                (d / "memory.swap.max").write_text("0")
            (d / "pids.max").write_text(str(spec.max_processes))
            (d / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            return Cell([d], [str(d / "cgroup.procs")])
        if self.name == "cgroup v1":
            dirs = {c: self.root / c / "ratchet" / sandbox_id for c in _V1}
            for d in dirs.values():
                d.mkdir()
            (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory))
            with contextlib.suppress(OSError):  # only with swap accounting on
                (dirs["memory"] / "memory.memsw.limit_in_bytes").write_text(str(memory))
            (dirs["pids"] / "pids.max").write_text(str(spec.max_processes))
            (dirs["cpu"] / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))
            # The memory hierarchy first: peak and OOM are read from it.
            order = [dirs["memory"], dirs["pids"], dirs["cpu"]]
            return Cell(order, [str(d / "cgroup.procs") for d in order])
        rlimits = {"as": memory, "nproc": spec.max_processes}
        if spec.timeout_s is not None:
            rlimits["cpu"] = int(spec.timeout_s * spec.cpus) + 1
        return Cell([], [], rlimits)
