"""Driving a run: re-execute the workflow from the top, asking the journal at every step.

A step with ``step_completed`` in the journal returns its saved output without running
(invariant 3). A new step journals ``step_started`` durably before its code runs
(invariant 1); its ``step_completed`` is buffered and committed together with whatever the
run writes next (the next step's ``step_started``, a park, the terminal event), so a step
boundary costs one commit and the output is still durable before the next step begins.
Every write goes through the lease (invariant 4).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Mapping
from typing import Any, cast

from ratchet.engine.context import StepInfo, current_run, current_step_info
from ratchet.engine.definitions import StepDef, WorkflowDef, to_json
from ratchet.engine.faults import crash_point
from ratchet.errors import (
    ChildRunFailed,
    DriveAborted,
    LeaseLost,
    NonDeterminismError,
    NotSerializable,
    Parked,
    RatchetError,
    RunFinished,
    SignalTimeout,
    StepFailed,
    StepTimeout,
    StorageError,
)
from ratchet.model import (
    ClaimedRun,
    Event,
    EventKind,
    NewRun,
    RunState,
    RunStatus,
    StepState,
    apply,
    fold,
    idempotency_key,
)
from ratchet.store.base import Store

log = logging.getLogger("ratchet.engine")

# Backoffs at least this long park the run and free the worker instead of sleeping.
PARK_BACKOFF_S = 2.0

_REPLAYED_ERRORS: dict[str, type[RatchetError]] = {
    "SignalTimeout": SignalTimeout,
    "ChildRunFailed": ChildRunFailed,
}


class Control:
    """Why the worker cancelled a drive: ``cancel`` (finish as cancelled), ``lease_lost``
    or ``shutdown`` (stop without writing)."""

    __slots__ = ("stop_reason",)

    def __init__(self) -> None:
        self.stop_reason: str | None = None


class _GuardedStore:
    """The store as one drive sees it. A storage failure (the database restarted, a
    connection cut) abandons the drive with :class:`DriveAborted` rather than surfacing in
    the workflow as an error of whichever step was writing, which would fail the run."""

    def __init__(self, store: Store, ctx: RunContext) -> None:
        self._store = store
        self._ctx = ctx

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        ctx = self._ctx

        async def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return await attr(*args, **kwargs)
            except StorageError as e:
                ctx._broken = True
                raise DriveAborted(f"run {ctx.run_id}: {e}") from e

        return call


class RunContext:
    """One drive of one run: its lease, its folded journal and the events not yet
    committed."""

    def __init__(self, store: Store, claimed: ClaimedRun, state: RunState,
                 workflows: Mapping[str, WorkflowDef], control: Control) -> None:
        self.store = cast(Store, _GuardedStore(store, self))
        self.control = control
        self.loop = asyncio.get_running_loop()
        self.lease = claimed.lease
        self.run_id = claimed.record.run_id
        self.record = claimed.record
        self.state = state
        self.workflows = workflows
        self.pending: list[Event] = []
        self.ordinal = 0
        self.journal_ordinals = max(state.by_ordinal, default=0)
        self._lock = asyncio.Lock()
        self._broken = False

    # -- the journal -----------------------------------------------------------------------

    def emit(self, kind: str, step_id: str | None = None, attempt: int | None = None,
             payload: dict[str, Any] | None = None, payload_json: str | None = None) -> Event:
        """Add an event to the chain, to be committed by the next write."""
        state = self.state
        ev = Event.chain(self.run_id, state.last_seq + 1, kind, step_id, attempt,
                         payload or {}, time.time(), state.last_hash, payload_json)
        apply(state, ev)
        self.pending.append(ev)
        return ev

    def _take_pending(self) -> list[Event]:
        if self._broken:
            raise DriveAborted(f"run {self.run_id}: an earlier write failed; drive abandoned")
        events, self.pending = self.pending, []
        return events

    async def flush(self) -> None:
        """Commit every pending event, in one transaction."""
        async with self._lock:
            events = self._take_pending()
            if not events:
                return
            try:
                await self.store.append(self.lease, events)
            except BaseException:
                self._broken = True
                raise
        if any(e.kind == EventKind.STEP_COMPLETED for e in events):
            crash_point("after_step_completed")

    async def park(self, waiting_for: str, not_before: float | None) -> None:
        """Commit pending events and park the run; raises :class:`Parked` unless what it
        would wait for is already there."""
        async with self._lock:
            events = self._take_pending()
            try:
                outcome = await self.store.park(self.lease, events, waiting_for, not_before)
            except BaseException:
                self._broken = True
                raise
        if outcome == "parked":
            raise Parked(waiting_for)
        if outcome == "cancel":
            self.control.stop_reason = "cancel"
            raise asyncio.CancelledError("cancel requested")

    async def finish(self, status: RunStatus, output: Any = None, error: str | None = None,
                     dead_letter: str | None = None) -> None:
        kind = {RunStatus.SUCCEEDED: EventKind.RUN_SUCCEEDED, RunStatus.FAILED:
                EventKind.RUN_FAILED, RunStatus.CANCELLED: EventKind.RUN_CANCELLED}[status]
        payload: dict[str, Any] = {"output": output} if status == RunStatus.SUCCEEDED else {
            "error": error}
        if dead_letter:
            payload["reason"] = dead_letter
        self.emit(kind, payload=payload)
        async with self._lock:
            events = self._take_pending()
            crash_point("before_terminal")
            await self.store.finish(self.lease, events, status, output, error, dead_letter)
        crash_point("after_terminal")

    # -- replay ----------------------------------------------------------------------------

    def next_step(self, name: str) -> tuple[str, StepState | None]:
        """Allocate the next ordinal; return its step id and what the journal holds for it.
        A journaled step of another name at this position means the code changed under the
        run: never guess, fail."""
        self.ordinal += 1
        ordinal = self.ordinal
        step = self.state.by_ordinal.get(ordinal)
        if step is not None and step.name != name:
            raise NonDeterminismError(
                f"non-deterministic workflow {self.record.workflow}: at step position "
                f"{ordinal} the journal has {step.step_id!r} but the code now calls "
                f"'{ordinal}:{name}'"
            )
        return f"{ordinal}:{name}", step

    def check_complete_replay(self) -> None:
        """The workflow returned: the journal must not hold steps the code no longer calls."""
        if self.journal_ordinals > self.ordinal:
            extra = self.state.by_ordinal[self.ordinal + 1]
            raise NonDeterminismError(
                f"non-deterministic workflow {self.record.workflow}: the journal has step "
                f"{extra.step_id!r} at position {extra.ordinal}, but the code now returns after "
                f"{self.ordinal} steps"
            )

    @staticmethod
    def replayed_failure(step: StepState) -> BaseException:
        cls = _REPLAYED_ERRORS.get(step.error_type or "")
        if cls is not None:
            return cls(step.error or "")
        return StepFailed(step.step_id, step.error or "failed")

    # -- steps -----------------------------------------------------------------------------

    async def run_step(self, sd: StepDef, args: tuple[Any, ...], kwargs: dict[str, Any],
                       step_id: str, step: StepState | None) -> Any:
        if step is not None:
            if step.status == "completed":
                return sd.revive(step.output)
            if step.status == "failed":
                raise self.replayed_failure(step)
        base = step.attempt_base if step else 0
        attempt, resumed = self._next_attempt(step)
        if step is not None and step.status in ("retrying", "waiting"):
            until = (step.waiting or {}).get("retry_at")
            if until is not None and until > await self.store.now():
                await self._park_backoff(step_id, attempt - 1, until, announce=False)
        while True:
            key = idempotency_key(self.run_id, step_id, attempt)
            payload: dict[str, Any] = {"idempotency_key": key}
            if resumed:
                payload["resumed"] = True
            # The key is hex: its canonical JSON is written out rather than encoded.
            text = (f'{{"idempotency_key":"{key}","resumed":true}}' if resumed
                    else f'{{"idempotency_key":"{key}"}}')
            self.emit(EventKind.STEP_STARTED, step_id, attempt, payload, text)
            await self.flush()
            crash_point("after_step_started")
            token = current_step_info.set(
                StepInfo(self.run_id, step_id, attempt, self.lease.epoch, key))
            try:
                result = await _invoke(sd, step_id, args, kwargs)
                text = to_json(result, f"the output of step {step_id}")
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                used = attempt - base
                if sd.retry.retryable(e) and used < sd.retry.max_attempts:
                    delay = sd.retry.delay_s(used)
                    retry = {"attempt": attempt, "of": base + sd.retry.max_attempts,
                             "error": error, "delay_s": delay}
                    if delay >= PARK_BACKOFF_S:
                        until = await self.store.now() + delay
                        retry["retry_at"] = until
                        self.emit(EventKind.STEP_RETRYING, step_id, attempt, retry)
                        await self._park_backoff(step_id, attempt, until, announce=True)
                    else:
                        self.emit(EventKind.STEP_RETRYING, step_id, attempt, retry)
                        await self.flush()
                        await asyncio.sleep(delay)
                    attempt, resumed = attempt + 1, False
                    continue
                self.emit(EventKind.STEP_FAILED, step_id, attempt,
                          {"error": error, "error_type": type(e).__name__})
                raise StepFailed(step_id, error) from e
            finally:
                current_step_info.reset(token)
            output = json.loads(text)
            # The canonical form of {"output": output}, without encoding the output again.
            self.emit(EventKind.STEP_COMPLETED, step_id, attempt, {"output": output},
                      f'{{"output":{text}}}')
            return sd.revive(output)

    @staticmethod
    def _next_attempt(step: StepState | None) -> tuple[int, bool]:
        """The attempt to run now, and whether it re-runs one a crash interrupted. Read
        from the journal, so crashes neither reset nor skip attempts."""
        if step is None:
            return 1, False
        if step.status == "started":
            return step.attempt, True  # interrupted in flight: same attempt, same key
        # After a failed attempt (retrying, or waiting out its backoff), or pending again
        # after a manual retry of the run: the next attempt.
        return step.attempt + 1, False

    async def _park_backoff(self, step_id: str, failed_attempt: int, until: float,
                            announce: bool) -> None:
        if announce:
            self.emit(EventKind.STEP_WAITING, step_id, failed_attempt,
                      {"reason": "backoff", "retry_at": until})
        await self.park(f"backoff:{step_id}", until)

    async def sleep(self, seconds: float) -> None:
        step_id, step = self.next_step("sleep")
        if step is not None and step.status == "completed":
            return
        now = await self.store.now()
        if step is not None and step.waiting is not None:
            until = float(step.waiting["until"])
        else:
            until = now + seconds
            self.emit(EventKind.STEP_WAITING, step_id, None,
                      {"reason": "sleep", "seconds": seconds, "until": until})
        if now < until:
            await self.park(f"sleep:{step_id}", until)
        self.emit(EventKind.STEP_COMPLETED, step_id, None, {"output": None})

    async def wait_for_signal(self, name: str, timeout_s: float | None) -> Any:
        step_id, step = self.next_step(f"signal:{name}")
        if step is not None:
            if step.status == "completed":
                return step.output
            if step.status == "failed":
                raise self.replayed_failure(step)
        while True:
            found = await self.store.pending_signal(self.run_id, name)
            if found is not None:
                signal_id, payload = found
                self.emit(EventKind.SIGNAL_RECEIVED, step_id, None,
                          {"name": name, "signal_id": signal_id})
                self.emit(EventKind.STEP_COMPLETED, step_id, None, {"output": payload})
                async with self._lock:
                    events = self._take_pending()
                    await self.store.consume_signal(self.lease, events, signal_id)
                return payload
            now = await self.store.now()
            step = self.state.steps.get(step_id)
            if step is not None and step.waiting is not None:
                deadline = step.waiting.get("deadline")
            else:
                deadline = now + timeout_s if timeout_s is not None else None
                self.emit(EventKind.STEP_WAITING, step_id, None,
                          {"reason": "signal", "name": name, "deadline": deadline})
            if deadline is not None and now >= deadline:
                error = f"no signal {name!r} arrived within {timeout_s or 0:g}s"
                self.emit(EventKind.STEP_FAILED, step_id, None,
                          {"error": error, "error_type": "SignalTimeout"})
                raise SignalTimeout(error)
            await self.park(f"signal:{name}", deadline)

    async def child(self, wf: WorkflowDef, args: tuple[Any, ...], kwargs: dict[str, Any],
                    queue: str | None) -> Any:
        step_id, step = self.next_step(f"child:{wf.name}")
        if step is not None:
            if step.status == "completed":
                return wf.revive(step.output)
            if step.status == "failed":
                raise self.replayed_failure(step)
        # Derived from (parent, step): a re-driven parent finds its child, never a second one.
        child_id = f"{self.run_id}-{step_id.split(':', 1)[0]}"
        if step is None:
            new = NewRun(child_id, wf.name, wf.version, wf.bind(args, kwargs),
                         queue=queue or self.record.queue, priority=self.record.priority,
                         parent_run_id=self.run_id, parent_step_id=step_id)
            self.emit(EventKind.STEP_STARTED, step_id, 1, {"child_run_id": child_id})
            async with self._lock:
                events = self._take_pending()
                await self.store.start_child(self.lease, events, new)
        while True:
            rec = await self.store.get_run(child_id)
            if rec is None:
                raise StorageError(f"child run {child_id} of step {step_id} is missing")
            if rec.status == RunStatus.SUCCEEDED:
                self.emit(EventKind.STEP_COMPLETED, step_id, None, {"output": rec.output})
                return wf.revive(rec.output)
            if rec.status.terminal:
                error = f"child run {child_id} {rec.status}: {rec.error}"
                self.emit(EventKind.STEP_FAILED, step_id, None,
                          {"error": error, "error_type": "ChildRunFailed"})
                raise ChildRunFailed(error)
            current = self.state.steps.get(step_id)
            if current is None or current.status != "waiting":
                self.emit(EventKind.STEP_WAITING, step_id, None,
                          {"reason": "child", "child_run_id": child_id})
            await self.park(f"child:{child_id}", None)


async def _invoke(sd: StepDef, step_id: str, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    if sd.is_async:
        call = sd.fn(*args, **kwargs)
    else:
        call = asyncio.to_thread(sd.fn, *args, **kwargs)  # copies the context: current_step works
    if sd.timeout_s is None:
        return await call
    try:
        return await asyncio.wait_for(call, sd.timeout_s)
    except TimeoutError as e:
        raise StepTimeout(f"step {step_id} ran past its timeout of {sd.timeout_s:g}s") from e


async def drive(store: Store, claimed: ClaimedRun, workflows: Mapping[str, WorkflowDef],
                control: Control) -> str:
    """Drive one claimed run until it finishes, parks or loses its lease. Returns what
    happened: ``succeeded``, ``failed``, ``cancelled``, ``parked``, ``lease_lost``,
    ``stopped`` or ``noop``."""
    rec = claimed.record
    state = fold(rec.run_id, await store.load_events(rec.run_id))
    if state.status.terminal:
        return "noop"  # re-driving a finished run changes nothing
    ctx = RunContext(store, claimed, state, workflows, control)
    kind = EventKind.RUN_RESUMED if state.started else EventKind.RUN_STARTED
    ctx.emit(kind, payload={"worker_id": claimed.lease.worker_id, "epoch": claimed.lease.epoch,
                            "reason": claimed.reason, "drive": state.drives + 1})
    wf = workflows.get(rec.workflow)
    token = current_run.set(ctx)
    try:
        try:
            if wf is None:
                raise RatchetError(f"workflow {rec.workflow!r} is not registered with this worker")
            args, kwargs = wf.call_args(rec.input)
            result = await wf.fn(*args, **kwargs)
            ctx.check_complete_replay()
            output = json.loads(to_json(result, f"the result of workflow {rec.workflow}"))
        except asyncio.CancelledError:
            if control.stop_reason != "cancel":
                raise
            await ctx.finish(RunStatus.CANCELLED, error="cancelled")
            return "cancelled"
        except (Parked, LeaseLost, StorageError):
            raise
        except Exception as e:
            reason = _dead_letter_reason(e)
            error = f"{type(e).__name__}: {e}" if not isinstance(e, StepFailed) else str(e)
            await ctx.finish(RunStatus.FAILED, error=error, dead_letter=reason)
            log.info("action=run_failed run_id=%s reason=%s error=%s", rec.run_id, reason, error)
            return "failed"
        await ctx.finish(RunStatus.SUCCEEDED, output=output)
        return "succeeded"
    except Parked:
        return "parked"
    except LeaseLost:
        log.warning("action=lease_lost run_id=%s epoch=%s", rec.run_id, claimed.lease.epoch)
        return "lease_lost"
    except RunFinished:
        return "noop"
    except DriveAborted as e:
        log.warning("action=drive_aborted run_id=%s error=%s", rec.run_id, e)
        return "aborted"
    except asyncio.CancelledError:
        return "stopped"
    finally:
        current_run.reset(token)


def _dead_letter_reason(e: BaseException) -> str:
    if isinstance(e, NonDeterminismError):
        return "non_determinism"
    if isinstance(e, StepFailed | SignalTimeout | ChildRunFailed):
        return "step_failed"
    if isinstance(e, NotSerializable):
        return "not_serializable"
    return "workflow_error"
