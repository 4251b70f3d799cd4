"""The bubblewrap backend: each sandbox gets new user, PID, mount, IPC, UTS, cgroup and
network namespaces, runs as ``nobody`` with every capability dropped, and sees only a
read-only view of the interpreter and the app's code (:mod:`ratchet.sandbox.mounts`:
never the working directory, never Ratchet's data directory, database, key or logs), a
private tmpfs at ``/tmp`` (its working directory) and the report socket. No network: the
new network namespace holds only its own loopback. ``--die-with-parent`` ties it to the
worker process, so a worker that dies takes its sandboxes with it (the sweep relies on
that; see :mod:`ratchet.sandbox.isolated`).

A worker running as root starts each sandbox as the host's ``nobody`` (its launcher,
:mod:`ratchet.sandbox.launch`, gives up root before it becomes bubblewrap): the sandbox's
user is then ``nobody`` outside as well as inside, and the files Ratchet keeps at mode
0600 are closed to it even where one is visible. A worker running as another user can
only give its sandboxes its own user: the masks hide Ratchet's files from them, the file
modes do not. The sandbox's output goes to its worker's log through a pipe, never to the
worker's own stdout or stderr (a sandbox could read a log file through those).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import time

from ratchet.errors import SandboxUnavailable
from ratchet.sandbox import launch, mounts
from ratchet.sandbox.backend import (
    REPORT_SOCKET,
    Exit,
    SandboxBackend,
    SandboxProcess,
    SpawnRequest,
)
from ratchet.sandbox.limits import Cell, Limits

log = logging.getLogger("ratchet.sandbox")

NOBODY = 65534
# Passed through bwrap's environment rather than its command line.
SECRET_ENV = frozenset({"RATCHET_REPORT_TOKEN"})
# Where bwrap is, when not on PATH (or to pin one).
BWRAP_ENV = "RATCHET_BWRAP"
PROBE_TIMEOUT_S = 30.0
# A sandbox's output is relayed to the worker's log up to this many lines.
OUTPUT_LINES = 200
OUTPUT_LINE_CHARS = 2000


def _others_may(st: os.stat_result, bits: int, user: int) -> bool:
    if st.st_uid == user:
        return True
    return st.st_mode & bits == bits


def reachable(path: str, user: int) -> bool:
    """Whether ``user`` can walk down to ``path`` (every folder above it lets others
    through)."""
    folder = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            if not _others_may(os.stat(folder), stat.S_IXOTH, user):
                return False
        except OSError:
            return False
        if folder == "/":
            return True
        folder = os.path.dirname(folder)


def check_readable(path: str, user: int) -> None:
    """Raise :class:`SandboxUnavailable` unless ``user`` may read ``path`` itself (and
    list a folder): the sandbox runs as that user."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise SandboxUnavailable(f"cannot show {path} to the sandbox: {e.strerror}") from e
    if stat.S_ISSOCK(st.st_mode):
        bits = stat.S_IWOTH
    elif stat.S_ISDIR(st.st_mode):
        bits = stat.S_IROTH | stat.S_IXOTH
    else:
        bits = stat.S_IROTH
    if not _others_may(st, bits, user):
        raise SandboxUnavailable(
            f"the sandbox runs as nobody (uid {user}) and cannot read {path} (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): make it readable by others (chmod o+rX), "
            "or keep it out of the sandbox"
        )


