"""Leases: which worker drives which run, and the fence on every holder's write.

A run is driven by the worker that holds its lease (``run_locks``: the holder, an epoch
that grows with each take, and an expiry the holder keeps renewing). A claim takes ready
runs; a live worker takes the runs of a worker it saw die (its liveness lock gone, see
``liveness.py`` and ``pg_liveness.py``) at once; the recovery sweep takes running runs
whose lease expired; a restarted worker takes its own back at once. Every write a holder
makes checks the lease, holder and epoch, in its own transaction (:func:`check_lease`), so
a holder that lost its lease writes nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratchet.errors import LeaseLost
from ratchet.model import ClaimedRun, ClaimReason, Lease
from ratchet.store import queues as queue_limits
from ratchet.store.bus import READY
from ratchet.store.dialect import Dialect
from ratchet.store.rows import record_from_row
from ratchet.store.transaction import Tx
from ratchet.store.workers import WORKER_GONE_TTLS

__all__ = ["TIMER_BATCH", "HeldLease", "LeaseState", "check_lease", "take"]

TIMER_BATCH = 100  # due timers promoted to queued per claim


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A lease as renewal found it: still this worker's, at this epoch; whether a cancel
    is pending, and who asked for it (None: nobody was named)."""

    run_id: str
    epoch: int
    cancel_requested: bool
    cancel_by: str | None = None


@dataclass(frozen=True, slots=True)
class LeaseState:
    """A run's lease as the database has it."""

    worker_id: str | None
    epoch: int
    live: bool


def check_lease(tx: Tx, lease: Lease) -> None:
    """Raise :class:`LeaseLost` unless ``lease`` is still the run's, at its epoch."""
    params = {"run_id": lease.run_id, "worker_id": lease.worker_id, "epoch": lease.epoch}
    if tx.one("lease_check", params) is None:
        raise LeaseLost(lease.run_id)


def take(
    d: Dialect,
    tx: Tx,
    ids: list[str],
    worker_id: str,
    ttl: float,
    reason: str,
    dead: list[str] | None = None,
) -> list[ClaimedRun]:
    """Lease the runs ``ids`` to ``worker_id`` and set them running; those taken. With
    ``dead``, the runs' leases are taken from those dead workers, live or not."""
    if not ids:
        return []
    params = {"ids": d._ids(ids), "worker_id": worker_id, "ttl": ttl}
    if dead is None:
        rows = tx.all("leases_take", params)
    else:
        rows = tx.all("leases_take_over", params | {"dead": d._ids(dead)})
    epochs = {r["run_id"]: r["epoch"] for r in rows}
    if not epochs:
        return []
    taken = d._ids(list(epochs))
    tx.send("runs_set_running", {"ids": taken})
    rows = tx.all("runs_get_many", {"ids": taken})
    return [
        ClaimedRun(rec, Lease(rec.run_id, worker_id, int(epochs[rec.run_id])), reason)
        for rec in map(record_from_row, rows)
    ]


async def claim(
    d: Dialect,
    worker_id: str,
    ttl: float,
    limit: int,
    queues: Sequence[str],
    served: Collection[tuple[str, str]],
) -> list[ClaimedRun]:
    """Take up to ``limit`` ready runs of the pairs in ``served`` (see ``Store.claim``)."""

    def body(tx: Tx) -> list[ClaimedRun]:
        if tx.all("timers_due", {"limit": TIMER_BATCH}):
            d._announce(tx, READY)
        names = list(dict.fromkeys(queues))
        limited = set(queue_limits.limited_in(d, tx, names))
        picked: list[Any] = []
        for queue in names:  # each along runs_queued, then merged
            if queue not in limited:
                params = {"queue": queue, "limit": limit, **d._served(served)}
                picked += tx.all("claim_pick", params)
        within = queue_limits.pick_limited(d, tx, list(limited), limit, served)
        bounded = {r["run_id"] for r in within}
        picked += within
        picked.sort(key=lambda r: (-r["priority"], r["created_at"]))
        ids = [r["run_id"] for r in picked[:limit]]
        taken = take(d, tx, ids, worker_id, ttl, "claim")
        queue_limits.mark_started(d, tx, [c for c in taken if c.record.run_id in bounded])
        return taken

    return await d._run(body)


async def steal_expired(
    d: Dialect,
    worker_id: str,
    ttl: float,
    limit: int,
    queues: Sequence[str],
    served: Collection[tuple[str, str]],
) -> list[ClaimedRun]:
    """The recovery sweep (see ``Store.steal_expired``)."""

    def body(tx: Tx) -> list[ClaimedRun]:
        tx.send("workers_prune", {"ttls": WORKER_GONE_TTLS})
        picked = tx.all(
            "steal_pick", {"queues": d._ids(queues), "limit": limit, **d._served(served)}
        )
        return take(d, tx, [r["run_id"] for r in picked], worker_id, ttl, "sweep")

    return await d._run(body)


