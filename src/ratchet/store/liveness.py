"""Liveness locks on one machine: a worker is alive while its process holds a lock the
kernel lets go of when the process dies.

SQLite's workers share one file on one machine. Each running worker holds a POSIX record
lock on one byte of a file beside the database (``<database>-workers``), at an offset
derived from its worker id. A SIGKILLed or crashed process's locks are released by the
kernel at once; a stopped (SIGSTOP) or merely slow one keeps them. Other workers test the
byte: a shared lock that can be taken means nobody holds it, so the worker is dead.

POSIX record locks belong to the process, not to a file descriptor: a process never
conflicts with its own locks, and closing any descriptor of the file drops all of them.
So every store of this process shares one descriptor per file, kept open while any worker
id is held on it, and a worker id held in this process is alive without testing its byte
(testing would replace this process's own lock). An in-memory database has no file: its
workers are all in this process, alive while held.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

__all__ = ["LockFile", "lock_path"]

_BUSY = (errno.EAGAIN, errno.EACCES)  # what a refused non-blocking lock raises


def lock_path(database: str) -> str | None:
    """The liveness lock file of a SQLite database path; None for an in-memory one."""
    if database == ":memory:" or database.startswith("file::memory:"):
        return None
    return os.path.abspath(database) + "-workers"


def _offset(worker_id: str) -> int:
    # 62 bits of the id's hash: a positive offset that fits off_t, and no two ids meet.
    return int.from_bytes(hashlib.sha256(worker_id.encode()).digest()[:8], "big") >> 2


@dataclass
class _Open:
    fd: int
    held: set[str] = field(default_factory=set)


class LockFile:
    """The liveness locks of the workers on one database, as this process sees them."""

    _lock: ClassVar[threading.Lock] = threading.Lock()  # guards _files: every store, thread
    # By lock file path (or a key of the store's own when in memory).
    _files: ClassVar[dict[str, _Open]] = {}

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.key = path if path is not None else f":memory:{id(self)}"

    def hold(self, worker_id: str) -> bool:
        """Take ``worker_id``'s lock; False when a live process (this one included)
        holds it."""
        with self._lock:
            opened = self._files.get(self.key)
            if opened is not None and worker_id in opened.held:
                return False
            if opened is None:
                opened = _Open(self._open())
            if self.path is not None:
                try:
                    fcntl.lockf(opened.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _offset(worker_id))
                except OSError as e:
                    if not opened.held:
                        self._close(opened)
                    if e.errno in _BUSY:
                        return False
                    raise
            opened.held.add(worker_id)
            self._files[self.key] = opened
            return True

    def release(self, worker_id: str) -> None:
        """Let go of ``worker_id``'s lock (a clean stop)."""
        with self._lock:
            opened = self._files.get(self.key)
            if opened is None or worker_id not in opened.held:
                return
            opened.held.discard(worker_id)
            if self.path is not None:
                fcntl.lockf(opened.fd, fcntl.LOCK_UN, 1, _offset(worker_id))
            if not opened.held:
                del self._files[self.key]
                self._close(opened)

    def dead(self, worker_ids: Iterable[str]) -> list[str]:
        """Those of ``worker_ids`` whose lock no live process holds."""
        with self._lock:
            opened = self._files.get(self.key)
            held = opened.held if opened is not None else set()
            ids = [w for w in worker_ids if w not in held]
            if self.path is None or not ids:
                return ids
            # Without a descriptor of this process's own, a temporary one: closing it can
            # drop no lock, since this process holds none on the file.
            fd = opened.fd if opened is not None else self._open()
            try:
                return [w for w in ids if self._free(fd, _offset(w))]
            finally:
                if opened is None:
                    os.close(fd)

    @staticmethod
    def _free(fd: int, offset: int) -> bool:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, offset)
        except OSError as e:
            if e.errno in _BUSY:
                return False
            raise
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)
        return True

    def _open(self) -> int:
        if self.path is None:
            return -1
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @staticmethod
    def _close(opened: _Open) -> None:
        if opened.fd >= 0:
            os.close(opened.fd)
