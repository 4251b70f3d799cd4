"""How runs end in the store: a holder finishes its run; a person cancels one or retries a
dead-lettered one.

A run's terminal status is set once, by an update guarded on the run not being terminal
yet: of two finishers exactly one gets through. The transaction that ends a run drops
what a finished run no longer needs, wakes a parent waiting for it, and cancels its
unfinished children (rows locked parent first, the order every transaction follows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ratchet.errors import NotDeadLettered, RunFinished
from ratchet.model import (
    UNNAMED_CANCEL,
    Event,
    EventKind,
    Lease,
    RunRecord,
    RunStatus,
    WaitKey,
    dumps,
)
from ratchet.store.bus import CANCEL, DONE, READY
from ratchet.store.dialect import Dialect
from ratchet.store.journal import append_unowned, insert_events
from ratchet.store.leases import check_lease
from ratchet.store.queues import slot_freed
from ratchet.store.retention import put_receipt_in
from ratchet.store.rows import record_from_row
from ratchet.store.runs import locked_run, locked_run_and_parent
from ratchet.store.start_options import check_dedup_free
from ratchet.store.transaction import Tx

__all__ = ["cancel", "finish", "retry_dead"]


async def finish(
    d: Dialect,
    lease: Lease,
    events: Sequence[Event],
    status: RunStatus,
    output: Any = None,
    error: str | None = None,
    dead_letter: str | None = None,
    receipt: dict[str, Any] | None = None,
) -> None:
    """Append the terminal events and set the terminal status, once (see ``Store.finish``)."""

    def body(tx: Tx) -> None:
        # Runs rows first (the lock order every transaction follows: a parent's, then
        # the run's, then the lease); the guarded update goes before the events so a
        # second finisher is told RunFinished rather than tripping over the first one's
        # sequence numbers.
        locked_run_and_parent(tx, lease.run_id)
        check_lease(tx, lease)
        params = {
            "run_id": lease.run_id,
            "status": str(status),
            "output": dumps(output) if output is not None else None,
            "error": error,
        }
        if tx.run("run_finish", params) != 1:
            raise RunFinished(f"run {lease.run_id} has already finished")
        insert_events(d, tx, events)
        if receipt is not None:
            put_receipt_in(tx, receipt)
        if dead_letter:
            tx.send(
                "dead_letter_put",
                {"run_id": lease.run_id, "reason": dead_letter, "error": error or ""},
            )
        _ended(d, tx, lease.run_id)
        rec = record_from_row(tx.one("run_get", {"run_id": lease.run_id}))
        slot_freed(d, tx, rec.queue)
        if rec.parent_run_id and tx.run(
            "run_wake", {"run_id": rec.parent_run_id, "waiting_for": str(WaitKey.child(rec.run_id))}
        ):
            d._announce(tx, READY)
        _cancel_children(d, tx, lease.run_id, _cancelled_by(events))

    await d._run(body)


def _cancelled_by(events: Sequence[Event]) -> str | None:
    """Who cancelled the run these terminal events end, as its ``run_cancelled`` names
    them: its children are cancelled by the same person. None for any other end."""
    for e in events:
        if e.kind == EventKind.RUN_CANCELLED:
            by = e.payload.get("by")
            return by if isinstance(by, str) and by != UNNAMED_CANCEL else None
    return None


def _ended(d: Dialect, tx: Tx, run_id: str) -> None:
    """In the transaction that set a run's terminal status (run_finish, which keeps
    the lease's epoch on the run): drop the rows a finished run no longer needs (its
    lease, its consumed signals; receipts stay, they are evidence) and announce it."""
    tx.send("lease_drop", {"run_id": run_id})
    tx.send("signals_drop_consumed", {"run_id": run_id})
    d._announce(tx, DONE, run_id)


async def cancel(d: Dialect, run_id: str, by: str | None = None) -> RunStatus:
    """Cancel a run and its unfinished children (see ``Store.cancel``)."""

    def body(tx: Tx) -> RunStatus:
        rec = locked_run_and_parent(tx, run_id)
        return _cancel_locked(d, tx, rec, by)

    return await d._run(body)


def _cancel_locked(d: Dialect, tx: Tx, rec: RunRecord, by: str | None = None) -> RunStatus:
    """Cancel ``rec`` (its row locked, after its parent's) and then its children."""
    run_id = rec.run_id
    if rec.status.terminal:
        return rec.status
    lock = tx.one("lease_row_locked", {"run_id": run_id})
    if lock is not None and lock["worker_id"] is not None and bool(lock["live"]):
        # Its worker finishes it, and its children with it (see finish), naming ``by``.
        tx.send("run_cancel_request", {"run_id": run_id, "by": by})
        d._announce(tx, CANCEL, run_id)
        return rec.status
    # The lease row (locked above, so in-flight appends have landed) goes with the
    # run's end: an expired holder finds no lease to write under.
    # ``by``: who asked, where the caller knows ("request" where it does not, as before).
    append_unowned(d, tx, run_id, EventKind.RUN_CANCELLED, {"by": by or UNNAMED_CANCEL})
    tx.send(
        "run_finish",
        {"run_id": run_id, "status": "cancelled", "output": None, "error": "cancelled"},
    )
    _ended(d, tx, run_id)
    slot_freed(d, tx, rec.queue)  # a parked run its queue held a slot for
    if rec.parent_run_id and tx.run(
        "run_wake", {"run_id": rec.parent_run_id, "waiting_for": str(WaitKey.child(run_id))}
    ):
        d._announce(tx, READY)
    _cancel_children(d, tx, run_id, by)
    return RunStatus.CANCELLED


def _cancel_children(d: Dialect, tx: Tx, run_id: str, by: str | None = None) -> None:
    """A run ended: its unfinished children (and theirs) are cancelled with it, by whoever
    cancelled it (``by``). Their rows are locked after the parent's, the order every
    transaction follows."""
    for row in tx.all("runs_children_active", {"run_id": run_id}):
        _cancel_locked(d, tx, locked_run(tx, row["run_id"]), by)


async def retry_dead(
    d: Dialect, run_id: str, grant: dict[str, Any] | None = None, by: str | None = None
) -> RunRecord:
    """Re-queue a dead-lettered run (see ``Store.retry_dead``)."""

    def body(tx: Tx) -> RunRecord:
        rec = locked_run(tx, run_id)
        if rec.status != RunStatus.FAILED or tx.run("dead_letter_delete", {"run_id": run_id}) != 1:
            raise NotDeadLettered(f"run {run_id} is {rec.status}, not dead-lettered")
        check_dedup_free(tx, run_id)
        tx.one("lease_row_locked", {"run_id": run_id})
        payload: dict[str, Any] = {"reason": "retry"}
        if by is not None:
            payload["by"] = by
        if grant is not None:
            payload["grant"] = grant
        append_unowned(d, tx, run_id, EventKind.RUN_QUEUED, payload)
        tx.send("run_requeue", {"run_id": run_id})
        d._announce(tx, READY)
        return record_from_row(tx.one("run_get", {"run_id": run_id}))

    return await d._run(body)
