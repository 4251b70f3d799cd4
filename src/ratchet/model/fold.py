"""The fold: a run's state from its journal, event by event."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

from ratchet.model.events import GENESIS_HASH, Event
from ratchet.model.payloads import (
    ABANDONED,
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
)
from ratchet.model.states import (
    TAKEOVERS,
    TERMINAL_EVENTS,
    EventKind,
    GuardAction,
    QueueReason,
    RunStatus,
    StepStatus,
)


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
    traceback: str | None = None  # the failed attempt's (absent from older journals)
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
    # The patches whose new path the run took (ratchet.patched), by name: their markers.
    patches: dict[str, PatchMarkedPayload] = field(default_factory=dict)
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


def chain_next(
    state: RunState,
    kind: str,
    step_id: str | None,
    attempt: int | None,
    payload: dict[str, Any],
    payload_json: str | None = None,
) -> Event:
    """The event after ``state``'s head, chained to it, stamped now and folded in: how a
    drive, and the host of an isolated one, add to a run's journal before writing."""
    ev = Event.chain(
        state.run_id,
        state.last_seq + 1,
        kind,
        step_id,
        attempt,
        payload,
        time.time(),
        state.last_hash,
        payload_json,
    )
    apply(state, ev)
    return ev


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
            step.traceback = None
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
            step.traceback = failed.get("traceback")
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
            step.traceback = retrying.get("traceback")
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
    elif kind == EventKind.PATCH_MARKED:
        marked = cast(PatchMarkedPayload, ev.payload)
        state.patches.setdefault(marked["patch"], marked)
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
