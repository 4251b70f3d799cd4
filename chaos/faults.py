"""The faults a campaign injects besides killing and pausing workers.

* :class:`Postgres`: terminate backends of the campaign's database (LISTEN connections
  included), restart the server with an immediate shutdown, stop it for a while. Whatever
  happens, the server is started again before a method returns. The server is the
  campaign's own (:mod:`chaos.cluster`) unless ``--postgres`` names another.
* :class:`Partition`: one worker slot in a network namespace, joined to this one by a veth
  pair; taking the link down partitions that worker from PostgreSQL (and the receiver).
* :class:`SqliteDisk`: the SQLite database on a small tmpfs that can be filled up, and a
  checkpointer process running ``PRAGMA wal_checkpoint(TRUNCATE)`` in a loop, killed at
  random moments (together with a worker, sometimes).

Each injector that cannot work on this machine says why in ``unavailable``; the report
names the fault as not run with that reason.

``python -m chaos.faults checkpoint PATH`` is the checkpointer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from random import Random
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from chaos.cluster import PrivateCluster

ROOT = Path(__file__).resolve().parent.parent
PG_READY_TIMEOUT_S = 90.0


def _sh(*cmd: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


# -- PostgreSQL ------------------------------------------------------------------------------


def cluster_on_port(port: int, listing: str | None = None) -> tuple[str, str] | None:
    """(version, name) of the local cluster configured on ``port``, from ``pg_lsclusters``
    (or its ``listing``); None when there is none."""
    if listing is None:
        res = _sh("pg_lsclusters", "--no-header")
        if res.returncode != 0:
            return None
        listing = res.stdout
    for line in listing.splitlines():
        cols = line.split()
        if len(cols) >= 3 and cols[0][:1].isdigit() and cols[2] == str(port):
            return cols[0], cols[1]
    return None


class Postgres:
    """The PostgreSQL server of ``admin_url``, seen as a fault target: the campaign's own
    ``cluster`` when given, else the local Debian cluster listening on the URL's port."""

    def __init__(self, admin_url: str, dbname: str, cluster: PrivateCluster | None = None) -> None:
        self.admin_url = admin_url
        self.dbname = dbname
        self.unavailable: str | None = None
        self.version: str | None = None
        self.cluster = "main"
        self.control: Callable[..., subprocess.CompletedProcess[str]] | None = None
        self.isready = "pg_isready"
        # What the report names as the server faulted.
        self.target = f"{admin_url} (not restarted or stopped)"
        if cluster is not None:
            self.version, self.cluster = cluster.version, str(cluster.root)
            self.control = cluster.ctl
            self.isready = cluster.tool("pg_isready")
            self.target = (
                f"the campaign's own cluster: PostgreSQL {cluster.version} on "
                f"127.0.0.1:{cluster.port}, {cluster.root}"
            )
            return
        if _sh("which", "pg_ctlcluster").returncode != 0:
            self.unavailable = "pg_ctlcluster is not installed"
            return
        # The cluster to restart is the one serving the campaign's URL, never another
        # cluster of the machine.
        found = cluster_on_port(urlsplit(admin_url).port or 5432)
        if found is None:
            self.unavailable = (
                f"no local cluster listens on port "
                f"{urlsplit(admin_url).port or 5432} (pg_lsclusters)"
            )
            return
        self.version, self.cluster = found
        version, name = found
        self.target = f"the local cluster {version}/{name} of {admin_url}"
        self.control = lambda *args: _sh(
            "pg_ctlcluster", "--skip-systemctl-redirect", version, name, *args
        )

    def create_db(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(self.dbname)
                )
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.dbname)))

    def drop_db(self) -> None:
        self.ensure_up()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(self.dbname)
                )
            )

    def terminate(self, rng: Random, how_many: int, listen_only: bool) -> tuple[int, int]:
        """Terminate up to ``how_many`` backends of the campaign's database, picked with
        ``rng`` (only LISTEN connections when ``listen_only``). Returns (terminated, of
        which LISTEN)."""
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT pid, coalesce(query, '') FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid() ORDER BY pid",
                (self.dbname,),
            ).fetchall()
            if listen_only:
                rows = [r for r in rows if r[1].lstrip().upper().startswith("LISTEN")]
            picked = []
            for _ in range(min(how_many, len(rows))):
                picked.append(rows.pop(int(rng.random() * len(rows))))
            done = listen = 0
            for pid, query in picked:
                row = conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
                if row is not None and row[0]:
                    done += 1
                    listen += query.lstrip().upper().startswith("LISTEN")
            return done, listen

    def _ctl(self, *args: str) -> None:
        assert self.control is not None
        res = self.control(*args)
        if res.returncode != 0 and "is not running" not in res.stderr:
            raise RuntimeError(f"{self.cluster}: {' '.join(args)}: {res.stderr.strip()}")

    def restart(self) -> float:
        """Restart with an immediate shutdown (no checkpoint: crash recovery on start).
        Returns the seconds until the server accepted connections again."""
        began = time.monotonic()
        try:
            self._ctl("restart", "-m", "immediate")
        finally:
            self.ensure_up()
        return time.monotonic() - began

    def stop_for(self, seconds: float) -> float:
        """Stop immediately, stay down ``seconds``, start. Returns the seconds it was down."""
        began = time.monotonic()
        try:
            self._ctl("stop", "-m", "immediate")
            time.sleep(seconds)
        finally:
            self.ensure_up()
        return time.monotonic() - began

    def ready(self) -> bool:
        url = urlsplit(self.admin_url)
        return (
            _sh(
                self.isready,
                "-h",
                url.hostname or "127.0.0.1",
                "-p",
                str(url.port or 5432),
                "-t",
                "2",
                timeout=10,
            ).returncode
            == 0
        )

    def ensure_up(self) -> None:
        """Start the cluster if it is down; wait until it accepts connections."""
        deadline = time.monotonic() + PG_READY_TIMEOUT_S
        started = False
        while not self.ready():
            if not started and self.control is not None:
                if self.control("status").returncode != 0:  # 3: not running
                    self.control("start")
                started = True
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not come back within {PG_READY_TIMEOUT_S:g}s")
            time.sleep(0.05)