async def take_over(
    d: Dialect,
    worker_id: str,
    ttl: float,
    limit: int,
    queues: Sequence[str],
    served: Collection[tuple[str, str]],
) -> tuple[list[ClaimedRun], bool]:
    """Take up to ``limit`` runs whose holder died (see ``Store.take_over``); and whether
    more of them wait."""
    # A look first, without writing: a write transaction every tick would contend with
    # every worker's steps (SQLite's single writer), and almost always nobody has died.
    if not await d._look(lambda tx: d._dead(tx, worker_id)):
        return [], False

    def body(tx: Tx) -> tuple[list[ClaimedRun], bool]:
        dead = d._dead(tx, worker_id)  # again, now that nothing can start meanwhile
        if not dead:
            return [], False
        params = {"dead": d._ids(dead), "queues": d._ids(queues), "limit": limit + 1}
        picked = [r["run_id"] for r in tx.all("takeover_pick", params | d._served(served))]
        taken = take(d, tx, picked[:limit], worker_id, ttl, ClaimReason.TAKEOVER, dead)
        tx.send("workers_forget", {"dead": d._ids(dead)})
        return taken, len(picked) > limit

    return await d._run(body)


def reclaim_in(
    d: Dialect, tx: Tx, worker_id: str, ttl: float, served: Collection[tuple[str, str]]
) -> list[ClaimedRun]:
    """Within ``tx``: take back the running runs still under ``worker_id``."""
    picked = tx.all("reclaim_pick", {"worker_id": worker_id, **d._served(served)})
    return take(d, tx, [r["run_id"] for r in picked], worker_id, ttl, "reclaim")


async def reclaim_own(
    d: Dialect, worker_id: str, ttl: float, served: Collection[tuple[str, str]]
) -> list[ClaimedRun]:
    """On restart: take back the running runs still under this worker id."""
    return await d._run(lambda tx: reclaim_in(d, tx, worker_id, ttl, served))


async def start_worker(
    d: Dialect,
    registration: dict[str, Any],
    served: Collection[tuple[str, str]],
) -> list[ClaimedRun]:
    """Register a worker and take back its interrupted runs, in one commit."""
    worker_id, ttl = registration["worker_id"], registration["lease_ttl"]

    def body(tx: Tx) -> list[ClaimedRun]:
        tx.send("worker_upsert", registration)
        return reclaim_in(d, tx, worker_id, ttl, served)

    return await d._run(body)


async def renew(
    d: Dialect,
    worker_id: str,
    ttl: float,
    run_ids: Sequence[str],
    registrations: Mapping[str, dict[str, Any]],
) -> list[HeldLease]:
    """Extend this worker's leases on ``run_ids``; those it still holds. ``registrations``:
    the workers' rows as registered, to write this one's again were it pruned."""
    ids = d._ids(run_ids)

    def body(tx: Tx) -> list[HeldLease]:
        if tx.run("worker_seen", {"worker_id": worker_id}) == 0:
            registration = registrations.get(worker_id)
            if registration is not None:  # pruned while cut off: be seen again
                tx.send("worker_upsert", registration)
        if not run_ids:
            return []
        tx.send("leases_renew", {"worker_id": worker_id, "ttl": ttl, "ids": ids})
        rows = tx.all("leases_held", {"worker_id": worker_id, "ids": ids})
        return [
            HeldLease(r["run_id"], int(r["epoch"]), bool(r["cancel_requested"]), r["cancel_by"])
            for r in rows
        ]

    return await d._run(body)


async def retake_lease(d: Dialect, lease: Lease, ttl: float) -> Lease | None:
    """The holder's lease again under a new epoch; None if it moved on meanwhile."""
    params = {
        "run_id": lease.run_id,
        "worker_id": lease.worker_id,
        "epoch": lease.epoch,
        "ttl": ttl,
    }

    def body(tx: Tx) -> Lease | None:
        row = tx.one("lease_retake", params)
        return None if row is None else Lease(lease.run_id, lease.worker_id, int(row["epoch"]))

    return await d._run(body)


async def release_worker(d: Dialect, worker_id: str) -> None:
    """Hand a stopping worker's running runs back to the queue and drop its row."""

    def body(tx: Tx) -> None:
        if tx.run("runs_requeue_worker", {"worker_id": worker_id}):
            d._announce(tx, READY)
        tx.send("leases_release_worker", {"worker_id": worker_id})
        tx.send("worker_delete", {"worker_id": worker_id})

    await d._run(body)


async def lease_state(d: Dialect, run_id: str) -> LeaseState | None:
    """Who holds the run's lease now; None if the run was never claimed."""
    row = await d._read(lambda tx: tx.one("lease_get", {"run_id": run_id}))
    return LeaseState(row["worker_id"], int(row["epoch"]), bool(row["live"])) if row else None


def release_in(tx: Tx, lease: Lease) -> None:
    """Within ``tx``: give up ``lease`` (the run parks or goes back to the queue)."""
    tx.send(
        "lease_release",
        {"run_id": lease.run_id, "worker_id": lease.worker_id, "epoch": lease.epoch},
    )
