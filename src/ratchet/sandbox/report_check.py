"""The step state machine an isolated run's reports are checked against, before anything
of them is journaled (see :mod:`ratchet.sandbox.host`): what a sandbox may propose, given
the journal's fold and the proposals before it in the same report."""

from __future__ import annotations

import re
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from ratchet.engine.evidence import MAX_ARGS_BYTES, MAX_TRACEBACK_CHARS
from ratchet.errors import ValueRefused
from ratchet.llm.endpoints import BY_PROVIDER
from ratchet.model import (
    DeadLetterReason,
    EventKind,
    RunState,
    RunStatus,
    StepStatus,
    WaitKind,
    dumps,
    idempotency_key,
)
from ratchet.names import MAX_STEP_NAME

# The step names of model calls: their end is journaled by the host, never by a sandbox.
MODEL_STEPS = frozenset(e.name for endpoints in BY_PROVIDER.values() for e in endpoints)
# What a sandbox's drive may propose; the rest of the journal is the host's.
STEP_KINDS = frozenset(
    {
        EventKind.STEP_STARTED,
        EventKind.STEP_COMPLETED,
        EventKind.STEP_FAILED,
        EventKind.STEP_RETRYING,
        EventKind.STEP_WAITING,
        EventKind.TOOL_CALLED,
        EventKind.REQUEST_DRIFTED,
    }
)
ENDS = {EventKind.RUN_SUCCEEDED: RunStatus.SUCCEEDED, EventKind.RUN_FAILED: RunStatus.FAILED}
# The dead-letter reasons a sandbox's drive ends a run with; the guards' are the host's.
SANDBOX_REASONS = frozenset(
    {
        DeadLetterReason.WORKFLOW_ERROR,
        DeadLetterReason.STEP_FAILED,
        DeadLetterReason.NON_DETERMINISM,
        DeadLetterReason.CRASH_LOOP,
        DeadLetterReason.NOT_SERIALIZABLE,
        DeadLetterReason.STORE_REFUSED,
    }
)
# The fields of each proposal's payload (None: any; the tool's call is its own record).
_FIELDS: dict[str, frozenset[str] | None] = {
    EventKind.STEP_STARTED: frozenset(
        {
            "idempotency_key",
            "resumed",
            "kind",
            "provider",
            "model",
            "call_sha256",
            "args",
            "request",
        }
    ),
    EventKind.STEP_COMPLETED: frozenset({"output"}),
    EventKind.STEP_FAILED: frozenset({"error", "error_type", "traceback"}),
    EventKind.STEP_RETRYING: frozenset(
        {"attempt", "of", "error", "delay_s", "retry_at", "traceback"}
    ),
    EventKind.TOOL_CALLED: frozenset({"name", "arguments", "risk"}),
    EventKind.REQUEST_DRIFTED: frozenset({"difference", "message"}),
    EventKind.RUN_SUCCEEDED: frozenset({"output"}),
    EventKind.RUN_FAILED: frozenset({"error", "reason", "traceback"}),
    EventKind.PATCH_MARKED: frozenset({"patch", "taken", "deprecated", "after"}),
}
# What a sandbox may journal of a step's arguments and of a traceback: what its own engine
# writes (ratchet.engine.evidence), with room for the marker.
_EVIDENCE_LIMITS = {"args": MAX_ARGS_BYTES + 256, "traceback": MAX_TRACEBACK_CHARS + 256}
_WAITING_FIELDS = {
    "sleep": frozenset({"reason", "seconds", "until"}),
    "backoff": frozenset({"reason", "retry_at"}),
}
_STEP_ID = re.compile(r"([1-9][0-9]{0,17}):(.+)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Proposal:
    """One event a sandbox reports: what it says happened, not yet in the journal."""

    kind: str
    step_id: str | None
    attempt: int | None
    payload: dict[str, Any]
    payload_json: str


@dataclass(slots=True)
class _View:
    """A step as the proposals of one report leave it, before anything is written."""

    status: str  # a StepStatus
    attempt: int
    kind: str | None
    waiting: str | None = None


class ReportCheck:
    """One report's check against the journal's fold (``state``) and what the host itself
    journaled for the sandbox: the model calls' ends (``completed_here``) and the attempts
    started (``started_here``)."""

    def __init__(
        self,
        run_id: str,
        state: RunState,
        completed_here: Mapping[str, dict[str, Any]],
        started_here: Set[tuple[str, int]],
    ) -> None:
        self.run_id = run_id
        self.state = state
        self._completed_here = completed_here
        self._started_here = started_here

    def check(self, proposals: list[Proposal], finish: bool) -> None:
        """Refuse the report unless every proposal follows from the journal and the ones
        before it (raises :class:`ValueRefused` naming the first that does not)."""
        if not proposals:
            raise ValueRefused("a report carries at least one event")
        views: dict[str, _View | None] = {}
        ordinals: dict[int, str] = {}
        patches: set[str] = set()
        for i, p in enumerate(proposals):
            last = finish and i == len(proposals) - 1
            where = f"event {i + 1} ({p.kind}" + (f" of step {p.step_id})" if p.step_id else ")")
            try:
                if last:
                    self._check_end(p)
                elif p.kind in ENDS:
                    raise ValueRefused("the run's end is the last event of a finish report")
                elif p.kind == EventKind.PATCH_MARKED:
                    self._check_patch(p, patches)
                else:
                    self._check_step(p, views, ordinals)
            except ValueRefused as e:
                raise ValueRefused(f"{where}: {e}") from None

    def _check_end(self, p: Proposal) -> None:
        if p.kind not in ENDS:
            raise ValueRefused("a finish report ends with run_succeeded or run_failed")
        check_fields(p)
        if p.kind == EventKind.RUN_SUCCEEDED:
            if "output" not in p.payload:
                raise ValueRefused("run_succeeded carries the run's output")
            return
        if not isinstance(p.payload.get("error"), str):
            raise ValueRefused("run_failed carries the run's error as text")
        reason = p.payload.get("reason")
        if reason is not None and reason not in SANDBOX_REASONS:
            raise ValueRefused(
                f"a sandbox does not end a run with reason {reason!r} "
                f"(its own are {', '.join(sorted(SANDBOX_REASONS))})"
            )

    def _check_patch(self, p: Proposal, patches: set[str]) -> None:
        """A ``ratchet.patched`` marker: of no step, once per patch and run, taken."""
        if p.step_id is not None or p.attempt is not None:
            raise ValueRefused("a patch marker belongs to no step")
        check_fields(p)
        name = p.payload.get("patch")
        if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME:
            raise ValueRefused("patch_marked names its patch")
        if p.payload.get("taken") is not True:
            raise ValueRefused("patch_marked is journaled for a patch's new path only")
        if not isinstance(p.payload.get("deprecated", False), bool) or not isinstance(
            p.payload.get("after", 0), int
        ):
            raise ValueRefused("patch_marked: deprecated is a boolean, after a step count")
        if name in self.state.patches or name in patches:
            raise ValueRefused(f"patch {name!r} is marked already")
        patches.add(name)

    def _view(self, step_id: str, views: dict[str, _View | None]) -> _View | None:
        if step_id in views:
            return views[step_id]
        step = self.state.steps.get(step_id)
        view = (
            None
            if step is None
            else _View(
                step.status,
                step.attempt,
                step.kind,
                (step.waiting or {}).get("reason") if step.status == StepStatus.WAITING else None,
            )
        )
        views[step_id] = view
        return view

    def _check_step(
        self, p: Proposal, views: dict[str, _View | None], ordinals: dict[int, str]
    ) -> None:
        if p.kind not in STEP_KINDS:
            if p.kind in EventKind.__members__.values():
                raise ValueRefused(
                    "this kind is written by the worker, never reported by a sandbox"
                )
            raise ValueRefused("not a kind of journal event")
        match = _STEP_ID.fullmatch(p.step_id or "")
        if match is None:
            raise ValueRefused(f"step id {p.step_id!r} is not <position>:<name>")
        step_id, ordinal, name = p.step_id or "", int(match.group(1)), match.group(2)
        holder = ordinals.get(ordinal) or (
            s.step_id if (s := self.state.by_ordinal.get(ordinal)) else None
        )
        if holder is not None and holder != step_id:
            raise ValueRefused(f"position {ordinal} holds step {holder!r}")
        view = self._view(step_id, views)
        if p.kind == EventKind.REQUEST_DRIFTED:
            # A replay found a completed model call's request changed, and goes on.
            if view is None or view.status != StepStatus.COMPLETED or view.kind != "llm":
                raise ValueRefused(f"step {step_id} is not a completed model call")
            if p.attempt is not None:
                raise ValueRefused("request_drifted names no attempt")
            check_fields(p)
            return
        if view is None and p.kind in (
            EventKind.STEP_COMPLETED,
            EventKind.STEP_FAILED,
            EventKind.STEP_RETRYING,
        ):
            raise ValueRefused(f"step {step_id} never started")
        if view is not None and view.status in (StepStatus.COMPLETED, StepStatus.FAILED):
            if (
                p.kind == EventKind.STEP_COMPLETED
                and step_id in self._completed_here
                and p.attempt == view.attempt
                and p.payload == self._completed_here[step_id]
            ):
                return  # the host's own journaling of a model call's end, reported back
            raise ValueRefused(f"step {step_id} has {view.status}: nothing follows a step's end")
        if p.kind != EventKind.STEP_WAITING:
            check_fields(p)
        kind = p.kind
        if kind == EventKind.STEP_STARTED:
            self._check_start(p, step_id, name, view)
            views[step_id] = _View(StepStatus.STARTED, p.attempt or 0, p.payload.get("kind"))
            ordinals[ordinal] = step_id
            return
        if kind == EventKind.TOOL_CALLED:
            if p.attempt is None or p.attempt != next_attempt(view):
                raise ValueRefused("a tool's call is announced by the attempt about to start")
            ordinals[ordinal] = step_id
            return
        if kind == EventKind.STEP_WAITING:
            self._check_waiting(p, step_id, view, views)
            ordinals[ordinal] = step_id
            return
        if view is None:
            raise ValueRefused(f"step {step_id} never started")
        if kind == EventKind.STEP_COMPLETED and p.attempt is None:
            if (
                view.status != StepStatus.WAITING
                or view.waiting != WaitKind.SLEEP
                or p.payload != {"output": None}
            ):
                raise ValueRefused(f"step {step_id}: only a sleep ends without an attempt")
            views[step_id] = _View(StepStatus.COMPLETED, view.attempt, view.kind)
            return
        if view.status != StepStatus.STARTED or p.attempt != view.attempt:
            raise ValueRefused(
                f"step {step_id} has no step_started in attempt {p.attempt} "
                f"(it is {view.status}, attempt {view.attempt})"
            )
        if kind == EventKind.STEP_COMPLETED:
            if name in MODEL_STEPS or view.kind == "llm":
                raise ValueRefused(
                    f"step {step_id} is a model call: its end is journaled "
                    "by the worker that made the call, with the provider's "
                    "usage and cost"
                )
            views[step_id] = _View(StepStatus.COMPLETED, view.attempt, view.kind)
        elif kind == EventKind.STEP_FAILED:
            if not isinstance(p.payload.get("error"), str):
                raise ValueRefused("step_failed carries the step's error as text")
            views[step_id] = _View(StepStatus.FAILED, view.attempt, view.kind)
        else:
            views[step_id] = _View(StepStatus.RETRYING, view.attempt, view.kind)

    def _check_start(self, p: Proposal, step_id: str, name: str, view: _View | None) -> None:
        attempt = p.attempt
        if attempt is None:
            raise ValueRefused("a step_started names its attempt")
        key = p.payload.get("idempotency_key")
        if not isinstance(key, str) or not key or len(key) > 255:
            raise ValueRefused("a step_started carries the attempt's idempotency_key")
        if view is not None and view.status == StepStatus.STARTED:
            # The attempt a crashed sandbox left in flight runs again, once per sandbox.
            if attempt != view.attempt or (step_id, attempt) in self._started_here:
                raise ValueRefused(
                    f"attempt {view.attempt} of step {step_id} has started "
                    "and not ended (step_retrying comes before the next)"
                )
        elif attempt != (expected := next_attempt(view)):
            if view is not None and not expected:
                raise ValueRefused(f"step {step_id} is {view.status}: it does not start again")
            raise ValueRefused(f"step {step_id} goes on with attempt {expected}, not {attempt}")
        if name in MODEL_STEPS:
            if p.payload.get("kind") != "llm":
                raise ValueRefused(f"step {step_id} is a model call (kind llm)")
            # A model call's key is its run's, step's and an attempt's: the host sends it
            # to the provider, so a sandbox cannot pick another run's.
            if key not in {idempotency_key(self.run_id, step_id, a) for a in range(1, attempt + 1)}:
                raise ValueRefused(
                    f"step {step_id}: {key!r} is not the idempotency key of one of its attempts"
                )

    def _check_waiting(
        self, p: Proposal, step_id: str, view: _View | None, views: dict[str, _View | None]
    ) -> None:
        reason = p.payload.get("reason")
        allowed = _WAITING_FIELDS.get(reason) if isinstance(reason, str) else None
        if allowed is None:
            raise ValueRefused(
                f"a sandbox does not park (step_waiting {reason!r}): long "
                "sleeps, signals, approvals and child runs are the worker's"
            )
        extra = sorted(set(p.payload) - allowed)
        if extra:
            raise ValueRefused(f"step_waiting {reason} has no field {extra[0]!r}")
        if reason == "sleep":
            if view is not None or p.attempt is not None:
                raise ValueRefused(f"step {step_id}: a sleep is a step of its own")
            views[step_id] = _View(StepStatus.WAITING, 0, None, WaitKind.SLEEP)
            return
        if view is None or view.status != StepStatus.RETRYING or p.attempt != view.attempt:
            raise ValueRefused(f"step {step_id}: a backoff follows the attempt's step_retrying")
        views[step_id] = _View(StepStatus.WAITING, view.attempt, view.kind, WaitKind.BACKOFF)


def next_attempt(view: _View | None) -> int:
    """The attempt a step goes on with: 1, or the one after its last when that one
    failed and is retried (``step_retrying``, its backoff, or a retry of the run); 0 (none)
    for a step in any other state."""
    if view is None:
        return 1
    if view.status in (StepStatus.RETRYING, StepStatus.PENDING) or (view.status, view.waiting) == (
        StepStatus.WAITING,
        WaitKind.BACKOFF,
    ):
        return view.attempt + 1
    return 0


def check_fields(p: Proposal) -> None:
    allowed = _FIELDS.get(p.kind)
    if allowed is None:
        return
    for name, limit in _EVIDENCE_LIMITS.items():
        if name in p.payload and len(dumps(p.payload[name])) > limit:
            raise ValueRefused(f"{p.kind}: its {name} is longer than {limit} characters")
    extra = sorted(set(p.payload) - allowed)
    if extra:
        raise ValueRefused(
            f"{p.kind} has no field {extra[0]!r}"
            + (
                ": a model call's usage and cost are journaled by the worker that made it"
                if extra[0] == "llm"
                else ""
            )
        )
