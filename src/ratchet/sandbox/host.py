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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ratchet.engine.drive_store import DriveStore
from ratchet.engine.guards import ANOMALIES, BUDGET, Guards
from ratchet.engine.guards.run import RunGuards
from ratchet.errors import GuardTripped, RunFinished, StorageError, ValueRefused
from ratchet.llm import routing
from ratchet.llm.endpoints import Endpoint
from ratchet.llm.request_parts import split_request
from ratchet.llm.worst_case import worst_case
from ratchet.model import (
    DeadLetterReason,
    Event,
    EventKind,
    Lease,
    RunRecord,
    RunStatus,
    StepStatus,
    chain_next,
    dumps,
    fold,
    output_payload,
)
from ratchet.model.requests import RequestIndex, describe, first_difference
from ratchet.receipts import Signer
from ratchet.receipts.service import receipt_for
from ratchet.sandbox.host_calls import InFlight, check_budgets, own_credentials, send
from ratchet.sandbox.report_check import ENDS, MODEL_STEPS, Proposal, ReportCheck

if TYPE_CHECKING:
    from ratchet.engine.guards.run import GuardedDrive
    from ratchet.store.base import Store


@dataclass(frozen=True, slots=True)
class _Step:
    """What the guards read of a step: its name, and no worst case (a model call's is
    checked when the host makes it)."""

    name: str
    worst_case: None = None


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
        self._calls: dict[tuple[str, int], InFlight] = {}
        # The model requests the journal holds: a call must be the one its step journaled.
        self._requests = RequestIndex()
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
            (s for s in self.state.steps.values() if s.status == StepStatus.COMPLETED),
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
        ev = chain_next(self.state, kind, step_id, attempt, payload or {}, payload_json)
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
            self.emit(
                EventKind.RUN_FAILED, payload={"error": error, "reason": DeadLetterReason.TIMEOUT}
            )
            await self._finish(RunStatus.FAILED, None, error, DeadLetterReason.TIMEOUT)
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
        ReportCheck(self.run_id, self.state, self._completed_here, self._started_here).check(
            proposals, finish
        )
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
        if p.kind == EventKind.PATCH_MARKED:  # ratchet.patched: of no step, no guard's
            self.emit(p.kind, None, None, p.payload, p.payload_json)
            return
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
        request = payload.get("request")
        if isinstance(request, dict):
            self._requests.read(step_id, request)
        digest = payload.get("call_sha256")
        self._digests[step_id] = digest if isinstance(digest, str) else "#" + step_id
        key = payload.get("idempotency_key")
        if isinstance(key, str):
            self._keys[(step_id, attempt)] = key

    def _called(self, step_id: str) -> str:
        return self._digests.get(step_id, "#" + step_id)

    # -- model calls -----------------------------------------------------------------------

    def _check_request(self, step_id: str, endpoint: Endpoint, kwargs: dict[str, Any]) -> None:
        """The call is the request the step's ``step_started`` journaled, or it is refused
        (so the journal holds what was sent). A step journaled without a request is not
        checked: its journal claims nothing."""
        journaled = self._requests.lists.get(step_id)
        if journaled is None:
            return
        messages, params = split_request(endpoint, kwargs)
        difference = first_difference(
            journaled, self._requests.params.get(step_id, {}), messages, params, {}
        )
        if difference is not None:
            raise ValueRefused(
                f"step {step_id}: the call is not the request its step_started journaled: "
                f"{describe(difference)}"
            )

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
            if step is None or step.status != StepStatus.STARTED or step.attempt != attempt:
                raise ValueRefused(
                    f"step {step_id} has no step_started in attempt {attempt}: "
                    "report it before its model call"
                )
            if step.name not in MODEL_STEPS or step.kind != "llm":
                raise ValueRefused(f"step {step_id} is not a model call")
            if (step_id, attempt) in self._calls or step_id in self._completed_here:
                raise ValueRefused(f"attempt {attempt} of step {step_id} has made its call")
            call = routing.call_at(site, step.name)
            kwargs = own_credentials(kwargs)
            self._check_request(step_id, call.endpoint, kwargs)
            key = self._keys[(step_id, attempt)]
            tokens, usd = worst_case((), kwargs)
            try:
                await check_budgets(
                    self.guards, self.state.llm, self._calls.values(), step_id, tokens, usd
                )
            except GuardTripped as e:
                await self._tripped(e)
                raise RunFinished(f"run {self.run_id} was ended by its guards: {e}") from None
            await self._write()  # an anomaly the check journaled (action record)
            self._calls[(step_id, attempt)] = InFlight(tokens, usd or 0.0)
        try:
            answer = await send(call, kwargs, key)
        finally:
            async with self.lock:
                self._calls[(step_id, attempt)] = InFlight(0, 0.0)  # no longer in flight
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


def _call_of(called: str) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    """A replayed step's call, for the runaway-loop streak: its digest stands for its
    arguments."""
    return lambda: ((called,), {})


def _unparked(g: Guards) -> Guards:
    """The guards with ``pause`` read as ``fail``: a sandbox cannot park on an approval."""
    actions = {kind: g.action(kind) for kind in (*ANOMALIES, BUDGET)}
    return dataclasses.replace(
        g, actions={k: "fail" if a == "pause" else a for k, a in actions.items()}
    )
