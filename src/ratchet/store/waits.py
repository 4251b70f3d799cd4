"""Waits in the store: a run parks on what it waits for, and signals, children, approvals
and timers wake it.

A parked run is ``waiting`` with ``waiting_for`` naming its wait (``signal:NAME``,
``child:RUN``, ``approval:STEP``, or ``any:[...]`` for several) and, for a timer,
``not_before``. Parking and waking are ordered by the run's row lock: whoever writes what
the run waits for either finds it waiting and wakes it (``run_wake``) or commits before
the park, which then sees it satisfied and does not park.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ratchet.errors import RunFinished, SignalAlreadyConsumed
from ratchet.model import (
    ApprovalStatus,
    Event,
    Lease,
    RunRecord,
    RunStatus,
    WaitKey,
    WaitKind,
    dumps,
)
from ratchet.store import approvals
from ratchet.store.bus import READY
from ratchet.store.dialect import Dialect
from ratchet.store.journal import insert_events
from ratchet.store.leases import check_lease, release_in
from ratchet.store.queues import slot_freed
from ratchet.store.runs import locked_run
from ratchet.store.transaction import Tx

__all__ = ["consume_signal", "hand_back", "park", "pending_signal", "send_signal"]


async def park(
    d: Dialect,
    lease: Lease,
    events: Sequence[Event],
    waits: Sequence[str],
    not_before: float | None,
) -> tuple[str, list[str]]:
    """Append ``events`` and park the run unless a wait is satisfied (see ``Store.park``)."""

    def body(tx: Tx) -> tuple[str, list[str]]:
        # Locked before the condition is read: a signal, child or cancel committing
        # concurrently either is seen below or sees this run already waiting. (Every
        # transaction that locks both takes the runs row before the run_locks row.)
        row = tx.one("run_get_locked", {"run_id": lease.run_id})
        check_lease(tx, lease)
        insert_events(d, tx, events)
        if row["cancel_requested"]:
            return "cancel", [row["cancel_by"]] if row["cancel_by"] else []
        ready = [w for w in waits if _wait_satisfied(tx, lease.run_id, w)]
        if ready:
            return "ready", ready
        waiting_for = str(WaitKey.any_of(waits))
        tx.send(
            "run_park",
            {"run_id": lease.run_id, "waiting_for": waiting_for, "not_before": not_before},
        )
        release_in(tx, lease)
        if not_before is not None:
            d._announce(tx, READY)
        else:
            slot_freed(d, tx, row["queue"])  # a parked run holds no slot unless told to
        return "parked", []

    return await d._run(body)


def _wait_satisfied(tx: Tx, run_id: str, waiting_for: str) -> bool:
    key = WaitKey.parse(waiting_for)
    if key.kind == WaitKind.SIGNAL:
        return tx.one("signal_pending", {"run_id": run_id, "name": key.value}) is not None
    if key.kind == WaitKind.CHILD:
        child = tx.one("run_get", {"run_id": key.value})
        return child is not None and RunStatus(child["status"]).terminal
    if key.kind == WaitKind.APPROVAL:
        found = approvals.get(tx, run_id, key.value)
        return found is not None and found.status != ApprovalStatus.PENDING
    return False  # timers: the claim takes the run when not_before comes


async def hand_back(d: Dialect, lease: Lease, events: Sequence[Event]) -> None:
    """A drive stopped for a shutdown: append its last events, queue the run again and
    release the lease."""

    def body(tx: Tx) -> None:
        tx.one("run_get_locked", {"run_id": lease.run_id})
        check_lease(tx, lease)
        insert_events(d, tx, events)
        if tx.run("run_hand_back", {"run_id": lease.run_id}):
            d._announce(tx, READY)
        release_in(tx, lease)

    await d._run(body)


async def send_signal(d: Dialect, run_id: str, name: str, payload: Any) -> RunRecord:
    """Deliver a signal; wakes the run if it waits for this signal."""

    def body(tx: Tx) -> RunRecord:
        rec = locked_run(tx, run_id)
        if rec.status.terminal:
            raise RunFinished(f"run {run_id} has already {rec.status}; signal {name!r} refused")
        tx.send("signal_insert", {"run_id": run_id, "name": name, "payload": dumps(payload)})
        if tx.run("run_wake", {"run_id": run_id, "waiting_for": str(WaitKey.signal(name))}):
            d._announce(tx, READY)
        return rec

    return await d._run(body)


async def pending_signal(d: Dialect, run_id: str, name: str) -> tuple[int, Any] | None:
    """The oldest unconsumed signal ``name`` for the run: ``(signal_id, payload)``."""
    params = {"run_id": run_id, "name": name}
    row = await d._read(lambda tx: tx.one("signal_pending", params))
    return (int(row["id"]), json.loads(row["payload"])) if row else None


async def consume_signal(d: Dialect, lease: Lease, events: Sequence[Event], signal_id: int) -> None:
    """Append ``events`` and mark the signal consumed by the last of them, together.
    Only the lease holder consumes a run's signals, so the peek before cannot race."""

    def body(tx: Tx) -> None:
        check_lease(tx, lease)
        insert_events(d, tx, events)
        params = {"run_id": lease.run_id, "id": signal_id, "seq": events[-1].seq}
        if tx.run("signal_consume", params) != 1:
            raise SignalAlreadyConsumed(
                f"signal {signal_id} of run {lease.run_id} was already consumed"
            )

    await d._run(body)