# -- network partition -----------------------------------------------------------------------


class Partition:
    """A network namespace for one worker, joined by a veth pair, and a relay on the
    host end to the services on 127.0.0.1 (PostgreSQL listens there only). Taking the
    host end down makes a black hole: the worker's packets are dropped, its connections
    hang, and PostgreSQL sees nothing until the link is back."""

    def __init__(self, tag: int, workdir: Path) -> None:
        self.ns = f"chaos_ns{tag}"
        self.host_if = f"chaosh{tag}"
        self.ns_if = f"chaosn{tag}"
        octet = tag % 250 + 1
        self.host_ip = f"10.200.{octet}.1"
        self.ns_ip = f"10.200.{octet}.2"
        self.workdir = workdir
        self.relay: subprocess.Popen[bytes] | None = None
        self.unavailable: str | None = None
        self.is_down = False

    def setup(self, ports: list[int]) -> None:
        """Create the namespace and the link; relay ``ports`` of 127.0.0.1 to the host
        end. On failure ``unavailable`` says why."""
        steps = [
            ("ip", "netns", "add", self.ns),
            ("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if),
            ("ip", "link", "set", self.ns_if, "netns", self.ns),
            ("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if),
            ("ip", "link", "set", self.host_if, "up"),
            (
                "ip",
                "netns",
                "exec",
                self.ns,
                "ip",
                "addr",
                "add",
                f"{self.ns_ip}/30",
                "dev",
                self.ns_if,
            ),
            ("ip", "netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "up"),
            ("ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up"),
        ]
        for cmd in steps:
            res = _sh(*cmd)
            if res.returncode != 0:
                self.unavailable = f"`{' '.join(cmd)}` failed: {res.stderr.strip()}"
                self.teardown()
                return
        # Permanent neighbour entries on both ends: with the link down, packets then vanish
        # (a black hole, connections hang) instead of failing fast with "no route to host"
        # once ARP gives up.
        host_mac = _sh("cat", f"/sys/class/net/{self.host_if}/address").stdout.strip()
        ns_mac = _sh(
            "ip", "netns", "exec", self.ns, "cat", f"/sys/class/net/{self.ns_if}/address"
        ).stdout.strip()
        _sh(
            "ip",
            "neigh",
            "replace",
            self.ns_ip,
            "lladdr",
            ns_mac,
            "dev",
            self.host_if,
            "nud",
            "permanent",
        )
        _sh(
            "ip",
            "netns",
            "exec",
            self.ns,
            "ip",
            "neigh",
            "replace",
            self.host_ip,
            "lladdr",
            host_mac,
            "dev",
            self.ns_if,
            "nud",
            "permanent",
        )
        pairs = [f"{self.host_ip}:{p}=127.0.0.1:{p}" for p in ports]
        log = (self.workdir / "relay.log").open("wb")
        self.relay = subprocess.Popen(
            [sys.executable, "-m", "chaos.relay", *pairs],
            cwd=self.workdir,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while b"relay ready" not in (self.workdir / "relay.log").read_bytes():
            if self.relay.poll() is not None or time.monotonic() > deadline:
                self.unavailable = (
                    "the relay to 127.0.0.1 did not start: "
                    + (self.workdir / "relay.log").read_text(errors="replace")[-300:]
                )
                self.teardown()
                return
            time.sleep(0.05)

    def down(self) -> None:
        _sh("ip", "link", "set", self.host_if, "down")
        self.is_down = True

    def up(self) -> None:
        _sh("ip", "link", "set", self.host_if, "up")
        self.is_down = False

    def teardown(self) -> None:
        if self.relay is not None and self.relay.poll() is None:
            self.relay.kill()
            self.relay.wait(timeout=10)
        _sh("ip", "link", "del", self.host_if)
        _sh("ip", "netns", "del", self.ns)


# -- SQLite: a disk that fills up, checkpoints that die --------------------------------------


class SqliteDisk:
    """The SQLite database's folder, on a tmpfs of its own when mounting is allowed."""

    FILLER = ".filler"

    def __init__(self, folder: Path, size_mb: int) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.mounted = False
        self.unavailable: str | None = None
        res = _sh("mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "chaos-tmpfs", str(folder))
        if res.returncode == 0:
            self.mounted = True
        else:
            self.unavailable = f"mount -t tmpfs failed: {res.stderr.strip() or res.returncode}"
        self.checkpointer: subprocess.Popen[bytes] | None = None
        self.filled = False

    @property
    def db_path(self) -> Path:
        return self.folder / "ratchet.db"

    def fill(self) -> int:
        """Fill the filesystem to the last byte; returns the bytes written."""
        written = 0
        chunk = b"\0" * (1 << 20)
        fd = os.open(self.folder / self.FILLER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while True:
                try:
                    n = os.write(fd, chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        break
                    chunk = chunk[: len(chunk) // 2]
                    continue
                written += n
        finally:
            os.close(fd)
        self.filled = True
        return written

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / self.FILLER).unlink()
        self.filled = False

    def start_checkpointer(self, workdir: Path) -> None:
        if self.checkpointer is not None and self.checkpointer.poll() is None:
            return
        log = (workdir / "checkpointer.log").open("ab")
        self.checkpointer = subprocess.Popen(
            [sys.executable, "-m", "chaos.faults", "checkpoint", str(self.db_path)],
            cwd=workdir,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def kill_checkpointer(self) -> bool:
        proc = self.checkpointer
        if proc is None or proc.poll() is not None:
            return False
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        return True

    def teardown(self, keep: Path | None = None) -> None:
        """Stop the checkpointer, free the space and unmount; with ``keep``, copy the
        database files there first."""
        self.kill_checkpointer()
        self.free()
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for f in self.folder.glob("ratchet.db*"):
                with contextlib.suppress(OSError):
                    (keep / f.name).write_bytes(f.read_bytes())
        if self.mounted:
            res = _sh("umount", str(self.folder))
            if res.returncode != 0:
                _sh("umount", "-l", str(self.folder))
            self.mounted = False


def checkpoint_loop(path: str) -> None:
    """Checkpoint the WAL into the database and truncate it, over and over (reconnecting
    after an error: the disk may be full)."""
    conn: sqlite3.Connection | None = None
    while True:
        try:
            if conn is None:
                conn = sqlite3.connect(path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as e:
            print(f"checkpoint: {e}", flush=True)
            if conn is not None:
                conn.close()
            conn = None
            time.sleep(0.1)
        time.sleep(0.01)


if __name__ == "__main__":
    if sys.argv[1:2] == ["checkpoint"]:
        checkpoint_loop(sys.argv[2])


def live_sandboxes(parents: set[int] | None = None) -> list[int]:
    """The pids of the bubblewrap processes of live sandboxes (each isolated attempt's
    outermost process; its environment is on its command line), only those spawned by
    the processes ``parents`` when given (the campaign's own workers: never a sandbox of
    anything else running on the machine)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parent_args = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        # bwrap forks its namespace's init with the same command line: the outer one only.
        if (
            b"--die-with-parent" in args
            and b"RATCHET_SANDBOX_ID" in args
            and (b"--die-with-parent" not in parent_args)
            and (parents is None or parent in parents)
        ):
            found.append(int(entry.name))
    return sorted(found)


def kill_a_sandbox(rng: Random, parents: set[int]) -> bool:
    """SIGKILL one live sandbox of the workers ``parents`` (the worker spawns the next
    attempt); whether one was."""
    pids = live_sandboxes(parents)
    if not pids:
        return False
    try:
        os.kill(rng.choice(pids), signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
