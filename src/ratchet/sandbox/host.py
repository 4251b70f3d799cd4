"""The host's side of an isolated run's journal: every event of it is written here, by the
worker that owns the sandbox, never by the sandbox.

A sandbox proposes (over the report channel, :mod:`ratchet.sandbox.report_routes`) its drive's step
events, in the order its drive wrote them, and at the end the run's outcome: a kind, a
step id, an attempt and a payload for each. The host checks every proposal against the
step state machine, on its own fold of the journal (:class:`HostJournal` keeps it event
by event, so a report costs no read of the journal):

* ``step_completed``, ``step_failed`` and ``step_retrying`` need the same step's
  ``step_started`` in the same attempt (or, for a short sleep's end, its
  ``step_waiting``); a ``step_started`` continues the step's attempts (the next one, or
  the one a crashed sandbox left in flight); nothing follows a step's end;
* the drive's marker (``run_started``, ``run_resumed``), ``anomaly_detected``,
  ``confidence_*``, approvals, signals and cancels are the host's to write: a sandbox
  that reports one is refused;
* a model call's usage and cost come from the host alone: the host makes the call
  (:meth:`HostJournal.call_model`) and journals its ``step_completed`` itself, and a
  ``step_completed`` carrying more than the step's output is refused;
* the run's end is the last event of a finish report, and the run's row (output, error,
  dead-letter reason) is set from that event's payload, nothing else.

The host judges the run's guards at the same boundaries an in-process drive does (the
engine's own :class:`ratchet.engine.guards.run.RunGuards`, over this fold), journals what
trips, and ends the run itself when a guard fails it (a ``pause`` fails an isolated run:
a sandbox cannot park). What it accepts is chained after the journal's head, stamped
with the host's clock, and written under the sandbox's lease, so the store's fence
refuses the writes of a sandbox its run has moved on from.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ratchet.engine.drive_store import DriveStore
from ratchet.engine.evidence import MAX_ARGS_BYTES, MAX_TRACEBACK_CHARS
from ratchet.engine.guards import ANOMALIES, BUDGET, Guards
from ratchet.engine.guards.run import RunGuards
from ratchet.errors import (
    GuardTripped,
    LLMError,
    LLMRequestError,
    LLMTimeout,
    RunFinished,
    StorageError,
    ValueRefused,
)
from ratchet.llm import routing
from ratchet.llm.endpoints import BY_PROVIDER
from ratchet.llm.worst_case import worst_case
from ratchet.model import (
    Event,
    EventKind,
    Lease,
    RunRecord,
    RunStatus,
    apply,
    dumps,
    fold,
    idempotency_key,
    output_payload,
)
from ratchet.receipts import Signer
from ratchet.receipts.service import receipt_for

if TYPE_CHECKING:
    from ratchet.engine.guards.run import GuardedDrive
    from ratchet.store.base import Store

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
    }
)
ENDS = {EventKind.RUN_SUCCEEDED: RunStatus.SUCCEEDED, EventKind.RUN_FAILED: RunStatus.FAILED}
# The dead-letter reasons a sandbox's drive ends a run with; the guards' are the host's.
SANDBOX_REASONS = frozenset(
    {
        "workflow_error",
        "step_failed",
        "non_determinism",
        "crash_loop",
        "not_serializable",
        "store_refused",
    }
)
# The fields of each proposal's payload (None: any; the tool's call is its own record).
_FIELDS: dict[str, frozenset[str] | None] = {
    EventKind.STEP_STARTED: frozenset(
        {"idempotency_key", "resumed", "kind", "provider", "model", "call_sha256", "args"}
    ),
    EventKind.STEP_COMPLETED: frozenset({"output"}),
    EventKind.STEP_FAILED: frozenset({"error", "error_type", "traceback"}),
    EventKind.STEP_RETRYING: frozenset(
        {"attempt", "of", "error", "delay_s", "retry_at", "traceback"}
    ),
    EventKind.TOOL_CALLED: frozenset({"name", "arguments", "risk"}),
    EventKind.RUN_SUCCEEDED: frozenset({"output"}),
    EventKind.RUN_FAILED: frozenset({"error", "reason", "traceback"}),
}
# What a sandbox may journal of a step's arguments and of a traceback: what its own engine
# writes (ratchet.engine.evidence), with room for the marker.
_EVIDENCE_LIMITS = {"args": MAX_ARGS_BYTES + 256, "traceback": MAX_TRACEBACK_CHARS + 256}
_WAITING_FIELDS = {
    "sleep": frozenset({"reason", "seconds", "until"}),
    "backoff": frozenset({"reason", "retry_at"}),
}
# Headers a sandbox's call may not set: the worker's client sends its own credentials and
# the attempt's key.
_WORKER_HEADERS = frozenset(
    {
        "authorization",
        "api-key",
        "x-api-key",
        "idempotency-key",
        "openai-organization",
        "openai-project",
    }
)
_STEP_ID = re.compile(r"([1-9][0-9]{0,17}):(.+)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Proposal:
    """One event a sandbox reports: what it says happened, not yet in the journal."""

    kind: str
    step_id: str | None
    attempt: int | None
    payload: dict[str, Any]
    payload_json: str


@dataclass(frozen=True, slots=True)
class _Step:
    """What the guards read of a step: its name, and no worst case (a model call's is
    checked when the host makes it)."""

    name: str
    worst_case: None = None


@dataclass(slots=True)
class _View:
    """A step as the proposals of one report leave it, before anything is written."""

    status: str
    attempt: int
    kind: str | None
    waiting: str | None = None


@dataclass(slots=True)
class _Call:
    """A model call the host makes for a step's attempt."""

    tokens: int
    usd: float


