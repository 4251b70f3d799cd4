"""Sandboxes in the store: the transaction bodies behind the store's sandbox methods (the
isolated tier).

A row per sandbox ever spawned for a run, written by the run's lease holder (checked in
the same transaction) before the sandbox process starts, so every attempt is counted even
if its worker dies right after spawning it. Opening a sandbox first closes the rows an
earlier holder left open: a sandbox only lives while its owner holds the run's lease
(``bwrap --die-with-parent``, and an owner that cannot renew kills its sandboxes), so a
new holder knows none of them is alive.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ratchet.model import Lease, SandboxStatus
from ratchet.store.dialect import Dialect
from ratchet.store.leases import check_lease
from ratchet.store.transaction import Tx

# How a sandbox ended (``end_reason``).
FINISHED = "finished"  # the harness reported the run's end
CRASHED = "crashed"  # exited or died before the run ended
OOM = "oom"  # killed by its memory limit
TIMEOUT = "timeout"  # ran past Sandbox.timeout_s
KILLED = "killed"  # stopped by its owner: a cancel, a lost lease
SHUTDOWN = "shutdown"  # stopped by its owner's clean shutdown (not counted as an attempt)
ORPHANED = "orphaned"  # its owner died; closed by the next holder


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """A row of ``sandboxes``."""

    sandbox_id: str
    run_id: str
    attempt: int
    status: SandboxStatus
    backend: str
    worker_id: str
    epoch: int
    started_at: float
    ended_at: float | None
    exit_code: int | None
    signal: int | None
    peak_memory: int | None
    end_reason: str | None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": str(self.status)}


def record(row: Any) -> SandboxRecord:
    """A ``sandboxes`` row as a :class:`SandboxRecord`."""
    return SandboxRecord(
        sandbox_id=row["sandbox_id"],
        run_id=row["run_id"],
        attempt=int(row["attempt"]),
        status=SandboxStatus(row["status"]),
        backend=row["backend"],
        worker_id=row["worker_id"],
        epoch=int(row["epoch"]),
        started_at=float(row["started_at"]),
        ended_at=None if row["ended_at"] is None else float(row["ended_at"]),
        exit_code=row["exit_code"],
        signal=row["signal"],
        peak_memory=row["peak_memory"],
        end_reason=row["end_reason"],
    )


def open_in(
    tx: Tx, lease: Lease, sandbox_id: str, backend: str, limit: int, since_epoch: int = 0
) -> tuple[SandboxRecord | None, int]:
    """Under the lease (the caller checked it in ``tx``): close stale rows, then write the
    next attempt's row unless ``limit`` attempts (of lease epoch ``since_epoch`` on: those
    since a manual retry) were already counted. Returns the new row (None at the limit)
    and the attempts counted before it."""
    tx.send("sandboxes_end_stale", {"run_id": lease.run_id})
    row = tx.one("sandbox_attempts", {"run_id": lease.run_id, "since": since_epoch})
    counted, last = int(row["counted"]), int(row["last"])
    if counted >= limit:
        return None, counted
    tx.send(
        "sandbox_insert",
        {
            "sandbox_id": sandbox_id,
            "run_id": lease.run_id,
            "attempt": last + 1,
            "backend": backend,
            "worker_id": lease.worker_id,
            "epoch": lease.epoch,
        },
    )
    return record(
        tx.one("sandboxes_of_run_attempt", {"run_id": lease.run_id, "attempt": last + 1})
    ), counted


async def open_sandbox(
    d: Dialect, lease: Lease, sandbox_id: str, backend: str, limit: int, since_epoch: int = 0
) -> tuple[SandboxRecord | None, int]:
    """Check the lease and :func:`open_in`, in one transaction."""

    def body(tx: Tx) -> tuple[SandboxRecord | None, int]:
        check_lease(tx, lease)
        return open_in(tx, lease, sandbox_id, backend, limit, since_epoch)

    return await d._run(body)


async def running(d: Dialect, sandbox_id: str) -> None:
    """The sandbox's process started."""
    await d._run(lambda tx: tx.send("sandbox_running", {"sandbox_id": sandbox_id}))


async def end(
    d: Dialect,
    sandbox_id: str,
    *,
    reason: str,
    exit_code: int | None,
    signal: int | None,
    peak_memory: int | None,
) -> None:
    """The sandbox's process is gone: how it ended."""
    params = {
        "sandbox_id": sandbox_id,
        "end_reason": reason,
        "exit_code": exit_code,
        "signal": signal,
        "peak_memory": peak_memory,
    }
    await d._run(lambda tx: tx.send("sandbox_end", params))


async def list_sandboxes(
    d: Dialect, run_id: str | None = None, limit: int = 100
) -> list[SandboxRecord]:
    """A run's sandboxes by attempt, or the most recent ones of every run."""
    if run_id is not None:
        rows = await d._read(lambda tx: tx.all("sandboxes_of_run", {"run_id": run_id}))
    else:
        rows = await d._read(lambda tx: tx.all("sandboxes_recent", {"limit": limit}))
    return [record(r) for r in rows]
