"""The records the store returns and the engine hands out: runs, leases, deliveries,
dead letters, approvals and decisions."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ratchet.model.states import ApprovalStatus, DeliveryStatus, RunStatus, SettledBy


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A row of ``runs``."""

    run_id: str
    workflow: str
    workflow_version: str
    input: Any
    status: RunStatus
    output: Any
    error: str | None
    parent_run_id: str | None
    parent_step_id: str | None
    queue: str
    priority: int
    not_before: float | None
    waiting_for: str | None
    created_at: float
    updated_at: float
    tenant_id: str = "default"
    # Set at start, never changed (a child run's are its parent's); see ratchet.names.
    tags: dict[str, str] = field(default_factory=dict)
    # A fork's source run and the step it was forked at (see ratchet.app.forking); None
    # for a run started afresh. Set at creation, never changed.
    forked_from: str | None = None
    forked_at: str | None = None
    # The key its queue's per_key_concurrency counts it under (a non-default tenant's is
    # stored with the tenant's prefix, see ratchet.store.tenants.scoped_key); set at start.
    concurrency_key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "workflow_version": self.workflow_version,
            "input": self.input,
            "status": str(self.status),
            "output": self.output,
            "error": self.error,
            "parent_run_id": self.parent_run_id,
            "parent_step_id": self.parent_step_id,
            "queue": self.queue,
            "priority": self.priority,
            "not_before": self.not_before,
            "waiting_for": self.waiting_for,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "tags": dict(self.tags),
            "forked_from": self.forked_from,
            "forked_at": self.forked_at,
            "concurrency_key": self.concurrency_key,
        }


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run to create: validated, serialisable input."""

    run_id: str
    workflow: str
    workflow_version: str
    input: Any
    queue: str = "default"
    priority: int = 0
    parent_run_id: str | None = None
    parent_step_id: str | None = None
    # A child run takes its parent's tenant whatever this says (the insert reads it).
    tenant_id: str = "default"
    # Guard overrides for this run (their JSON form, checked), journaled in run_queued.
    guards: dict[str, Any] | None = None
    # Its tags (checked), journaled in run_queued; a child run is given its parent's.
    tags: dict[str, str] = field(default_factory=dict)
    # A fork's source run and fork point (see RunRecord), journaled in run_queued.
    forked_from: str | None = None
    forked_at: str | None = None
    # Its queue's per_key_concurrency counts the runs in flight sharing it (ratchet.store.queues).
    concurrency_key: str | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's hold on a run: ``epoch`` is the fencing token."""

    run_id: str
    worker_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """A run a worker has just taken, with the lease it holds and why it took it."""

    record: RunRecord
    lease: Lease
    reason: str  # a ClaimReason


@dataclass(frozen=True, slots=True)
class DeliveryReceipt:
    """A delivery's receipt: a row of ``side_effect_receipts`` (not a run's signed receipt,
    for which see :mod:`ratchet.receipts`)."""

    idempotency_key: str
    run_id: str
    step_id: str
    status: DeliveryStatus
    response: Any
    claimed_at: float
    settled_at: float | None
    # The delivery within its step: its name, or "#n" for the step's n-th unnamed one.
    # (run_id, step_id, delivery) is the receipt's identity; the key is the one sent out.
    delivery: str = "#1"
    attempt: int | None = None  # the attempt that first claimed it, whose key it carries
    settled_by: SettledBy | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "idempotency_key": self.idempotency_key,
            "run_id": self.run_id,
            "step_id": self.step_id,
            "delivery": self.delivery,
            "attempt": self.attempt,
            "status": str(self.status),
            "response": self.response,
            "settled_by": self.settled_by,
            "claimed_at": self.claimed_at,
            "settled_at": self.settled_at,
        }


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A row of ``dead_letters``."""

    run_id: str
    workflow: str
    reason: str
    error: str
    at: float


@dataclass(frozen=True, slots=True)
class Decision:
    """A person's decision on an approval: what ``ratchet.approval`` returns. ``grant``:
    on a guard's pause, the limits the approval moved (how far the run may go over)."""

    approved: bool
    by: str
    comment: str | None
    at: datetime
    grant: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form journaled as the approval step's output."""
        out = {
            "approved": self.approved,
            "by": self.by,
            "comment": self.comment,
            "at": self.at.isoformat(),
        }
        if self.grant is not None:
            out["grant"] = self.grant
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Decision:
        return Decision(
            bool(data["approved"]),
            str(data["by"]),
            data.get("comment"),
            datetime.fromisoformat(str(data["at"])),
            data.get("grant"),
        )


@dataclass(frozen=True, slots=True)
class Approval:
    """A row of ``approvals``: what a run asked a person, and what they decided.
    ``status``: pending, approved, rejected or expired (its deadline passed first)."""

    run_id: str
    step_id: str
    attempt: int
    name: str
    data: Any
    root_run_id: str  # the top-level run: the run itself, or its parent's parent's ...
    asked_at: float
    deadline: float | None
    status: ApprovalStatus
    decided_by: str | None = None
    comment: str | None = None
    decided_at: float | None = None
    parent_run_id: str | None = None
    note: str | None = None  # a name the client gave beside the decider (the HTTP API's token)
    grant: dict[str, Any] | None = None  # a guard pause's approval: the limits it moved

    @property
    def decision(self) -> Decision | None:
        if not self.status.decided:
            return None
        assert self.decided_by is not None and self.decided_at is not None
        return Decision(
            self.status == ApprovalStatus.APPROVED,
            self.decided_by,
            self.comment,
            datetime.fromtimestamp(self.decided_at, UTC),
            self.grant,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "step_id": self.step_id,
            "name": self.name,
            "data": self.data,
            "root_run_id": self.root_run_id,
            "parent_run_id": self.parent_run_id,
            "asked_at": self.asked_at,
            "deadline": self.deadline,
            "status": str(self.status),
            "decided_by": self.decided_by,
            "comment": self.comment,
            "decided_at": self.decided_at,
            "note": self.note,
            "grant": self.grant,
        }
