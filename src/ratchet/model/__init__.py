"""Runs, events, statuses and the fold.

The journal is the truth: a run's state is the fold of its events. The engine, the CLI
and any viewer fold the same way through :func:`fold`. This package imports nothing else
of Ratchet's, so every layer may import it; its names are imported from here
(``from ratchet.model import Event``), whichever module of it holds them:

- :mod:`~ratchet.model.states`: the state vocabularies (``StrEnum`` classes) and event kinds
- :mod:`~ratchet.model.waits`: wait keys
- :mod:`~ratchet.model.payloads`: the event payloads the fold reads
- :mod:`~ratchet.model.events`: the event, its hash chain and canonical JSON
- :mod:`~ratchet.model.fold`: a run's state folded from its journal
- :mod:`~ratchet.model.records`: the records the store returns
- :mod:`~ratchet.model.story`: a run's story for people (its input as given, its drives)
- :mod:`~ratchet.model.diff`: two runs side by side, step by step
- :mod:`~ratchet.model.requests`: model requests as the journal holds them, read back whole
"""

from ratchet.model.diff import RunDiff, StepDiff, StepSide, diff_states
from ratchet.model.events import (
    GENESIS_HASH,
    Event,
    dumps,
    idempotency_key,
    output_payload,
)
from ratchet.model.fold import (
    LLMTotals,
    RunState,
    StepState,
    apply,
    chain_next,
    fold,
    split_step_id,
)
from ratchet.model.payloads import (
    ABANDONED,
    UNNAMED_CANCEL,
    AnomalyPayload,
    ApprovalDecidedPayload,
    GatePayload,
    PatchMarkedPayload,
    RunDrivenPayload,
    RunEndedPayload,
    RunQueuedPayload,
    StepCompletedPayload,
    StepFailedPayload,
    StepStartedPayload,
    StepWaitingPayload,
)
from ratchet.model.records import (
    Approval,
    ClaimedRun,
    DeadLetter,
    Decision,
    DeliveryReceipt,
    Lease,
    NewRun,
    RunRecord,
)
from ratchet.model.requests import RequestIndex, request_of, requests_of
from ratchet.model.states import (
    TAKEOVERS,
    TERMINAL_EVENTS,
    TERMINAL_STATUSES,
    AnomalyKind,
    ApprovalStatus,
    ClaimReason,
    DeadLetterReason,
    DeliveryStatus,
    EventKind,
    GuardAction,
    QueueReason,
    RunStatus,
    SandboxStatus,
    SettledBy,
    StepStatus,
    WaitKind,
)
from ratchet.model.story import DriveStory, answer_text, drives, duration, failure, given_input
from ratchet.model.waits import (
    WaitKey,
)

__all__ = [
    "ABANDONED",
    "GENESIS_HASH",
    "TAKEOVERS",
    "TERMINAL_EVENTS",
    "TERMINAL_STATUSES",
    "UNNAMED_CANCEL",
    "AnomalyKind",
    "AnomalyPayload",
    "Approval",
    "ApprovalDecidedPayload",
    "ApprovalStatus",
    "ClaimReason",
    "ClaimedRun",
    "DeadLetter",
    "DeadLetterReason",
    "Decision",
    "DeliveryReceipt",
    "DeliveryStatus",
    "DriveStory",
    "Event",
    "EventKind",
    "GatePayload",
    "GuardAction",
    "LLMTotals",
    "Lease",
    "NewRun",
    "PatchMarkedPayload",
    "QueueReason",
    "RequestIndex",
    "RunDiff",
    "RunDrivenPayload",
    "RunEndedPayload",
    "RunQueuedPayload",
    "RunRecord",
    "RunState",
    "RunStatus",
    "SandboxStatus",
    "SettledBy",
    "StepCompletedPayload",
    "StepDiff",
    "StepFailedPayload",
    "StepSide",
    "StepStartedPayload",
    "StepState",
    "StepStatus",
    "StepWaitingPayload",
    "WaitKey",
    "WaitKind",
    "answer_text",
    "apply",
    "chain_next",
    "diff_states",
    "drives",
    "dumps",
    "duration",
    "failure",
    "fold",
    "given_input",
    "idempotency_key",
    "output_payload",
    "request_of",
    "requests_of",
    "split_step_id",
]
