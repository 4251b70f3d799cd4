"""Runs, events, statuses and the fold.

The journal is the truth: a run's state is the fold of its events. The engine, the CLI
and any viewer fold the same way through :func:`fold`. This module imports nothing else
of Ratchet's, so every layer may import it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Required, TypedDict, cast


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
    RUN_SUCCEEDED = "run_succeeded"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"


TERMINAL_EVENTS = {
    EventKind.RUN_SUCCEEDED: RunStatus.SUCCEEDED,
    EventKind.RUN_FAILED: RunStatus.FAILED,
    EventKind.RUN_CANCELLED: RunStatus.CANCELLED,
}

GENESIS_HASH = "0" * 64


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
    RECLAIM = "reclaim"  # a restarted worker took back the runs it held
    RETRY = "retry"  # the worker took its own lease again to drive the run once more
    SANDBOX = "sandbox"  # an isolated run's harness, driving under its host's lease


# Why a drive took a run whose last holder never handed it back (it died, hung, or was cut
# off): the recovery sweep stole its lease, or its restarted worker reclaimed it.
TAKEOVERS = frozenset({ClaimReason.SWEEP, ClaimReason.RECLAIM})


class QueueReason(StrEnum):
    """``run_queued``'s ``reason`` after the first: why a run was queued again."""

    RETRY = "retry"  # a person re-queued a dead-lettered run


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


@dataclass(frozen=True, slots=True)
class WaitKey:
    """What a parked run waits for, as ``runs.waiting_for`` stores it: ``str(key)`` is
    ``"<kind>:<value>"`` (``signal:NAME``, ``child:RUN``, ``sleep:STEP``, ``backoff:STEP``,
    ``approval:STEP``, or ``any:[...]`` for several). Build keys with the constructors and
    read stored ones with :meth:`parse`, so the key a run parks on and the key that wakes
    it cannot drift apart."""

    kind: WaitKind
    value: str

    def __post_init__(self) -> None:
        if not self.value:
            raise ValueError(f"a {self.kind} wait key needs a value")

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"

    @staticmethod
    def signal(name: str) -> WaitKey:
        return WaitKey(WaitKind.SIGNAL, name)

    @staticmethod
    def child(run_id: str) -> WaitKey:
        return WaitKey(WaitKind.CHILD, run_id)

    @staticmethod
    def sleep(step_id: str) -> WaitKey:
        return WaitKey(WaitKind.SLEEP, step_id)

    @staticmethod
    def backoff(step_id: str) -> WaitKey:
        return WaitKey(WaitKind.BACKOFF, step_id)

    @staticmethod
    def approval(step_id: str) -> WaitKey:
        return WaitKey(WaitKind.APPROVAL, step_id)

    @staticmethod
    def any_of(keys: Iterable[WaitKey | str]) -> WaitKey:
        """The key of a run parked on all of ``keys`` at once (woken by the first); the
        one key itself when they are all the same."""
        texts = sorted({str(k) for k in keys})
        if not texts:
            raise ValueError("a run waits for at least one key")
        if len(texts) == 1:
            return WaitKey.parse(texts[0])
        for text in texts:
            WaitKey.parse(text)  # refuse a malformed member before it is stored
        return WaitKey(WaitKind.ANY, dumps(texts))

    @property
    def members(self) -> tuple[WaitKey, ...]:
        """The keys an ``any`` key waits for; the key itself for any other kind."""
        if self.kind != WaitKind.ANY:
            return (self,)
        return tuple(WaitKey.parse(text) for text in json.loads(self.value))

    @staticmethod
    def parse(text: str) -> WaitKey:
        """The key ``text`` (a stored ``runs.waiting_for``) names; ValueError if it is
        not a wait key."""
        kind, sep, value = text.partition(":")
        if not sep or not value:
            raise ValueError(f"not a wait key: {text!r} (expected KIND:VALUE)")
        try:
            wait_kind = WaitKind(kind)
        except ValueError:
            known = ", ".join(k.value for k in WaitKind)
            raise ValueError(
                f"not a wait key: {text!r} (kind {kind!r} is none of {known})"
            ) from None
        if wait_kind == WaitKind.ANY:
            try:
                members = json.loads(value)
            except ValueError:
                members = None
            if (
                not isinstance(members, list)
                or len(members) < 2
                or not all(isinstance(m, str) for m in members)
            ):
                raise ValueError(f"not a wait key: {text!r} (any: takes a JSON list of keys)")
            for member in members:
                if WaitKey.parse(member).kind == WaitKind.ANY:
                    raise ValueError(f"not a wait key: {text!r} (any: inside any:)")
        return WaitKey(wait_kind, value)


