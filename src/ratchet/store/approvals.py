"""Approvals in the store: the transaction bodies behind the store's approval methods.

An approval is a row per approval step (``approvals``), written by the run's lease holder
together with the ``step_waiting`` event that asks, so it is listed and decidable from
then on. A person's decision is an update guarded by ``status = 'pending'``, made with the
run's row locked (PostgreSQL: FOR UPDATE; SQLite: BEGIN IMMEDIATE), so of two deciders
exactly one is recorded and the other is told who decided what and when. The decision
wakes the run; its drive journals ``approval_decided`` and the step's ``step_completed``
(the journal stays the truth of the run; this row is the mailbox). A deadline that
passes first is claimed the same guarded way (``expired``), by the lease holder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ratchet.errors import (
    ApprovalAlreadyDecided,
    ApprovalNotPending,
    InvalidInput,
    StoreConflict,
    UnknownApproval,
)
from ratchet.model import AnomalyKind, Approval, ApprovalStatus, Event, Lease, WaitKey, dumps
from ratchet.store.bus import READY
from ratchet.store.dialect import Dialect
from ratchet.store.journal import insert_events
from ratchet.store.leases import check_lease
from ratchet.store.runs import locked_run
from ratchet.store.transaction import Tx

# A run's ancestors are walked up to this depth to find its top-level run.
MAX_DEPTH = 1000


def approval_from_row(row: Any) -> Approval:
    """An ``approvals`` row as an :class:`Approval`."""
    return Approval(
        run_id=row["run_id"],
        step_id=row["step_id"],
        attempt=int(row["attempt"]),
        name=row["name"],
        data=json.loads(row["data"]),
        root_run_id=row["root_run_id"],
        asked_at=row["asked_at"],
        deadline=row["deadline"],
        status=ApprovalStatus(row["status"]),
        decided_by=row["decided_by"],
        comment=row["comment"],
        decided_at=row["decided_at"],
        parent_run_id=row["parent_run_id"],
        note=row["note"],
        grant=json.loads(row["granted"]) if row["granted"] is not None else None,
    )


def _root(tx: Tx, run_id: str) -> str:
    root = run_id
    for _ in range(MAX_DEPTH):
        row = tx.one("run_get", {"run_id": root})
        if row is None or row["parent_run_id"] is None:
            return root
        root = row["parent_run_id"]
    raise StoreConflict(f"run {run_id}: its ancestry is deeper than {MAX_DEPTH} runs")


def ask(
    d: Dialect,
    tx: Tx,
    lease: Lease,
    events: Sequence[Event],
    step_id: str,
    attempt: int,
    name: str,
    data: Any,
    deadline: float | None,
) -> None:
    """Within ``tx``: append ``events`` (the ``step_waiting`` that asks) under the lease
    and write the approval's row."""
    check_lease(tx, lease)
    insert_events(d, tx, events)
    tx.send(
        "approval_ask",
        {
            "run_id": lease.run_id,
            "step_id": step_id,
            "attempt": attempt,
            "name": name,
            "data": dumps(data),
            "root_run_id": _root(tx, lease.run_id),
            "deadline": deadline,
        },
    )


def get(tx: Tx, run_id: str, step_id: str) -> Approval | None:
    """Within ``tx``: the approval asked by step ``step_id`` of the run."""
    row = tx.one("approval_get", {"run_id": run_id, "step_id": step_id})
    return approval_from_row(row) if row else None


def expire(tx: Tx, lease: Lease, step_id: str, attempt: int) -> Approval:
    """Claim the approval as expired unless a decision came first; the row as it ends."""
    check_lease(tx, lease)
    tx.run("approval_expire", {"run_id": lease.run_id, "step_id": step_id, "attempt": attempt})
    found = get(tx, lease.run_id, step_id)
    if found is None:
        raise StoreConflict(f"run {lease.run_id}: approval {step_id} has no row")
    return found


def find(tx: Tx, run_id: str, step: str) -> Approval:
    """The approval ``step`` names in the run: a step id, or an approval's name that
    picks one pending approval (or the only one of that name)."""
    found = get(tx, run_id, step)
    if found is not None:
        return found
    rows = [
        approval_from_row(r) for r in tx.all("approvals_named", {"run_id": run_id, "name": step})
    ]
    pending = [a for a in rows if a.status == ApprovalStatus.PENDING]
    if len(pending) == 1:
        return pending[0]
    if len(rows) == 1:
        return rows[0]
    if not rows:
        raise UnknownApproval(
            f"run {run_id} has no approval {step!r} (neither a step id nor "
            "the name of an approval it asked for)"
        )
    steps = ", ".join(a.step_id for a in (pending or rows))
    raise InvalidInput(
        f"run {run_id} asked for approval {step!r} more than once ({steps}): name the step id"
    )


