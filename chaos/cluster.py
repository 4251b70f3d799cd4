"""A PostgreSQL cluster of the campaign's own: the server its faults restart and stop.

A campaign restarts, stops and kills its PostgreSQL server. On the machine's shared server
(127.0.0.1:5432) that breaks everyone else using it (a test suite beside the campaign), so
by default each campaign runs ``initdb`` into a temporary folder, starts a server on a free
port of 127.0.0.1 (trust authentication, ``fsync`` on: the campaign's durability checks
need writes that survive an immediate shutdown) and removes it all afterwards.

The binaries are Debian's (``/usr/lib/postgresql/<version>/bin``, the newest version
there), else those on ``PATH``. PostgreSQL refuses to run as root: a root process runs them
as the ``postgres`` user (``runuser``) in a folder that user owns; anyone else runs them as
themselves.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

DEBIAN_BIN = Path("/usr/lib/postgresql")
SHARED_PORT = 5432
START_TIMEOUT_S = 90
SETTINGS = """\
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{root}'
fsync = on
synchronous_commit = on
full_page_writes = on
max_connections = 100
"""


def bindir() -> Path:
    """The folder of ``initdb`` and ``pg_ctl``: the newest of Debian's versions, else the
    one on ``PATH``."""
    found = []
    for ctl in DEBIAN_BIN.glob("*/bin/pg_ctl"):
        version = ctl.parent.parent.name
        if version.replace(".", "").isdigit() and (ctl.parent / "initdb").exists():
            found.append((tuple(int(x) for x in version.split(".")), ctl.parent))
    if found:
        return max(found)[1]
    on_path = shutil.which("initdb")
    if on_path is None:
        raise RuntimeError(
            f"no PostgreSQL server binaries: neither {DEBIAN_BIN}/<version>/bin/initdb "
            "nor initdb on PATH (install the postgresql package, or pass --postgres URL)"
        )
    return Path(on_path).parent


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on, below the ephemeral range: a client
    reconnecting while the server is down must never be handed the server's port as its
    own (a connection to itself, which would keep the server from binding it again)."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = [p for p in range(15433, min(low, 30000)) if p != SHARED_PORT]
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port on 127.0.0.1 for the campaign's PostgreSQL cluster")


class PrivateCluster:
    """A throwaway PostgreSQL cluster: :meth:`start` it, fault it with :meth:`ctl`,
    :meth:`remove` it. Usable as a context manager (removed on the way out, whatever
    happened)."""

    def __init__(self) -> None:
        self.bin = bindir()
        self.as_postgres = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        if self.as_postgres:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(self.root, ignore_errors=True)
                raise RuntimeError(
                    "running as root, but there is no postgres user to run the "
                    "campaign's PostgreSQL cluster as"
                ) from None
            os.chown(self.root, user.pw_uid, user.pw_gid)

    @property
    def version(self) -> str:
        return self.bin.parent.name

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / tool), *args]
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # The cluster's own folder as the working directory: the postgres user may not
        # enter the caller's.
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
            env={**os.environ, "LC_ALL": "C.UTF-8"},
        )

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``pg_ctl`` on this cluster (``restart -m immediate``, ``stop``, ``start``,
        ``status``: 3 when it is not running), waiting for its outcome."""
        options = ["-D", str(self.data), "-l", str(self.log), "-w", "-t", str(START_TIMEOUT_S)]
        return self._run("pg_ctl", *options, *args, timeout=START_TIMEOUT_S + 30)

    def start_command(self) -> str:
        """The command that starts this cluster again (for one kept to be looked into)."""
        as_user = "runuser -u postgres -- " if self.as_postgres else ""
        return f"{as_user}{self.tool('pg_ctl')} -D {self.data} -l {self.log} start"

    def tool(self, name: str) -> str:
        """The path of one of this PostgreSQL's programs (``pg_isready``)."""
        return str(self.bin / name)

    def start(self) -> PrivateCluster:
        """initdb (superuser ``postgres``, trust authentication) and start the server on
        a free port; a port taken meanwhile is traded for another."""
        res = self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        if res.returncode != 0:
            raise RuntimeError(f"initdb failed: {(res.stderr or res.stdout).strip()[-500:]}")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("include 'chaos.conf'\n")
        error = ""
        for _ in range(3):
            self.port = free_port()
            (self.data / "chaos.conf").write_text(SETTINGS.format(port=self.port, root=self.root))
            res = self.ctl("start")
            if res.returncode == 0:
                return self
            error = (res.stderr or res.stdout).strip() + "\n" + self.log_tail()
        raise RuntimeError(f"the campaign's PostgreSQL cluster did not start: {error[-800:]}")

    def log_tail(self, chars: int = 500) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return ""

    def running(self) -> bool:
        return self.data.exists() and self.ctl("status").returncode == 0

    def stop(self) -> None:
        """Stop the server (a clean shutdown, else an immediate one, else SIGKILL of the
        postmaster, whose children follow it)."""
        if not self.data.exists():
            return
        for mode in ("fast", "immediate"):
            if self.ctl("stop", "-m", mode).returncode == 0 or not self.running():
                return
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)

    def remove(self, keep: bool = False) -> None:
        """Stop the server; delete its folder unless ``keep`` (then it stays, stopped)."""
        self.stop()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivateCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
