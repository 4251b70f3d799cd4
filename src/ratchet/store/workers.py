"""Workers in the store: who is alive, and what each serves.

A worker writes its row (``workers``) when it starts and is seen again at each lease
renewal; it is judged alive by its own lease TTL. The recovery sweep forgets a worker
unseen for :data:`WORKER_GONE_TTLS` of its TTLs; one that was only cut off registers
again at its next renewal, from the registration the store kept for it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ratchet.model import dumps
from ratchet.store.dialect import Dialect

__all__ = ["WORKER_GONE_TTLS", "WorkerInfo", "live_workers", "register", "registration"]

WORKER_GONE_TTLS = 20  # a worker unseen for this many of its TTLs is forgotten


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
) -> dict[str, Any]:
    """A worker's row as the parameters of ``worker_upsert``."""
    return {
        "worker_id": worker_id,
        "host": host,
        "pid": pid,
        "serves": dumps(sorted([w, v] for w, v in serves)),
        "queues": dumps(list(queues)),
        "lease_ttl": lease_ttl,
    }


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