class HostJournal:
    """The journal of one sandbox's run, written by the host (see the module docstring).
    Every method runs under :attr:`lock`: one report or call at a time writes."""

    def __init__(
        self,
        store: Store,
        lease: Lease,
        record: RunRecord,
        events: list[Event],
        guards: Guards,
        signer: Signer | None = None,
    ) -> None:
        self.run_id = record.run_id
        self.lease = lease
        self.record = record
        self.signer = signer
        # RunGuards asks the drive's store for the workflow's history; its writes go
        # through the same guard (a storage failure is DriveAborted, a refusal
        # DriveRefused).
        self.store = DriveStore(store, self.run_id, lambda: None, lambda: None)
        self.state = fold(self.run_id, events)
        self.pending: list[Event] = []
        self.lock = asyncio.Lock()
        self.finished: str | None = None  # the run's end, once written here
        self.ended = asyncio.Event()  # set when the host ends the run itself
        self.broken: str | None = None  # why nothing more can be written here
        self.closed = False  # the sandbox is gone: its late calls write nothing
        self._flying: set[asyncio.Task[Any]] = set()  # model calls being made
        self._started_here: set[tuple[str, int]] = set()
        self._digests: dict[str, str] = {}
        self._keys: dict[tuple[str, int], str] = {}
        self._completed_here: dict[str, dict[str, Any]] = {}
        self._calls: dict[tuple[str, int], _Call] = {}
        for ev in events:
            if ev.kind == EventKind.STEP_STARTED and ev.step_id and ev.attempt:
                self._note_started(ev.step_id, ev.attempt, ev.payload)
        # The guards read this fold and journal through emit; the verbs of a pause, which
        # an isolated run never takes (see _unparked), are the only ones missing here.
        self.guards = RunGuards(cast("GuardedDrive", self))
        # The workflow's guards, the run's overrides and what people granted it since.
        configured = guards.override(self.state.guards)
        if self.state.grants:
            configured = configured.override(self.state.grants)
        self.guards.g = _unparked(configured)
        # The run's deadline, kept by the worker: it kills the sandbox there (time_out).
        self.deadline = self.guards.due()
        # The runaway-loop streak goes on from the steps the journal holds, as a re-drive's.
        for step in sorted(
            (s for s in self.state.steps.values() if s.status == "completed"),
            key=lambda s: s.finished_seq,
        ):
            self.guards.replayed_step(
                step.name, step.step_id, step.output, _call_of(self._called(step.step_id))
            )

    # -- the journal -----------------------------------------------------------------------

    def emit(
        self,
        kind: str,
        step_id: str | None = None,
        attempt: int | None = None,
        payload: dict[str, Any] | None = None,
        payload_json: str | None = None,
    ) -> Event:
        """Chain an event after the head, fold it in, and keep it for the next write (what
        RunGuards calls to journal an anomaly)."""
        state = self.state
        ev = Event.chain(
            self.run_id,
            state.last_seq + 1,
            kind,
            step_id,
            attempt,
            payload or {},
            time.time(),
            state.last_hash,
            payload_json,
        )
        apply(state, ev)
        self.pending.append(ev)
        return ev

    def _break(self, e: BaseException) -> None:
        """What was folded in did not reach the journal: nothing more is written here."""
        self.broken = f"a write of this sandbox's run failed: {type(e).__name__}: {e}"

    async def _write(self) -> None:
        events, self.pending = self.pending, []
        if not events:
            return
        try:
            await self.store.append(self.lease, events)
        except BaseException as e:
            self._break(e)
            raise

    async def _finish(
        self, status: RunStatus, output: Any, error: str | None, dead_letter: str | None
    ) -> None:
        events, self.pending = self.pending, []
        try:
            await self.store.finish(
                self.lease,
                events,
                status,
                output,
                error,
                dead_letter,
                receipt_for(self.signer, self.record, self.state),
            )
        except BaseException as e:
            self._break(e)
            raise
        self.finished = str(status)
        self.guards.run_finished()

    async def _tripped(self, e: GuardTripped) -> None:
        """A guard failed the run: its anomaly (pending) and the run's end, written."""
        error = f"GuardTripped: {e}"
        self.emit(EventKind.RUN_FAILED, payload={"error": error, "reason": e.code})
        await self._finish(RunStatus.FAILED, None, error, e.code)
        self.ended.set()

    async def time_out(self) -> bool:
        """The run passed its deadline (its sandbox is gone): journal its end, a
        ``RunTimeout`` with dead-letter reason ``timeout``, as an in-process drive ends
        one; False when the run had ended already or nothing more can be written here."""
        async with self.lock:
            if self.finished is not None or self.broken is not None or self.deadline is None:
                return False
            # A budget_wall_s deadline journals its anomaly too.
            error = self.guards.timed_out(self.deadline)
            self.emit(EventKind.RUN_FAILED, payload={"error": error, "reason": "timeout"})
            await self._finish(RunStatus.FAILED, None, error, "timeout")
            self.ended.set()
            return True

    def close(self) -> None:
        """The sandbox has ended: its model calls still being made are given up (a
        call's outcome is then unknown, and the next sandbox makes it again under the
        same key), and nothing more of it is written."""
        self.closed = True
        for task in list(self._flying):
            task.cancel()

    def _usable(self) -> None:
        if self.finished is not None:
            raise RunFinished(f"run {self.run_id} has already finished ({self.finished})")
        if self.broken is not None:  # the next sandbox starts from what the database holds
            raise StorageError(f"run {self.run_id}: {self.broken}")

    # -- reports ---------------------------------------------------------------------------

    async def propose(self, proposals: list[Proposal], finish: bool) -> int:
        """Check a report whole, then journal it: its step events, with what the guards
        find at each, and with ``finish`` its last event, the run's end. The seq of the
        journal's head after it. Raises :class:`ValueRefused` naming the first proposal
        the state machine refuses (nothing is written), :class:`RunFinished` when the run
        is over (a guard may have just ended it)."""
        async with self.lock:
            return await self._propose(proposals, finish)

    async def _propose(self, proposals: list[Proposal], finish: bool) -> int:
        self._usable()
        self._check(proposals, finish)
        steps = proposals[:-1] if finish else proposals
        try:
            for p in steps:
                await self._accept(p)
        except GuardTripped as e:
            await self._tripped(e)
            raise RunFinished(f"run {self.run_id} was ended by its guards: {e}") from None
        except BaseException as e:  # the fold is ahead of the journal now: stop here
            self._break(e)
            raise
        if not finish:
            await self._write()
            return self.state.last_seq
        end = proposals[-1]
        self.emit(end.kind, None, None, end.payload, end.payload_json)
        status = ENDS[EventKind(end.kind)]
        # The row takes the run's end from the journal's terminal event, and only from it.
        await self._finish(
            status, end.payload.get("output"), end.payload.get("error"), end.payload.get("reason")
        )
        return self.state.last_seq

    async def _accept(self, p: Proposal) -> None:
        if p.kind == EventKind.STEP_COMPLETED and p.step_id in self._completed_here:
            return  # a model call's end, journaled by the host already (checked equal)
        assert p.step_id is not None
        name = p.step_id.partition(":")[2]
        if p.kind == EventKind.STEP_STARTED:
            assert p.attempt is not None
            await self.guards.before_attempt(cast("Any", _Step(name)), p.step_id, (), {})
            self.emit(p.kind, p.step_id, p.attempt, p.payload, p.payload_json)
            self._note_started(p.step_id, p.attempt, p.payload)
            self._started_here.add((p.step_id, p.attempt))
            return
        self.emit(p.kind, p.step_id, p.attempt, p.payload, p.payload_json)
        if p.kind == EventKind.STEP_COMPLETED:
            await self.guards.after_step(
                cast("Any", _Step(name)),
                p.step_id,
                (self._called(p.step_id),),
                {},
                p.payload.get("output"),
                None,
                True,
            )
        elif p.kind == EventKind.STEP_RETRYING:
            await self.guards.after_retry(p.step_id)

    def _note_started(self, step_id: str, attempt: int, payload: dict[str, Any]) -> None:
        digest = payload.get("call_sha256")
        self._digests[step_id] = digest if isinstance(digest, str) else "#" + step_id
        key = payload.get("idempotency_key")
        if isinstance(key, str):
            self._keys[(step_id, attempt)] = key

    def _called(self, step_id: str) -> str:
        return self._digests.get(step_id, "#" + step_id)

    # -- the state machine -----------------------------------------------------------------

    def _check(self, proposals: list[Proposal], finish: bool) -> None:
        """Refuse the report unless every proposal follows from the journal and the ones
        before it (raises :class:`ValueRefused` naming the first that does not)."""
        if not proposals:
            raise ValueRefused("a report carries at least one event")
        views: dict[str, _View | None] = {}
        ordinals: dict[int, str] = {}
        for i, p in enumerate(proposals):
            last = finish and i == len(proposals) - 1
            where = f"event {i + 1} ({p.kind}" + (f" of step {p.step_id})" if p.step_id else ")")
            try:
                if last:
                    self._check_end(p)
                elif p.kind in ENDS:
                    raise ValueRefused("the run's end is the last event of a finish report")
                else:
                    self._check_step(p, views, ordinals)
            except ValueRefused as e:
                raise ValueRefused(f"{where}: {e}") from None

    def _check_end(self, p: Proposal) -> None:
        if p.kind not in ENDS:
            raise ValueRefused("a finish report ends with run_succeeded or run_failed")
        _fields(p)
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
                (step.waiting or {}).get("reason") if step.status == "waiting" else None,
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
        if view is None and p.kind in (
            EventKind.STEP_COMPLETED,
            EventKind.STEP_FAILED,
            EventKind.STEP_RETRYING,
        ):
            raise ValueRefused(f"step {step_id} never started")
        if view is not None and view.status in ("completed", "failed"):
            if (
                p.kind == EventKind.STEP_COMPLETED
                and step_id in self._completed_here
                and p.attempt == view.attempt
                and p.payload == self._completed_here[step_id]
            ):
                return  # the host's own journaling of a model call's end, reported back
            raise ValueRefused(f"step {step_id} has {view.status}: nothing follows a step's end")
        if p.kind != EventKind.STEP_WAITING:
            _fields(p)
        kind = p.kind
        if kind == EventKind.STEP_STARTED:
            self._check_start(p, step_id, name, view)
            views[step_id] = _View("started", p.attempt or 0, p.payload.get("kind"))
            ordinals[ordinal] = step_id
            return
        if kind == EventKind.TOOL_CALLED:
            if p.attempt is None or p.attempt != _next_attempt(view):
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
            if view.status != "waiting" or view.waiting != "sleep" or p.payload != {"output": None}:
                raise ValueRefused(f"step {step_id}: only a sleep ends without an attempt")
            views[step_id] = _View("completed", view.attempt, view.kind)
            return
        if view.status != "started" or p.attempt != view.attempt:
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
            views[step_id] = _View("completed", view.attempt, view.kind)
        elif kind == EventKind.STEP_FAILED:
            if not isinstance(p.payload.get("error"), str):
                raise ValueRefused("step_failed carries the step's error as text")
            views[step_id] = _View("failed", view.attempt, view.kind)
        else:
            views[step_id] = _View("retrying", view.attempt, view.kind)

    def _check_start(self, p: Proposal, step_id: str, name: str, view: _View | None) -> None:
        attempt = p.attempt
        if attempt is None:
            raise ValueRefused("a step_started names its attempt")
        key = p.payload.get("idempotency_key")
        if not isinstance(key, str) or not key or len(key) > 255:
            raise ValueRefused("a step_started carries the attempt's idempotency_key")
        if view is not None and view.status == "started":
            # The attempt a crashed sandbox left in flight runs again, once per sandbox.
            if attempt != view.attempt or (step_id, attempt) in self._started_here:
                raise ValueRefused(
                    f"attempt {view.attempt} of step {step_id} has started "
                    "and not ended (step_retrying comes before the next)"
                )
        elif attempt != (expected := _next_attempt(view)):
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
            views[step_id] = _View("waiting", 0, None, "sleep")
            return
        if view is None or view.status != "retrying" or p.attempt != view.attempt:
            raise ValueRefused(f"step {step_id}: a backoff follows the attempt's step_retrying")
        views[step_id] = _View("waiting", view.attempt, view.kind, "backoff")

    # -- model calls -----------------------------------------------------------------------

    async def call_model(
        self, step_id: str, attempt: int, site: str, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """Make a model call for the step's attempt, with the worker's own client made at
        ``site`` (its credentials, the attempt's idempotency key), after checking the
        run's budgets with the call's worst case and what the calls in flight may spend;
        journal its ``step_completed`` with the provider's usage and cost; return the
        body and that record (``{"body": ..., "meta": ...}``)."""
        task = asyncio.current_task()
        assert task is not None
        self._flying.add(task)
        try:
            return await self._call_model(step_id, attempt, site, kwargs)
        finally:
            self._flying.discard(task)

    async def _call_model(
        self, step_id: str, attempt: int, site: str, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        async with self.lock:
            if self.closed:
                raise RunFinished(f"the sandbox of run {self.run_id} has ended")
            self._usable()
            step = self.state.steps.get(step_id)
            if step is None or step.status != "started" or step.attempt != attempt:
                raise ValueRefused(
                    f"step {step_id} has no step_started in attempt {attempt}: "
                    "report it before its model call"
                )
            if step.name not in MODEL_STEPS or step.kind != "llm":
                raise ValueRefused(f"step {step_id} is not a model call")
            if (step_id, attempt) in self._calls or step_id in self._completed_here:
                raise ValueRefused(f"attempt {attempt} of step {step_id} has made its call")
            call = routing.call_at(site, step.name)
            kwargs = _own_credentials(kwargs)
            key = self._keys[(step_id, attempt)]
            tokens, usd = worst_case((), kwargs)
            try:
                await self._check_budgets(step_id, tokens, usd)
            except GuardTripped as e:
                await self._tripped(e)
                raise RunFinished(f"run {self.run_id} was ended by its guards: {e}") from None
            await self._write()  # an anomaly the check journaled (action record)
            self._calls[(step_id, attempt)] = _Call(tokens, usd or 0.0)
        try:
            answer = await _send(call, kwargs, key)
        finally:
            async with self.lock:
                self._calls[(step_id, attempt)] = _Call(0, 0.0)  # no longer in flight
        async with self.lock:
            if self.closed:
                raise RunFinished(f"the sandbox of run {self.run_id} has ended")
            self._usable()
            text = dumps(answer.body)
            payload, payload_json = output_payload(json.loads(text), text, {"llm": answer.meta})
            self.emit(EventKind.STEP_COMPLETED, step_id, attempt, payload, payload_json)
            self._completed_here[step_id] = payload
            try:
                await self.guards.after_step(
                    cast("Any", _Step(step.name)),
                    step_id,
                    (self._called(step_id),),
                    {},
                    payload["output"],
                    payload["llm"],
                    True,
                )
            except GuardTripped as e:
                await self._tripped(e)
                raise RunFinished(f"run {self.run_id} was ended by its guards: {e}") from None
            except BaseException as e:
                self._break(e)
                raise
            await self._write()
        return {"body": payload["output"], "meta": payload["llm"]}

    async def _check_budgets(self, step_id: str, tokens: int, usd: float | None) -> None:
        """The token and money budgets against what the run has spent, what its calls in
        flight may still spend, and this call's worst case: a call that could cross one is
        never sent (its guard trips first)."""
        g, spent = self.guards.g, self.state.llm
        flying_tokens = sum(c.tokens for c in self._calls.values())
        flying_usd = sum(c.usd for c in self._calls.values())
        if g.budget_tokens is not None and (
            spent.tokens + flying_tokens + tokens > g.budget_tokens
        ):
            await self.guards.trip(
                BUDGET,
                f"{BUDGET}:tokens",
                step_id,
                {
                    "budget": "tokens",
                    "used": spent.tokens + flying_tokens,
                    "limit": g.budget_tokens,
                    "worst_case": tokens,
                },
            )
        if (
            g.budget_usd is not None
            and usd is not None
            and (spent.cost_usd + flying_usd + usd > g.budget_usd)
        ):
            await self.guards.trip(
                BUDGET,
                f"{BUDGET}:usd",
                step_id,
                {
                    "budget": "usd",
                    "used": round(spent.cost_usd + flying_usd, 6),
                    "limit": g.budget_usd,
                    "worst_case": round(usd, 6),
                },
            )


async def _send(call: Any, kwargs: dict[str, Any], key: str) -> Any:
    """The provider's answer to one call, or the error a step's retry policy reads: an
    LLM error as the SDK's own would be, a timeout, or the request's fault."""
    try:
        if call.step.timeout_s is None:
            return await call.send(dict(kwargs), key)
        async with asyncio.timeout(call.step.timeout_s):
            return await call.send(dict(kwargs), key)
    except LLMError:
        raise
    except TimeoutError as e:
        raise LLMTimeout(
            f"{call.endpoint.name} ran past its timeout of {call.step.timeout_s:g}s",
            provider=call.endpoint.provider,
        ) from e
    except Exception as e:  # the SDK refused the arguments: the request's fault
        raise LLMRequestError(
            f"{call.endpoint.name}: {type(e).__name__}: {e}", provider=call.endpoint.provider
        ) from e


def _own_credentials(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments without headers that would stand in for the worker's own."""
    headers = kwargs.get("extra_headers")
    if not isinstance(headers, dict):
        return kwargs
    return {
        **kwargs,
        "extra_headers": {
            k: v for k, v in headers.items() if str(k).lower() not in _WORKER_HEADERS
        },
    }


def _call_of(called: str) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    """A replayed step's call, for the runaway-loop streak: its digest stands for its
    arguments."""
    return lambda: ((called,), {})


def _next_attempt(view: _View | None) -> int:
    """The attempt a step goes on with: 1, or the one after its last when that one
    failed and is retried (``step_retrying``, its backoff, or a retry of the run); 0 (none)
    for a step in any other state."""
    if view is None:
        return 1
    if view.status in ("retrying", "pending") or (view.status, view.waiting) == (
        "waiting",
        "backoff",
    ):
        return view.attempt + 1
    return 0


def _fields(p: Proposal) -> None:
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


def _unparked(g: Guards) -> Guards:
    """The guards with ``pause`` read as ``fail``: a sandbox cannot park on an approval."""
    actions = {kind: g.action(kind) for kind in (*ANOMALIES, BUDGET)}
    return dataclasses.replace(
        g, actions={k: "fail" if a == "pause" else a for k, a in actions.items()}
    )
