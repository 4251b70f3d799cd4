"""The payloads the fold reads, one ``TypedDict`` per event kind."""

from __future__ import annotations

from typing import Any, Required, TypedDict

# carry more). Written by the engine, read back from the journal: every key may be absent
# in an event an older version wrote, so reads go through ``.get``.


class RunQueuedPayload(TypedDict, total=False):
    guards: dict[str, Any] | None  # the run's guard overrides (the first run_queued only)
    reason: str  # a QueueReason: why the run was queued again
    by: str  # who retried it
    grant: dict[str, Any]  # the limits the retry moved
    forked_from: str  # a fork's first run_queued: the run it was forked from
    forked_at: str  # ... and the step it was forked at


class RunDrivenPayload(TypedDict, total=False):
    """``run_started`` and ``run_resumed``."""

    worker_id: str
    epoch: int
    reason: str  # a ClaimReason
    drive: int
    trace: Any  # the drive's trace context, if it was traced


class StepStartedPayload(TypedDict, total=False):
    key_attempt: int  # the attempt whose key this one sends (an outcome-unknown retry)
    child_run_id: str
    kind: str  # "llm", "tool"
    reserve: dict[str, Any]  # a model call's worst-case spend, held while it is in flight
    # The arguments by parameter name, bounded (see ratchet.engine.evidence); absent when
    # the step keeps them out of the journal (journal_args=False), and in older journals.
    args: Any


class StepCompletedPayload(TypedDict, total=False):
    output: Any
    llm: dict[str, Any]  # a model call's provider, model, usage and cost


class StepFailedPayload(TypedDict, total=False):
    """``step_failed``, and ``step_retrying`` (which adds when and how often)."""

    error: str
    error_type: str
    traceback: str  # the exception chain, bounded and without locals (older journals: none)
    outcome_unknown: bool  # the provider may have billed it: the next attempt keeps its key


class StepWaitingPayload(TypedDict, total=False):
    reason: str  # a WaitKind: what the step waits for
    name: str  # a signal's, or an approval's
    child_run_id: str
    until: float
    deadline: float | None


class AnomalyPayload(TypedDict, total=False):
    key: Required[str]  # the occurrence: a key already folded is never raised again
    kind: str  # an AnomalyKind
    action: str  # a GuardAction
    limit_key: str  # the limit it tripped, when it is one a person may move


class ApprovalDecidedPayload(TypedDict, total=False):
    approved: bool
    grant: dict[str, Any] | None  # the limits the approval of a guard's pause moved


class GatePayload(TypedDict, total=False):
    """``confidence_evaluated`` and ``confidence_gate_bypassed``."""

    key: Required[str]


class PatchMarkedPayload(TypedDict, total=False):
    """``patch_marked``: the run took patch ``patch``'s new path (``taken``, always true:
    a run that went past it the old way journals nothing). ``deprecated``: journaled by
    ``ratchet.deprecate_patch``. ``after``: how many step positions the run had taken
    then (the marker takes none)."""

    patch: Required[str]
    taken: Required[bool]
    deprecated: bool
    after: int


class RunEndedPayload(TypedDict, total=False):
    """``run_succeeded``, ``run_failed`` and ``run_cancelled``."""

    output: Any
    error: str | None
    reason: str  # run_failed: a DeadLetterReason or an AnomalyKind
    traceback: str  # run_failed by the workflow's own code (not a step's failure)
    by: str  # run_cancelled: who cancelled it (UNNAMED_CANCEL where nobody was named)


# A run_cancelled's ``by`` where the cancel named nobody (and every cancel a worker
# finished before cancels carried a name).
UNNAMED_CANCEL = "request"

# The error_type of a step its own workflow stopped waiting for (asyncio.wait_for, timeout).
ABANDONED = "StepAbandoned"