class _Bwrap(SandboxProcess):
    def __init__(self, proc: asyncio.subprocess.Process, cell: Cell, sandbox_id: str) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.cell = cell
        self._relay = asyncio.ensure_future(self._relay_output(sandbox_id))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.cell.kill_all()

    async def _relay_output(self, sandbox_id: str) -> None:
        """The sandbox's stdout and stderr, line by line into the worker's log, up to
        OUTPUT_LINES; the rest is read and dropped, so the sandbox never blocks on it."""
        stream = self.proc.stdout
        assert stream is not None
        lines = 0
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line past the stream's limit
                line = b"(a line too long to show)\n"
            if not line:
                return
            lines += 1
            if lines <= OUTPUT_LINES:
                text = line.decode(errors="replace").rstrip()[:OUTPUT_LINE_CHARS]
                log.info("action=sandbox_output sandbox_id=%s: %s", sandbox_id, text)
            elif lines == OUTPUT_LINES + 1:
                log.info(
                    "action=sandbox_output sandbox_id=%s: (more output, not shown)", sandbox_id
                )

    async def wait(self) -> Exit:
        try:
            code = await self.proc.wait()
            # bwrap's init dies with the outer bwrap and the namespace's processes with
            # it; the cgroup may hold them a moment longer.
            self.cell.kill_all()
            peak, oom = self.cell.peak_memory(), self.cell.oom_killed()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._relay), 5)
        finally:
            self._relay.cancel()
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
                f"bubblewrap not found at {executable!r}"
                if executable
                else "the isolated tier needs bubblewrap: install it (apt-get install bubblewrap)"
            )
        self.executable = found
        self._limits = limits or Limits()
        self.limits = self._limits.name
        # Root starts its sandboxes as nobody; any other user can only give them its own.
        self.user: int | None = NOBODY if os.geteuid() == 0 else None
        self._stage_dir: str | None = None
        self._unshared: set[str] = set()  # imported code the sandbox's user may not read

    def close(self) -> None:
        """Remove the staging folder (empty on the host)."""
        if self._stage_dir is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self._stage_dir)
            self._stage_dir = None

    def _stage(self) -> str:
        """The folder the launcher mounts its staging tmpfs on (see
        :mod:`ratchet.sandbox.launch`): made once, empty on the host."""
        if self._stage_dir is None or not os.path.isdir(self._stage_dir):
            self._stage_dir = tempfile.mkdtemp(prefix="ratchet-stage-")
        return self._stage_dir

    def _shareable(self, module: str) -> bool:
        """Whether the sandbox's user may read an imported module's file or folder. One
        kept from others (a module of secrets at mode 0600) is not shown: a sandbox that
        needs it fails to import it, saying so in the worker's log."""
        if self.user is None:
            return True
        try:
            check_readable(module, self.user)
        except SandboxUnavailable as e:
            if module not in self._unshared:
                self._unshared.add(module)
                log.warning("action=sandbox_code_not_shown path=%s: %s", module, e)
            return False
        return True

    def _shown(self, source: str, dest: str, staged: list[str]) -> list[str]:
        """``--ro-bind`` of ``source`` at ``dest``; staged when the sandbox's user cannot
        walk down to it."""
        if self.user is not None:
            check_readable(source, self.user)
            if not reachable(source, self.user):
                staged.append(source)
                source = os.path.join(self._stage(), str(len(staged) - 1))
        return ["--ro-bind", source, dest]

    def command(self, request: SpawnRequest) -> tuple[list[str], list[str]]:
        """The bwrap command line for ``request``, and the sources its launcher stages."""
        system = [p for p in mounts.SYSTEM_PATHS if os.path.isdir(p) and not os.path.islink(p)]
        code = [p for p in mounts.module_paths(os.getcwd()) if self._shareable(p)]
        layout = mounts.plan(
            mounts.interpreter_paths(),
            code,
            [*request.spec.mounts, *request.readable],
            request.hidden,
            os.getcwd(),
            system,
        )
        staged: list[str] = []
        args = self._header()
        for p in mounts.SYSTEM_PATHS:
            if os.path.islink(p):  # merged /usr: /lib -> usr/lib
                args += ["--symlink", os.readlink(p), p]
            elif os.path.isdir(p):
                args += ["--ro-bind", p, p]
        for op in layout.ops:
            if op.kind == "bind":
                args += self._shown(op.source, op.path, staged)
            elif op.kind == "tmpfs":
                args += ["--tmpfs", op.path]
            elif op.kind == "null":
                args += ["--ro-bind", "/dev/null", op.path]
            else:
                args += ["--remount-ro", op.path]
        args += self._shown(request.report_socket, REPORT_SOCKET, staged)
        args += ["--chdir", "/tmp"]
        # The sandbox's environment is bwrap's own (see spawn: the secrets, nothing of
        # the worker's) plus these; secrets never go on a command line, which any process
        # of the host may read.
        for key, value in sorted(request.env.items()):
            if key not in SECRET_ENV:
                args += ["--setenv", key, value]
        return [*args, "--", *request.argv], staged

    def argv(self, request: SpawnRequest) -> list[str]:
        """The bwrap command line for ``request``."""
        return self.command(request)[0]

    def _header(self) -> list[str]:
        return [
            self.executable,
            "--unshare-all",
            "--unshare-user",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--uid",
            str(NOBODY),
            "--gid",
            str(NOBODY),
            "--hostname",
            "sandbox",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
        ]

    async def _launch(
        self, argv: list[str], staged: list[str], cell: Cell | None, env: dict[str, str]
    ) -> asyncio.subprocess.Process:
        """Start ``argv`` (bwrap's) through the launcher: under ``cell``'s limits, as the
        sandbox's user, with ``staged`` sources mounted where bwrap finds them."""
        spec = {
            "argv": argv,
            "user": self.user,
            "stage": staged,
            "stage_dir": self._stage() if staged else None,
            "cgroups": cell.join if cell else [],
            "rlimits": cell.rlimits if cell else {},
        }
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            os.path.abspath(launch.__file__),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env={**env, launch.SPEC_ENV: json.dumps(spec)},
        )

    async def probe(self) -> None:
        """Make one sandbox with the interpreter in it, the way every sandbox is made
        (the launcher, its user, the namespaces): where user namespaces are disabled (a
        container without the privilege, a kernel setting), bwrap is there but every
        sandbox would fail."""
        try:
            staged: list[str] = []
            args = self._header()
            for p in mounts.minimal(
                [
                    *[s for s in mounts.SYSTEM_PATHS if os.path.isdir(s) and not os.path.islink(s)],
                    *mounts.interpreter_paths(),
                ]
            ):
                args += self._shown(p, p, staged)
            for p in mounts.SYSTEM_PATHS:
                if os.path.islink(p):
                    args += ["--symlink", os.readlink(p), p]
            proc = await self._launch(
                [*args, "--", sys.executable, "-I", "-S", "-c", ""], staged, None, {}
            )
        except OSError as e:
            raise SandboxUnavailable(f"could not start bubblewrap ({self.executable}): {e}") from e
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise SandboxUnavailable(
                f"bubblewrap ({self.executable}) did not make a sandbox within {PROBE_TIMEOUT_S:g}s"
            ) from None
        if proc.returncode != 0:
            raise SandboxUnavailable(
                f"bubblewrap ({self.executable}) cannot make a sandbox here (exit "
                f"{proc.returncode}): {out.decode(errors='replace').strip()[:300]}"
            )
        if self.user is None:
            log.warning(
                "action=sandbox_user_shared uid=%s: this worker does not run as "
                "root, so its sandboxes run as its own user; Ratchet's files are "
                "not mounted in them, but their modes do not close them to them",
                os.geteuid(),
            )

    async def spawn(self, request: SpawnRequest) -> SandboxProcess:
        argv, staged = self.command(request)
        try:
            cell = await asyncio.to_thread(self._limits.cell, request.sandbox_id, request.spec)
        except OSError as e:
            raise SandboxUnavailable(
                f"could not set the sandbox's limits up ({self.limits}): {e}"
            ) from e
        try:
            proc = await self._launch(
                argv, staged, cell, {k: v for k, v in request.env.items() if k in SECRET_ENV}
            )
        except OSError as e:
            cell.remove()
            raise SandboxUnavailable(f"could not start bubblewrap: {e}") from e
        return _Bwrap(proc, cell, request.sandbox_id)


def default_backend() -> BubblewrapBackend:
    """The backend isolated runs use on this machine: ``bwrap`` on PATH, or the one
    ``RATCHET_BWRAP`` names."""
    return BubblewrapBackend(os.environ.get(BWRAP_ENV) or None)
