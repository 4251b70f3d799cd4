"""The state vocabularies: run, step, claim, queue, dead-letter, anomaly, guard,
delivery, approval, sandbox and wait statuses as ``StrEnum``s, the event kinds, and the
sets of them the engine and the fold test against."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run stands."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})


class EventKind(StrEnum):
    """The kinds of journal event (docs/concepts/journal.md, "Events")."""

    RUN_QUEUED = "run_queued"
    RUN_STARTED = "run_started"
    RUN_RESUMED = "run_resumed"
    STEP_STARTED = "step_started"
    STEP_COMPLETED = "step_completed"
    STEP_FAILED = "step_failed"
    STEP_RETRYING = "step_retrying"
    STEP_WAITING = "step_waiting"
    SIGNAL_RECEIVED = "signal_received"
    APPROVAL_DECIDED = "approval_decided"
    TOOL_CALLED = "tool_called"
    ANOMALY_DETECTED = "anomaly_detected"
    CONFIDENCE_EVALUATED = "confidence_evaluated"
    CONFIDENCE_GATE_BYPASSED = "confidence_gate_bypassed"
    # ratchet.patched / deprecate_patch: a run reached a patch first under the code that
    # has it (it takes no step position; see docs/how-to/upgrading.md).
    PATCH_MARKED = "patch_marked"
    REQUEST_DRIFTED = "request_drifted"
    RUN_SUCCEEDED = "run_succeeded"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"


TERMINAL_EVENTS = {
    EventKind.RUN_SUCCEEDED: RunStatus.SUCCEEDED,
    EventKind.RUN_FAILED: RunStatus.FAILED,
    EventKind.RUN_CANCELLED: RunStatus.CANCELLED,
}


class StepStatus(StrEnum):
    """Where a step stands, as its events leave it (:attr:`StepState.status`)."""

    PENDING = "pending"
    STARTED = "started"
    RETRYING = "retrying"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        """Whether the step has a journaled outcome: its output, or its failure."""
        return self in (StepStatus.COMPLETED, StepStatus.FAILED)


class ClaimReason(StrEnum):
    """Why a drive took a run (:attr:`ClaimedRun.reason`, ``run_resumed``'s ``reason``)."""

    CLAIM = "claim"  # it was queued, or its timer came
    SWEEP = "sweep"  # the recovery sweep stole an expired lease
    # A live worker saw the holder die (its liveness lock gone) and took the lease at once,
    # live or not
    TAKEOVER = "takeover"
    RECLAIM = "reclaim"  # a restarted worker took back the runs it held
    RETRY = "retry"  # the worker took its own lease again to drive the run once more
    SANDBOX = "sandbox"  # an isolated run's harness, driving under its host's lease


# Why a drive took a run whose last holder never handed it back (it died, hung, or was cut
# off): the recovery sweep stole its lease, a live worker saw it die and took it, or its
# restarted worker reclaimed it.
TAKEOVERS = frozenset({ClaimReason.SWEEP, ClaimReason.TAKEOVER, ClaimReason.RECLAIM})


class QueueReason(StrEnum):
    """``run_queued``'s ``reason`` after the first: why a run was queued again."""

    RETRY = "retry"  # a person re-queued a dead-lettered run
    RESUME = "resume"  # a person resumed a cancelled run


class DeadLetterReason(StrEnum):
    """Why a run was dead-lettered (``dead_letters.reason``, ``run_failed``'s ``reason``).
    A guard that fails a run leaves its :class:`AnomalyKind` there instead."""

    WORKFLOW_ERROR = "workflow_error"
    STEP_FAILED = "step_failed"
    NON_DETERMINISM = "non_determinism"
    CRASH_LOOP = "crash_loop"
    NOT_SERIALIZABLE = "not_serializable"
    STORE_REFUSED = "store_refused"
    TIMEOUT = "timeout"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    SANDBOX_RESUME_EXHAUSTED = "sandbox_resume_exhausted"


class AnomalyKind(StrEnum):
    """What a guard journals in ``anomaly_detected`` (``kind``), and the code of the
    :class:`~ratchet.errors.GuardTripped` it raises when its action is ``fail``."""

    RUNAWAY_LOOP = "runaway_loop"
    EXCESSIVE_STEPS = "excessive_steps"
    RETRY_STORM = "retry_storm"
    COST_SPIKE = "cost_spike"
    TOKEN_SPIKE = "token_spike"
    BUDGET_EXCEEDED = "budget_exceeded"


class GuardAction(StrEnum):
    """What a guard does when it trips (``anomaly_detected``'s ``action``)."""

    RECORD = "record"  # journal it; the run goes on
    PAUSE = "pause"  # park the run on an approval: a person decides whether it goes on
    FAIL = "fail"  # fail the run, dead-lettered with the anomaly's kind


class DeliveryStatus(StrEnum):
    """Where a delivery's receipt stands (``side_effect_receipts.status``)."""

    CLAIMED = "claimed"  # claimed before dispatch; no response stored yet
    SETTLED = "settled"  # the response is stored: a re-drive returns it
    FAILED = "failed"  # settled by hand as not delivered


class SettledBy(StrEnum):
    """Who settled a delivery's receipt (``side_effect_receipts.settled_by``)."""

    WORKER = "worker"
    HAND = "hand"  # a person, with ``ratchet receipts settle``


class ApprovalStatus(StrEnum):
    """Where an approval stands (``approvals.status``)."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"  # its deadline passed before anyone decided

    @property
    def decided(self) -> bool:
        """Whether a person decided it (approved or rejected)."""
        return self in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)


class SandboxStatus(StrEnum):
    """Where an isolated run's sandbox stands (``sandboxes.status``)."""

    STARTING = "starting"
    RUNNING = "running"
    TERMINATED = "terminated"


class WaitKind(StrEnum):
    """What a parked run waits for: the part of a :class:`WaitKey` before its colon."""

    SIGNAL = "signal"  # a signal by name
    CHILD = "child"  # a child run's terminal event, by its run id
    SLEEP = "sleep"  # a durable sleep's timer, by step id
    BACKOFF = "backoff"  # a retry's backoff timer, by step id
    APPROVAL = "approval"  # a person's decision, by step id
    ANY = "any"  # several of the above: whichever comes first
