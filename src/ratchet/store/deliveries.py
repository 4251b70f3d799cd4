"""Deliveries in the store: the receipt a side effect leaves (``receipts``), claimed before
it is dispatched and settled with the receiver's response.

These are a delivery's receipts, one per idempotency key; a run's signed receipt is
another thing (``ratchet.store.retention``). A claim and a settle are the lease holder's
writes, fenced by the lease like its appends. A receipt left claimed (a crash, a failed
dispatch) is settled by hand by a person who found out what happened, and only while no
worker holds the run's lease.
"""

from __future__ import annotations

from typing import Any

from ratchet.errors import ReceiptBusy, ReceiptSettled, StoreConflict, UnknownReceipt
from ratchet.model import DeliveryReceipt, Lease, dumps
from ratchet.store.dialect import Dialect
from ratchet.store.leases import check_lease
from ratchet.store.rows import receipt_from_row
from ratchet.store.runs import locked_run
from ratchet.store.transaction import Tx

__all__ = ["claim", "receipts", "reclaim", "resolve", "settle"]


async def claim(
    d: Dialect, lease: Lease, key: str, step_id: str, *, delivery: str, attempt: int
) -> DeliveryReceipt | None:
    """Claim a delivery before dispatch; None if newly claimed, else the receipt an
    earlier attempt or drive left for it (see ``Store.claim_receipt``)."""
    params = {
        "key": key,
        "run_id": lease.run_id,
        "step_id": step_id,
        "delivery": delivery,
        "attempt": attempt,
        "epoch": lease.epoch,
    }

    def body(tx: Tx) -> DeliveryReceipt | None:
        check_lease(tx, lease)
        if tx.run("receipt_claim", params) == 1:
            return None
        # A receipt from before deliveries had identities carries only its key.
        row = tx.one(
            "receipt_find", {"run_id": lease.run_id, "step_id": step_id, "delivery": delivery}
        ) or tx.one("receipt_get", {"key": key})
        if row is None:
            raise StoreConflict(
                f"receipt {key} of run {lease.run_id} step {step_id} "
                "conflicted on insert but cannot be read back"
            )
        return receipt_from_row(row)

    return await d._run(body)


async def reclaim(d: Dialect, lease: Lease, key: str) -> None:
    """Re-claim a receipt left claimed, for a resend under the same key."""

    def body(tx: Tx) -> None:
        check_lease(tx, lease)
        tx.send("receipt_reclaim", {"key": key, "epoch": lease.epoch})

    await d._run(body)


async def settle(d: Dialect, lease: Lease, key: str, response: Any) -> None:
    """Record the delivery's response, under the lease that dispatched it."""

    def body(tx: Tx) -> None:
        check_lease(tx, lease)
        tx.send("receipt_settle", {"key": key, "response": dumps(response), "epoch": lease.epoch})

    await d._run(body)


async def resolve(
    d: Dialect, key: str, response: Any = None, failed: bool = False
) -> DeliveryReceipt:
    """Settle a claimed receipt by hand (see ``Store.resolve_receipt``)."""

    def body(tx: Tx) -> DeliveryReceipt:
        row = tx.one("receipt_get", {"key": key})
        if row is None:
            raise UnknownReceipt(f"unknown receipt key {key!r}")
        run_id = row["run_id"]
        # The run's row, then its lease row, as every transaction locks them: a worker
        # claiming or settling under the lease waits for this one, or this one sees it.
        locked_run(tx, run_id)
        lock = tx.one("lease_row_locked", {"run_id": run_id})
        found = receipt_from_row(tx.one("receipt_get_locked", {"key": key}))
        if found.status != "claimed":
            raise ReceiptSettled(
                f"receipt {key} (run {run_id}, step {found.step_id}, delivery "
                f"{found.delivery}) is already {found.status}"
                + (" by hand" if found.settled_by == "hand" else "")
                + "; nothing changed"
            )
        if lock is not None and lock["worker_id"] is not None and bool(lock["live"]):
            raise ReceiptBusy(
                f"run {run_id} is being driven by worker {lock['worker_id']}, which may be "
                f"dispatching receipt {key} right now; settle it once the run has "
                "failed or its worker has stopped and the lease has expired"
            )
        tx.send(
            "receipt_resolve",
            {
                "key": key,
                "status": "failed" if failed else "settled",
                "response": None if failed else dumps(response),
            },
        )
        return receipt_from_row(tx.one("receipt_get", {"key": key}))

    return await d._run(body)


async def receipts(d: Dialect, run_id: str) -> list[DeliveryReceipt]:
    """A run's delivery receipts, in the order they were (last) claimed."""
    rows = await d._read(lambda tx: tx.all("receipts_list", {"run_id": run_id}))
    return [receipt_from_row(r) for r in rows]
