"""PostgreSQL liveness locks: a worker is alive while its session holds its advisory lock.

Each running worker holds a session-level advisory lock keyed by its worker id
(``worker_lock``), on a connection of the store's own, kept out of the pool (a pooled
connection is recycled, and with it any session lock). The server releases the lock when
the session ends: at once when the worker's process dies (its socket closes). A stopped
(SIGSTOP) process's session stays, and so does its lock. Other workers test the lock
(``workers_dead``) to take a dead worker's runs without waiting for its lease.

How soon the server lets go of the session of a worker cut off without a word (its host
lost, a network partition) is the server's TCP keepalive: set on this session to give up
after about :data:`SESSION_GIVE_UP_S`, past a lease's default TTL, so a partitioned
worker keeps its runs until the lease says otherwise, and a restart of a lost host's
worker under the same id is refused no longer than that.

Should the session end while the worker lives, its locks are taken again on a new
connection at its next look. After a server restart, which ends every session, nobody is
judged dead for :data:`SERVER_SETTLE_S` (from the server's start, and from each worker's
finding its own session lost) while that happens; a single session ended under a
live worker (a terminated backend) may see its runs taken meanwhile, which the lease's
fence makes safe.
"""

from __future__ import annotations

import contextlib
import logging
import select
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

log = logging.getLogger("ratchet.store")

# The server's keepalive on a liveness session: probes after 15 s of silence, every 5 s, 3
# unanswered ones end it (about 30 s: two lease TTLs by default).
KEEPALIVE = {
    "tcp_keepalives_idle": "15",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}
SESSION_GIVE_UP_S = 30
# A server restart ends every session: for this long after the server started, and after
# this worker's own session was found lost, no worker is judged dead, while the live ones
# take their locks again (each looks, and so re-locks, twice a second).
SERVER_SETTLE_S = 5.0
CONNECT_TIMEOUT_S = 5


class LivenessSession:
    """The connection a store's workers hold their liveness locks on. Its methods block:
    the store calls them on :attr:`executor`, its single thread."""

    def __init__(self, url: str, queries: dict[str, str]) -> None:
        self.url = url
        self.queries = queries
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="ratchet-pg-liveness")
        self._conn: psycopg.Connection[Any] | None = None
        self.held: set[str] = set()
        self.settle_until = 0.0  # (monotonic) no one is judged dead before this

    def hold(self, worker_id: str) -> bool:
        """Take ``worker_id``'s lock; False when a live session holds it (this one too)."""
        if worker_id in self.held:
            return False
        conn = self._connection()
        if self._lock(conn, worker_id):
            self.held.add(worker_id)
            return True
        if not self.held:
            self._close()
        return False

    def release(self, worker_id: str) -> None:
        """Let go of ``worker_id``'s lock (a clean stop)."""
        if worker_id not in self.held:
            return
        self.held.discard(worker_id)
        if not self.held:
            self._close()  # the session's end releases it
            return
        conn = self._conn
        if conn is not None:
            try:
                conn.execute(self.queries["worker_unlock"], {"worker_id": worker_id})
            except psycopg.Error:
                self._close()  # a new session takes the others again at the next look

    def check(self) -> list[str]:
        """Make sure the locks are held: a session the server ended (anything readable on
        an idle connection is its goodbye, or a notice) is replaced, and the locks taken
        again. Returns the worker ids whose lock another live worker took meanwhile. Costs
        no round trip while the session is quiet."""
        if not self.held:
            return []
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                readable, _, _ = select.select([conn.fileno()], [], [], 0)
                if not readable:
                    return []
                conn.execute("SELECT 1")
                return []
            except (psycopg.Error, OSError, ValueError):
                pass
        log.warning("action=liveness_session_lost workers=%s", ",".join(sorted(self.held)))
        self._close()
        conn = self._connection()
        # Lost with the others' (a server restart): give them the time to take theirs again.
        self.settle_until = time.monotonic() + SERVER_SETTLE_S
        lost = [w for w in sorted(self.held) if not self._lock(conn, w)]
        self.held.difference_update(lost)
        return lost

    def close(self) -> None:
        self.held.clear()
        self._close()

    def _lock(self, conn: psycopg.Connection[Any], worker_id: str) -> bool:
        row = conn.execute(self.queries["worker_lock"], {"worker_id": worker_id}).fetchone()
        return bool(row and row[0])

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            # Keepalives and a cap on unanswered sends: a session cut off from the server
            # is found broken, not waited on for minutes.
            options: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 5}
            options["tcp_user_timeout"] = 10_000
            if "connect_timeout" not in self.url:
                options["connect_timeout"] = CONNECT_TIMEOUT_S
            conn = psycopg.connect(self.url, autocommit=True, **options)
            for name, value in KEEPALIVE.items():
                conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            self._conn = conn
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
