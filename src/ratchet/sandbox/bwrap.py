"""The bubblewrap backend: each sandbox gets new user, PID, mount, IPC, UTS, cgroup and
network namespaces, runs as ``nobody`` with every capability dropped, and sees only a
read-only view of the interpreter and the app's code, a private tmpfs at ``/tmp`` (its
working directory) and the report socket. No network: the new network namespace holds
only its own loopback. ``--die-with-parent`` ties it to the worker process, so a worker
that dies takes its sandboxes with it (the sweep relies on that; see
:mod:`ratchet.sandbox.isolated`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time

from ratchet.errors import SandboxUnavailable
from ratchet.sandbox.backend import (
    REPORT_SOCKET,
    Exit,
    SandboxBackend,
    SandboxProcess,
    SpawnRequest,
)
from ratchet.sandbox.limits import Cell, Limits

NOBODY = 65534
# Passed through bwrap's environment rather than its command line.
SECRET_ENV = frozenset({"RATCHET_REPORT_TOKEN"})
# The system's shared libraries and the loader; /bin and /sbin are left out (a workload
# gets the interpreter, not a shell).
SYSTEM_PATHS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32")
# Where bwrap is, when not on PATH (or to pin one).
BWRAP_ENV = "RATCHET_BWRAP"
PROBE_TIMEOUT_S = 30.0


def code_paths() -> list[str]:
    """What the harness needs to read: the interpreter (its prefix and the virtual
    environment's) and every directory on this process's import path, which holds the
    app's code and Ratchet's."""
    paths = [sys.base_prefix, sys.prefix, *(p or os.getcwd() for p in sys.path)]
    return [os.path.realpath(p) for p in paths if os.path.exists(p)]


def _covered(path: str, by: list[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in by)


def _minimal(paths: list[str]) -> list[str]:
    """Paths without duplicates or paths inside others, shortest first."""
    kept: list[str] = []
    for p in sorted(set(paths), key=len):
        if not _covered(p, kept):
            kept.append(p)
    return kept


class _Bwrap(SandboxProcess):
    def __init__(self, proc: asyncio.subprocess.Process, cell: Cell) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.cell = cell

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.cell.kill_all()

    async def wait(self) -> Exit:
        try:
            code = await self.proc.wait()
            # bwrap's init dies with the outer bwrap and the namespace's processes with
            # it; the cgroup may hold them a moment longer.
            self.cell.kill_all()
            peak, oom = self.cell.peak_memory(), self.cell.oom_killed()
        finally:
            await asyncio.to_thread(self._remove)
        if code < 0:  # bwrap itself was killed
            return Exit(None, -code, peak, oom)
        if code > 128:  # bwrap reports a child killed by signal N as 128 + N
            return Exit(code, code - 128, peak, oom)
        return Exit(code, None, peak, oom)

    def _remove(self) -> None:
        for _ in range(50):
            self.cell.remove()
            if not any(d.exists() for d in self.cell.dirs):
                return
            self.cell.kill_all()
            time.sleep(0.02)


class BubblewrapBackend(SandboxBackend):
    """Sandboxes made with ``bwrap`` (Debian's ``bubblewrap`` package)."""

    name = "bubblewrap"

    def __init__(self, executable: str | None = None, limits: Limits | None = None) -> None:
        found = shutil.which(executable or "bwrap")
        if found is None:
            raise SandboxUnavailable(
                f"bubblewrap not found at {executable!r}" if executable else
                "the isolated tier needs bubblewrap: install it (apt-get install bubblewrap)")
        self.executable = found
        self._limits = limits or Limits()
        self.limits = self._limits.name

    def argv(self, request: SpawnRequest) -> list[str]:
        """The bwrap command line for ``request``."""
        args = [self.executable, "--unshare-all", "--unshare-user", "--die-with-parent",
                "--new-session", "--cap-drop", "ALL", "--uid", str(NOBODY), "--gid",
                str(NOBODY), "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev",
                "--tmpfs", "/tmp"]
        for p in SYSTEM_PATHS:
            if os.path.islink(p):  # merged /usr: /lib -> usr/lib
                args += ["--symlink", os.readlink(p), p]
            elif os.path.isdir(p):
                args += ["--ro-bind", p, p]
        readable = [*code_paths(), *request.spec.mounts, *request.readable]
        for p in _minimal([os.path.realpath(p) for p in readable if os.path.exists(p)]):
            if not _covered(p, [s for s in SYSTEM_PATHS if os.path.isdir(s)]):
                args += ["--ro-bind", p, p]
        args += ["--ro-bind", request.report_socket, REPORT_SOCKET, "--chdir", "/tmp"]
        # The sandbox's environment is bwrap's own (see spawn: the secrets, nothing of
        # the worker's) plus these; secrets never go on a command line, which any process
        # of the host may read.
        for key, value in sorted(request.env.items()):
            if key not in SECRET_ENV:
                args += ["--setenv", key, value]
        return [*args, "--", *request.argv]

    async def probe(self) -> None:
        """Make one empty sandbox of the same namespaces: where user namespaces are
        disabled (a container without the privilege, a kernel setting), bwrap is there
        but every sandbox would fail."""
        argv = [self.executable, "--unshare-all", "--unshare-user", "--die-with-parent",
                "--ro-bind", "/", "/", "--", sys.executable, "-c", ""]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, env={})
        except OSError as e:
            raise SandboxUnavailable(f"could not start bubblewrap ({self.executable}): "
                                     f"{e}") from e
        try:
            _, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise SandboxUnavailable(f"bubblewrap ({self.executable}) did not make a "
                                     f"sandbox within {PROBE_TIMEOUT_S:g}s") from None
        if proc.returncode != 0:
            raise SandboxUnavailable(
                f"bubblewrap ({self.executable}) cannot make a sandbox here (exit "
                f"{proc.returncode}): {err.decode(errors='replace').strip()[:300]}")

    async def spawn(self, request: SpawnRequest) -> SandboxProcess:
        try:
            cell = await asyncio.to_thread(self._limits.cell, request.sandbox_id,
                                           request.spec)
        except OSError as e:
            raise SandboxUnavailable(f"could not set the sandbox's limits up "
                                     f"({self.limits}): {e}") from e
        try:
            proc = await asyncio.create_subprocess_exec(
                *cell.wrap(self.argv(request)), stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                env={k: v for k, v in request.env.items() if k in SECRET_ENV})
        except OSError as e:
            cell.remove()
            raise SandboxUnavailable(f"could not start bubblewrap: {e}") from e
        return _Bwrap(proc, cell)


def default_backend() -> BubblewrapBackend:
    """The backend isolated runs use on this machine: ``bwrap`` on PATH, or the one
    ``RATCHET_BWRAP`` names."""
    return BubblewrapBackend(os.environ.get(BWRAP_ENV) or None)
