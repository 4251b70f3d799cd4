"""Workers in the store: who is alive, and what each serves.

A worker writes its row (``workers``) when it starts and is seen again at each lease
renewal; it is listed as alive by its own lease TTL. Before that, it takes its worker id's
liveness lock (a lock its process holds while it lives: ``liveness.py``,
``pg_liveness.py``): a start under an id a live worker holds is refused, and a worker whose
lock is gone is dead, its runs taken over at once by the others. The recovery sweep forgets a worker
unseen for :data:`WORKER_GONE_TTLS` of its TTLs; one that was only cut off registers
again at its next renewal, from the registration the store kept for it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ratchet.errors import WorkerIdInUse
from ratchet.model import dumps
from ratchet.store.dialect import Dialect

__all__ = [
    "WORKER_GONE_TTLS",
    "WorkerInfo",
    "hold",
    "live_workers",
    "register",
    "registration",
]

WORKER_GONE_TTLS = 20  # a worker unseen for this many of its TTLs is forgotten
# How long a start tries for its worker id's liveness lock before it is refused: another
# worker testing whether the id's last holder died holds the lock shared for a moment.
HOLD_TRIES_S = 1.0
HOLD_RETRY_S = 0.05


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A row of ``workers``: who serves which ``(workflow, version)`` pairs and queues."""

    worker_id: str
    host: str
    pid: int
    serves: frozenset[tuple[str, str]]
    queues: tuple[str, ...]
    lease_ttl: float
    seen_at: float


def registration(
    worker_id: str,
    host: str,
    pid: int,
    serves: Collection[tuple[str, str]],
    queues: Sequence[str],
    lease_ttl: float,
    liveness_lock: bool = False,
) -> dict[str, Any]:
    """A worker's row as the parameters of ``worker_upsert``; ``liveness_lock``: whether
    it holds its liveness lock, by which the others judge it alive."""
    return {
        "worker_id": worker_id,
        "host": host,
        "pid": pid,
        "serves": dumps(sorted([w, v] for w, v in serves)),
        "queues": dumps(list(queues)),
        "lease_ttl": lease_ttl,
        "liveness_lock": liveness_lock,
    }


async def hold(d: Dialect, worker_id: str) -> None:
    """Take ``worker_id``'s liveness lock, or raise :class:`WorkerIdInUse` naming the live
    worker that holds it."""
    deadline = time.monotonic() + HOLD_TRIES_S
    while not await d._hold(worker_id):
        if time.monotonic() >= deadline:
            row = await d._read(lambda tx: tx.one("worker_get", {"worker_id": worker_id}))
            who = "" if row is None else f" (host {row['host']}, pid {row['pid']})"
            raise WorkerIdInUse(
                f"worker id {worker_id!r} is in use by a live worker{who}: give each "
                "worker its own RATCHET_WORKER_ID (or --worker-id)"
            )
        await asyncio.sleep(HOLD_RETRY_S)


async def register(d: Dialect, params: dict[str, Any]) -> None:
    """Write (or rewrite) a worker's row."""
    await d._run(lambda tx: tx.send("worker_upsert", params))


async def live_workers(d: Dialect) -> list[WorkerInfo]:
    """The workers seen within their lease TTL, with what they serve."""
    rows = await d._read(lambda tx: tx.all("workers_live", {}))
    return [
        WorkerInfo(
            r["worker_id"],
            r["host"],
            r["pid"],
            frozenset((w, v) for w, v in json.loads(r["serves"])),
            tuple(json.loads(r["queues"])),
            r["lease_ttl"],
            r["seen_at"],
        )
        for r in rows
    ]
