"""Runs, events, statuses and the fold.

The journal is the truth: a run's state is the fold of its events. The engine, the CLI
and any viewer fold the same way through :func:`fold`. This module imports nothing else
of Ratchet's, so every layer may import it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


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
    """The kinds of journal event (DESIGN.md §5)."""

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

# Why a drive took a run whose last holder never handed it back (it died, hung, or was cut
# off): the recovery sweep stole its lease, or its restarted worker reclaimed it.
TAKEOVERS = frozenset({"sweep", "reclaim"})

# The error_type of a step its own workflow stopped waiting for (asyncio.wait_for, timeout).
ABANDONED = "StepAbandoned"


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    """``sha256("runID|stepID|attempt")`` in hex (DESIGN.md invariant 6)."""
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
    status: str = "pending"  # pending | started | retrying | waiting | completed | failed
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
    # replay of parallel branches hands journaled outcomes back in (see RunContext.replayed).
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
            step.status = "started"
            attempt = ev.attempt or step.attempt + 1
            if attempt != step.attempt:
                step.interrupted = 0
            step.attempt = attempt
            payload = ev.payload
            step.key_attempt = payload.get("key_attempt") or attempt
            step.same_key = False
            step.child_run_id = payload.get("child_run_id", step.child_run_id)
            step.kind = payload.get("kind", step.kind)
            reserve = payload.get("reserve")
            if reserve is not None:
                state.reserved[ev.step_id] = reserve
            step.started_at = ev.at
            if step.first_started_at is None:
                step.first_started_at = ev.at
            step.error = None
        elif kind == EventKind.STEP_COMPLETED:
            step.status = "completed"
            step.output = ev.payload.get("output")
            meta = ev.payload.get("llm")
            if meta:
                step.llm = meta
                state.llm.add(meta)
            step.finished_at = ev.at
            step.finished_seq = ev.seq
            step.waiting = None
            if state.reserved:
                state.reserved.pop(ev.step_id, None)
        elif kind == EventKind.STEP_FAILED:
            step.status = "failed"
            step.error = ev.payload.get("error")
            step.error_type = ev.payload.get("error_type")
            step.finished_at = ev.at
            step.finished_seq = ev.seq
            _settle(state, step, ev.payload)
            if "llm" in ev.payload:  # spent by model calls made inside the step
                state.llm.add(ev.payload["llm"])
        elif kind == EventKind.STEP_RETRYING:
            state.retried_at.append(ev.at)
            if "llm" in ev.payload:
                state.llm.add(ev.payload["llm"])
            step.status = "retrying"
            step.error = ev.payload.get("error")
            step.waiting = ev.payload
            _settle(state, step, ev.payload)
        elif kind == EventKind.STEP_WAITING:
            step.status = "waiting"
            step.waiting = ev.payload
            if ev.attempt is not None:  # an approval asked again after a retry of the run
                step.attempt = ev.attempt
            if step.first_started_at is None:
                step.first_started_at = ev.at
        return
    if kind == EventKind.RUN_QUEUED:
        state.status = RunStatus.QUEUED
        if ev.seq == 1:
            state.guards = ev.payload.get("guards")
        if ev.payload.get("reason") == "retry":
            # A retried run keeps its limits: what tripped trips again, unless the retry
            # granted more (journaled with who retried it).
            state.limit_epoch += 1
            state.grants.update(ev.payload.get("grant") or {})
            # A dead-lettered run was re-queued: its failed steps get a fresh budget of
            # attempts, numbered on from the last one so their keys stay distinct.
            # A step its workflow abandoned (a timeout around it) stays as it was: the
            # workflow took another path then, and takes it again on replay.
            for step in state.steps.values():
                if step.status == "failed" and step.error_type != ABANDONED:
                    step.status = "pending"
                    step.attempt_base = step.attempt
                    step.waiting = None
            state.error = None
    elif kind == EventKind.RUN_STARTED:
        state.status = RunStatus.RUNNING
        state.started = True
        state.started_at = ev.at
        state.drives += 1
        state.trace = ev.payload.get("trace")
    elif kind == EventKind.RUN_RESUMED:
        state.status = RunStatus.RUNNING
        state.drives += 1
        state.trace = ev.payload.get("trace")
        if ev.payload.get("reason") in TAKEOVERS:
            for step in state.steps.values():
                if step.status == "started":
                    step.interrupted += 1
    elif kind == EventKind.ANOMALY_DETECTED:
        state.anomalies.add(ev.payload["key"])
        if ev.payload.get("action") == "pause" and ev.step_id is not None:
            state.paused_at.setdefault(ev.step_id, []).append(ev.payload)
        limit = ev.payload.get("limit_key")
        if limit is not None:
            count, _ = state.limit_trips.get(limit, (0, 0))
            state.limit_trips[limit] = (count + 1, state.limit_epoch)
    elif kind == EventKind.APPROVAL_DECIDED:
        grant = ev.payload.get("grant")
        if grant is not None and ev.payload.get("approved"):
            state.limit_epoch += 1
            state.grants.update(grant)
    elif kind in (EventKind.CONFIDENCE_EVALUATED, EventKind.CONFIDENCE_GATE_BYPASSED):
        state.gates[ev.payload["key"]] = ev.payload
    elif kind in TERMINAL_EVENTS:
        state.status = TERMINAL_EVENTS[EventKind(kind)]
        state.output = ev.payload.get("output")
        state.error = ev.payload.get("error")


def _settle(state: RunState, step: StepState, payload: dict[str, Any]) -> None:
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
    reason: str  # claim | sweep | reclaim | retry


@dataclass(frozen=True, slots=True)
class Receipt:
    """A row of ``side_effect_receipts``."""

    idempotency_key: str
    run_id: str
    step_id: str
    status: str  # claimed | settled | failed (settled by hand as not delivered)
    response: Any
    claimed_at: float
    settled_at: float | None
    # The delivery within its step: its name, or "#n" for the step's n-th unnamed one.
    # (run_id, step_id, delivery) is the receipt's identity; the key is the one sent out.
    delivery: str = "#1"
    attempt: int | None = None  # the attempt that first claimed it, whose key it carries
    settled_by: str | None = None  # "worker", or "hand" (ratchet receipts settle)

    def as_dict(self) -> dict[str, Any]:
        return {
            "idempotency_key": self.idempotency_key,
            "run_id": self.run_id,
            "step_id": self.step_id,
            "delivery": self.delivery,
            "attempt": self.attempt,
            "status": self.status,
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
    status: str
    decided_by: str | None = None
    comment: str | None = None
    decided_at: float | None = None
    parent_run_id: str | None = None
    note: str | None = None  # a name the client gave beside the decider (the HTTP API's token)
    grant: dict[str, Any] | None = None  # a guard pause's approval: the limits it moved

    @property
    def decision(self) -> Decision | None:
        if self.status not in ("approved", "rejected"):
            return None
        assert self.decided_by is not None and self.decided_at is not None
        return Decision(
            self.status == "approved",
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
            "status": self.status,
            "decided_by": self.decided_by,
            "comment": self.comment,
            "decided_at": self.decided_at,
            "note": self.note,
            "grant": self.grant,
        }