# The payloads the fold reads, one per event kind (the keys :func:`apply` looks at; events
# carry more). Written by the engine, read back from the journal: every key may be absent
# in an event an older version wrote, so reads go through ``.get``.


class RunQueuedPayload(TypedDict, total=False):
    guards: dict[str, Any] | None  # the run's guard overrides (the first run_queued only)
    reason: str  # a QueueReason: why the run was queued again
    by: str  # who retried it
    grant: dict[str, Any]  # the limits the retry moved


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


class StepCompletedPayload(TypedDict, total=False):
    output: Any
    llm: dict[str, Any]  # a model call's provider, model, usage and cost


class StepFailedPayload(TypedDict, total=False):
    """``step_failed``, and ``step_retrying`` (which adds when and how often)."""

    error: str
    error_type: str
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


class RunEndedPayload(TypedDict, total=False):
    """``run_succeeded``, ``run_failed`` and ``run_cancelled``."""

    output: Any
    error: str | None
    reason: str  # run_failed: a DeadLetterReason or an AnomalyKind


# The error_type of a step its own workflow stopped waiting for (asyncio.wait_for, timeout).
ABANDONED = "StepAbandoned"


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    """``sha256("runID|stepID|attempt")`` in hex (invariant 6 in docs/concepts/invariants.md)."""
    return hashlib.sha256(f"{run_id}|{step_id}|{attempt}".encode()).hexdigest()


def _jsonable(value: Any) -> Any:
    # pydantic models (and anything else with the same method) serialise as their JSON form.
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(value: Any, default: Callable[[Any], Any] = _jsonable) -> str:
    """Canonical JSON: the form payloads, inputs and outputs are stored in.

    Numbers are written as PostgreSQL's jsonb gives them back, on both backends, so that a
    value reads back the same from either and the journal's hashes hold: a float of
    magnitude 1e16 or more (always integral) is written as the integer it equals, and -0.0
    as 0.0. ``default`` gives the JSON form of what the json module cannot write (by
    default a pydantic model's; values from user code pass pydantic's encoder, see
    :mod:`ratchet.engine.values`), else raises TypeError."""
    text = json.dumps(
        value,
        separators=(",", ":"),
        sort_keys=True,
        ensure_ascii=False,
        allow_nan=False,
        default=default,
    )
    # Python writes those floats as 1e+16 and -0.0, so any other text needs no second look.
    if "e+" in text or "-0.0" in text:
        text = json.dumps(
            _jsonb_numbers(json.loads(text)),
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
            allow_nan=False,
        )
    return text