def granting(
    found: Approval, approved: bool, grant: dict[str, Any] | None
) -> dict[str, Any] | None:
    """What approving ``found`` grants: on a pause of a limit (a budget, ``max_steps``),
    ``grant`` (limits to new values), else what the paused call needed for a budget (so the
    next call over it pauses again) and no step limit for ``max_steps``. Nothing for a
    rejection, nor for any other approval, which may not be given a grant."""
    anomaly = found.data.get("anomaly") if isinstance(found.data, dict) else None
    limit = anomaly.get("limit_key") if isinstance(anomaly, dict) else None
    if grant is not None and (limit is None or not found.name.startswith("guard:")):
        raise InvalidInput(
            f"approval {found.name!r} (run {found.run_id}, step "
            f"{found.step_id}) is not a guard's pause of a budget or of "
            "max_steps: it takes no grant"
        )
    if grant is not None and not approved:
        raise InvalidInput("a rejection grants nothing: give a grant only when approving")
    if not approved or limit is None or not isinstance(anomaly, dict):
        return None
    if grant is not None:
        return grant
    if anomaly.get("kind") == AnomalyKind.EXCESSIVE_STEPS:
        return {"max_steps": None}
    field = anomaly.get("limit_field")
    needed = anomaly.get("needed", anomaly.get("used"))
    return {field: needed} if isinstance(field, str) and needed is not None else None


def _when(at: float | None) -> str:
    return datetime.fromtimestamp(at or 0, UTC).isoformat(timespec="seconds")


def not_pending(found: Approval) -> ApprovalNotPending:
    """The error for a decision on an approval that is no longer pending."""
    where = f"approval {found.name!r} (run {found.run_id}, step {found.step_id})"
    if found.status.decided:
        comment = f" with comment {found.comment!r}" if found.comment else ""
        return ApprovalAlreadyDecided(
            f"{where} was already {found.status} by {found.decided_by} at "
            f"{_when(found.decided_at)}{comment}; a decision is recorded once, nothing changed"
        )
    return ApprovalNotPending(
        f"{where} timed out at {_when(found.decided_at)} with no decision; nothing changed"
    )


def decide(
    d: Dialect,
    tx: Tx,
    run_id: str,
    step: str,
    approved: bool,
    by: str,
    comment: str | None,
    note: str | None = None,
    grant: dict[str, Any] | None = None,
) -> Approval:
    """Within ``tx``: record a person's decision and wake the run (see
    ``Store.decide_approval``)."""
    rec = locked_run(tx, run_id)
    found = find(tx, run_id, step)
    if found.status != ApprovalStatus.PENDING:
        raise not_pending(found)
    if rec.status.terminal:
        raise ApprovalNotPending(
            f"approval {found.name!r} (run {run_id}, step "
            f"{found.step_id}) is no longer pending: the run has "
            f"already {rec.status}; nothing changed"
        )
    granted = granting(found, approved, grant)
    params = {
        "run_id": run_id,
        "step_id": found.step_id,
        "attempt": found.attempt,
        "status": str(ApprovalStatus.APPROVED if approved else ApprovalStatus.REJECTED),
        "by": by,
        "comment": comment,
        "note": note,
        "grant": dumps(granted) if granted is not None else None,
    }
    if tx.run("approval_decide", params) != 1:
        # Deciders hold the run's row, but the lease holder claims a passed deadline
        # without it: the guarded update lost to that expiry.
        now = get(tx, run_id, found.step_id)
        if now is None or now.status == ApprovalStatus.PENDING:
            raise StoreConflict(
                f"run {run_id}: approval {found.step_id} changed while being decided"
            )
        raise not_pending(now)
    if tx.run("run_wake", {"run_id": run_id, "waiting_for": str(WaitKey.approval(found.step_id))}):
        d._announce(tx, READY)
    decided = get(tx, run_id, found.step_id)
    assert decided is not None
    return decided


async def pending(d: Dialect, run_id: str | None = None, limit: int = 100) -> list[Approval]:
    """Pending approvals of unfinished runs, oldest first (of ``run_id`` and the runs
    under it, if given)."""
    params = {"run_id": run_id, "limit": limit}
    rows = await d._read(lambda tx: tx.all("approvals_pending", params))
    return [approval_from_row(r) for r in rows]