def output_payload(
    output: Any, output_json: str, extra: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """``{"output": output, **extra}`` and its canonical JSON (as :func:`dumps` writes it),
    with the output's JSON, ``output_json`` (``dumps(output)``, ``output`` as read back from
    it), put in as it is rather than encoded again: a model's answer can be large, the rest
    is small. The extra values come back as the journal gives them (see :func:`dumps`)."""
    if "output" in extra:  # the extra value would win: the plain form says how
        payload = json.loads(dumps({"output": output, **extra}))
        return payload, dumps(payload)
    parts = {"output": output_json}
    payload = {"output": output}
    for key, value in extra.items():
        parts[key] = text = dumps(value)
        payload[key] = json.loads(text)
    body = ",".join(f"{json.dumps(key, ensure_ascii=False)}:{parts[key]}" for key in sorted(parts))
    return payload, "{" + body + "}"


def _jsonb_numbers(value: Any) -> Any:
    """``value`` (plain JSON data) with the floats jsonb would not give back as they are
    replaced by the numbers it does give back (see :func:`dumps`)."""
    if isinstance(value, float):
        if abs(value) >= 1e16:
            return int(value)
        return 0.0 if value == 0 else value
    if isinstance(value, dict):
        return {k: _jsonb_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonb_numbers(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class Event:
    """One journal event. ``seq`` starts at 1 and has no gaps within a run.

    ``hash`` chains the run's events: sha256 over the previous hash, the event's header
    and its canonical payload JSON (``payload_json``, the text that is stored)."""

    run_id: str
    seq: int
    kind: str
    step_id: str | None
    attempt: int | None
    payload: dict[str, Any]
    at: float
    prev_hash: str
    hash: str
    payload_json: str = field(default="", compare=False, repr=False)

    @staticmethod
    def digest(
        run_id: str,
        seq: int,
        kind: str,
        step_id: str | None,
        attempt: int | None,
        payload_json: str,
        at: float,
        prev_hash: str,
    ) -> str:
        # run_id cannot hold "|" and kind, seq, attempt and at are fixed forms; the step id
        # may hold anything, so it goes length-prefixed, just before the payload.
        sid = step_id if step_id is not None else ""
        header = f"{run_id}|{seq}|{kind}|{attempt}|{at:.6f}|{len(sid)}:{sid}"
        return hashlib.sha256(f"{prev_hash}|{header}|{payload_json}".encode()).hexdigest()

    @staticmethod
    def chain(
        run_id: str,
        seq: int,
        kind: str,
        step_id: str | None,
        attempt: int | None,
        payload: dict[str, Any],
        at: float,
        prev_hash: str,
        payload_json: str | None = None,
    ) -> Event:
        """Build the event that follows ``prev_hash`` in a run's hash chain.
        ``payload_json`` may be given when the caller already holds ``dumps(payload)``."""
        if payload_json is None:
            text = dumps(payload)
            if "e+" in text or "-0.0" in text:  # dumps may have rewritten a number
                payload = json.loads(text)
        else:
            text = payload_json
        # Whole microseconds, as PostgreSQL keeps a timestamptz; the hash reads ``at`` to
        # six decimals, so rounding changes no hash and the time reads back exactly.
        at = round(at, 6)
        digest = Event.digest(run_id, seq, kind, step_id, attempt, text, at, prev_hash)
        return Event(run_id, seq, kind, step_id, attempt, payload, at, prev_hash, digest, text)

    def verify(self) -> bool:
        """Whether ``hash`` matches the event's content and ``prev_hash``."""
        return self.hash == Event.digest(
            self.run_id,
            self.seq,
            self.kind,
            self.step_id,
            self.attempt,
            self.payload_json or dumps(self.payload),
            self.at,
            self.prev_hash,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "kind": self.kind,
            "step_id": self.step_id,
            "attempt": self.attempt,
            "payload": self.payload,
            "at": self.at,
            "hash": self.hash,
        }

    def export_dict(self) -> dict[str, Any]:
        """The event as ``ratchet export`` writes it: everything its hash covers, with the
        hash it links to, so the chain can be checked from the export alone."""
        return {**self.as_dict(), "prev_hash": self.prev_hash}


@dataclass(slots=True)
class StepState:
    """A step as its events leave it."""

    step_id: str
    ordinal: int
    name: str
    status: StepStatus = StepStatus.PENDING
    attempt: int = 0  # the latest attempt journaled
    attempt_base: int = 0  # attempts before the latest manual retry; not charged again
    output: Any = None
    error: str | None = None
    error_type: str | None = None
    waiting: dict[str, Any] | None = None
    started_at: float | None = None
    finished_at: float | None = None
    first_started_at: float | None = None
    # How often the latest attempt, in flight, was taken over from a worker that never came
    # back to finish it (a sweep or a reclaim found it started): the crash-loop count.
    interrupted: int = 0
    child_run_id: str | None = None
    kind: str | None = None  # "llm", "tool"; None for a plain step
    llm: dict[str, Any] | None = None  # a completed LLM call: provider, model, usage, cost
    # The seqs of the step's first event and of the event that finished it: the order a
    # replay of parallel branches hands journaled outcomes back in (see
    # ratchet.engine.replay.Replay.replayed).
    first_seq: int = 0
    finished_seq: int = 0
    # The attempt whose idempotency key the latest attempt sent (itself, unless it retried
    # a failure whose outcome is unknown), and whether the latest failure was such a one:
    # the next attempt then sends the same key.
    key_attempt: int = 0
    same_key: bool = False

    @property
    def attempts_used(self) -> int:
        return self.attempt - self.attempt_base


@dataclass(slots=True)
class LLMTotals:
    """A run's model calls summed from its journal: tokens, and cost in USD of the calls
    whose model has a price (``unpriced_calls`` counts the others, which cost ``null``)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0

    def add(self, meta: dict[str, Any]) -> None:
        """Count one call's llm meta, or (``calls``) the summed meta of the model calls a
        step made inside it, of which ``unpriced_calls`` have no price."""
        usage = meta.get("usage") or {}
        calls = int(meta.get("calls") or 1)
        self.calls += calls
        self.input_tokens += int(usage.get("input_tokens") or 0)
        self.output_tokens += int(usage.get("output_tokens") or 0)
        self.cached_tokens += int(usage.get("cached_tokens") or 0)
        self.reasoning_tokens += int(usage.get("reasoning_tokens") or 0)
        cost = meta.get("cost_usd")
        unpriced = meta.get("unpriced_calls")
        if isinstance(cost, int | float):
            self.cost_usd += cost
            self.unpriced_calls += int(unpriced or 0)
        else:
            self.unpriced_calls += calls if unpriced is None else int(unpriced)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(slots=True)
class RunState:
    """A run as its journal leaves it."""

    run_id: str
    status: RunStatus = RunStatus.QUEUED
    steps: dict[str, StepState] = field(default_factory=dict)
    by_ordinal: dict[int, StepState] = field(default_factory=dict)
    output: Any = None
    error: str | None = None
    started: bool = False
    last_seq: int = 0
    last_hash: str = GENESIS_HASH
    drives: int = 0
    llm: LLMTotals = field(default_factory=LLMTotals)
    started_at: float | None = None  # the first run_started: the wall-time budget's origin
    guards: dict[str, Any] | None = None  # the guard overrides the run was started with
    # Guards: the anomalies journaled (by occurrence key, so none is raised twice), those
    # that paused the run by the step they were raised at (a replay asks again, in order),
    # and when each retry was journaled (the run's retry-storm window).
    anomalies: set[str] = field(default_factory=set)
    paused_at: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    retried_at: list[float] = field(default_factory=list)
    # The confidence gates evaluated or bypassed, by key: a replay takes the journaled verdict.
    gates: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Spend reserved by model calls in flight (``reserve`` of their step_started: the call's
    # worst case), by step; a call whose outcome is unknown keeps its reservation until it
    # is answered. The limits people granted (approving a guard's pause, retrying the run),
    # applied over the run's guards; ``limit_epoch`` counts the grants and retries, and
    # ``limit_trips`` holds, per limit, how often it tripped and in which epoch it last did.
    reserved: dict[str, dict[str, Any]] = field(default_factory=dict)
    grants: dict[str, Any] = field(default_factory=dict)
    limit_epoch: int = 0
    limit_trips: dict[str, tuple[int, int]] = field(default_factory=dict)

    first_at: float | None = None  # the first event's time
    last_at: float | None = None  # the last event's time
    trace: Any = None  # the latest drive's trace context, if it was traced


def split_step_id(step_id: str) -> tuple[int, str]:
    """``"3:fetch_page"`` → ``(3, "fetch_page")``."""
    ordinal, _, name = step_id.partition(":")
    return int(ordinal), name


def fold(run_id: str, events: list[Event]) -> RunState:
    """The state of a run after ``events``, in ``seq`` order."""
    state = RunState(run_id)
    for ev in events:
        apply(state, ev)
    return state


def apply(state: RunState, ev: Event) -> None:
    """Fold one event into ``state``."""
    state.last_seq = ev.seq
    state.last_hash = ev.hash
    if state.first_at is None:
        state.first_at = ev.at
    state.last_at = ev.at
    kind = ev.kind
    if ev.step_id is not None and kind.startswith("step_"):
        step = state.steps.get(ev.step_id)
        if step is None:
            ordinal, name = split_step_id(ev.step_id)
            step = StepState(ev.step_id, ordinal, name, first_seq=ev.seq)
            state.steps[ev.step_id] = step
            state.by_ordinal[ordinal] = step
        if kind == EventKind.STEP_STARTED:
            started = cast(StepStartedPayload, ev.payload)
            step.status = StepStatus.STARTED
            attempt = ev.attempt or step.attempt + 1
            if attempt != step.attempt:
                step.interrupted = 0
            step.attempt = attempt
            step.key_attempt = started.get("key_attempt") or attempt
            step.same_key = False
            step.child_run_id = started.get("child_run_id", step.child_run_id)
            step.kind = started.get("kind", step.kind)
            reserve = started.get("reserve")
            if reserve is not None:
                state.reserved[ev.step_id] = reserve
            step.started_at = ev.at
            if step.first_started_at is None:
                step.first_started_at = ev.at
            step.error = None
        elif kind == EventKind.STEP_COMPLETED:
            completed = cast(StepCompletedPayload, ev.payload)
            step.status = StepStatus.COMPLETED
            step.output = completed.get("output")
            meta = completed.get("llm")
            if meta:
                step.llm = meta
                state.llm.add(meta)
            step.finished_at = ev.at
            step.finished_seq = ev.seq
            step.waiting = None
            if state.reserved:
                state.reserved.pop(ev.step_id, None)
        elif kind == EventKind.STEP_FAILED:
            failed = cast(StepFailedPayload, ev.payload)
            step.status = StepStatus.FAILED
            step.error = failed.get("error")
            step.error_type = failed.get("error_type")
            step.finished_at = ev.at
            step.finished_seq = ev.seq
            _settle(state, step, failed)
            if "llm" in ev.payload:  # spent by model calls made inside the step
                state.llm.add(ev.payload["llm"])
        elif kind == EventKind.STEP_RETRYING:
            retrying = cast(StepFailedPayload, ev.payload)
            state.retried_at.append(ev.at)
            if "llm" in ev.payload:
                state.llm.add(ev.payload["llm"])
            step.status = StepStatus.RETRYING
            step.error = retrying.get("error")
            step.waiting = ev.payload
            _settle(state, step, retrying)
        elif kind == EventKind.STEP_WAITING:
            step.status = StepStatus.WAITING
            step.waiting = ev.payload
            if ev.attempt is not None:  # an approval asked again after a retry of the run
                step.attempt = ev.attempt
            if step.first_started_at is None:
                step.first_started_at = ev.at
        return
    if kind == EventKind.RUN_QUEUED:
        queued = cast(RunQueuedPayload, ev.payload)
        state.status = RunStatus.QUEUED
        if ev.seq == 1:
            state.guards = queued.get("guards")
        if queued.get("reason") == QueueReason.RETRY:
            # A retried run keeps its limits: what tripped trips again, unless the retry
            # granted more (journaled with who retried it).
            state.limit_epoch += 1
            state.grants.update(queued.get("grant") or {})
            # A dead-lettered run was re-queued: its failed steps get a fresh budget of
            # attempts, numbered on from the last one so their keys stay distinct.
            # A step its workflow abandoned (a timeout around it) stays as it was: the
            # workflow took another path then, and takes it again on replay.
            for step in state.steps.values():
                if step.status == StepStatus.FAILED and step.error_type != ABANDONED:
                    step.status = StepStatus.PENDING
                    step.attempt_base = step.attempt
                    step.waiting = None
            state.error = None
    elif kind == EventKind.RUN_STARTED:
        state.status = RunStatus.RUNNING
        state.started = True
        state.started_at = ev.at
        state.drives += 1
        state.trace = cast(RunDrivenPayload, ev.payload).get("trace")
    elif kind == EventKind.RUN_RESUMED:
        resumed = cast(RunDrivenPayload, ev.payload)
        state.status = RunStatus.RUNNING
        state.drives += 1
        state.trace = resumed.get("trace")
        if resumed.get("reason") in TAKEOVERS:
            for step in state.steps.values():
                if step.status == StepStatus.STARTED:
                    step.interrupted += 1
    elif kind == EventKind.ANOMALY_DETECTED:
        anomaly = cast(AnomalyPayload, ev.payload)
        state.anomalies.add(anomaly["key"])
        if anomaly.get("action") == GuardAction.PAUSE and ev.step_id is not None:
            state.paused_at.setdefault(ev.step_id, []).append(ev.payload)
        limit = anomaly.get("limit_key")
        if limit is not None:
            count, _ = state.limit_trips.get(limit, (0, 0))
            state.limit_trips[limit] = (count + 1, state.limit_epoch)
    elif kind == EventKind.APPROVAL_DECIDED:
        decided = cast(ApprovalDecidedPayload, ev.payload)
        grant = decided.get("grant")
        if grant is not None and decided.get("approved"):
            state.limit_epoch += 1
            state.grants.update(grant)
    elif kind in (EventKind.CONFIDENCE_EVALUATED, EventKind.CONFIDENCE_GATE_BYPASSED):
        state.gates[cast(GatePayload, ev.payload)["key"]] = ev.payload
    elif kind in TERMINAL_EVENTS:
        ended = cast(RunEndedPayload, ev.payload)
        state.status = TERMINAL_EVENTS[EventKind(kind)]
        state.output = ended.get("output")
        state.error = ended.get("error")


def _settle(state: RunState, step: StepState, payload: StepFailedPayload) -> None:
    """An attempt failed: its reservation ends, unless its outcome is unknown (the provider
    may have billed it; the next attempt sends the same key)."""
    step.same_key = bool(payload.get("outcome_unknown"))
    if state.reserved and not step.same_key:
        state.reserved.pop(step.step_id, None)


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
