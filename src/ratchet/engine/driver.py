"""Driving a run: re-execute the workflow from the top, asking the journal at every step.

A step with ``step_completed`` in the journal returns its saved output without running
(invariant 3). A new step journals ``step_started`` durably before its code runs
(invariant 1); its ``step_completed`` is buffered and committed together with whatever the
run writes next (the next step's ``step_started``, a park, the terminal event), so a step
boundary costs one commit and the output is still durable before the next step begins.
Every write goes through the lease (invariant 4).

The drive is structured: the workflow's branches (``asyncio.gather``, tasks it awaits) all
belong to it. It parks only when every branch waits (see :mod:`ratchet.engine.waits`), it
ends only once no branch runs step code, and it is stopped by request (see
:mod:`ratchet.engine.control`), never by cancelling a journal write.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import functools
import hashlib
import heapq
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from ratchet.engine import tracing
from ratchet.engine.context import HeldStep, StepInfo, current_run, current_step_info, held_here
from ratchet.engine.control import Control, DriveOutcome, Stopped, StopReason
from ratchet.engine.definitions import StepDef, StepKey, WorkflowDef
from ratchet.engine.drive_store import DriveStore
from ratchet.engine.faults import crash_point
from ratchet.engine.guarding import RunGuards
from ratchet.engine.guards import DEFAULT as DEFAULT_GUARDS
from ratchet.engine.guards import Guards
from ratchet.engine.stats import STATS
from ratchet.engine.threads import StepJob, StepThreads
from ratchet.engine.values import Codec, Invalid
from ratchet.engine.waits import PARK_MIN_S, Waits
from ratchet.errors import (
    ApprovalRejected,
    ApprovalTimeout,
    ChildRunFailed,
    DriveAborted,
    DriveRefused,
    GuardTripped,
    InvalidInput,
    LeaseLost,
    NonDeterminismError,
    NotSerializable,
    Parked,
    RatchetError,
    RunFinished,
    SignalTimeout,
    StepCrashLoop,
    StepFailed,
    StepTimeout,
)
from ratchet.model import (
    ABANDONED,
    ClaimedRun,
    Event,
    EventKind,
    Lease,
    NewRun,
    RunState,
    RunStatus,
    StepState,
    apply,
    dumps,
    fold,
    idempotency_key,
    output_payload,
)
from ratchet.receipts.keys import Signer
from ratchet.receipts.service import receipt_for
from ratchet.store.base import Store

log = logging.getLogger("ratchet.engine")
T = TypeVar("T")
# How long a replay waits for a step call the journal says came before an outcome, with
# no step called meanwhile, before it calls the code changed (see RunContext.replayed).
REPLAY_STALL_S = 10.0

# Backoffs at least this long park the run and free the worker instead of sleeping.
PARK_BACKOFF_S = PARK_MIN_S
# An attempt taken over this often from workers that never came back to finish it fails:
# the step's code most likely kills the process, and re-driving it forever helps nobody.
# Drives after a hand-back or a storage failure do not count: their worker was not lost.
MAX_STARTS_PER_ATTEMPT = 5

_DEFAULT_THREADS: StepThreads | None = None

_REPLAYED_ERRORS: dict[str, type[BaseException]] = {
    "SignalTimeout": SignalTimeout,
    "ApprovalTimeout": ApprovalTimeout,
    "ChildRunFailed": ChildRunFailed,
    # A step its workflow abandoned (asyncio.wait_for, asyncio.timeout) times out again on
    # replay, so the workflow takes the path it took then.
    ABANDONED: TimeoutError,
}


def error_text(e: BaseException) -> str:
    """``Type: message``, with NUL characters spelled out: PostgreSQL text columns refuse
    them, and the same text must be stored on both backends."""
    try:
        message = str(e)
    except Exception:  # a broken __str__ must not hide the error itself
        message = "<unprintable>"
    return f"{type(e).__name__}: {message}".replace("\x00", "\\x00")


def child_run_id(parent_run_id: str, ordinal: int, attempt: int) -> str:
    """A child's id, derived from its parent and step so a re-driven parent finds it again.
    ``/`` cannot appear in an id a user chooses, so no user run can take a child's id."""
    suffix = f"/{ordinal}" if attempt == 1 else f"/{ordinal}.{attempt}"
    return parent_run_id + suffix


# No guard at all: what a host-judged drive runs with (see HostJudgedGuards).
UNGUARDED = Guards(
    runaway_repeats=None,
    max_steps=None,
    retry_storm_run=None,
    retry_storm_workflow=None,
    spike_factor=None,
)


class HostJudgedGuards(RunGuards):
    """The guards of a drive whose host judges them (an isolated run's sandbox: the
    worker outside checks each reported step against the run's guards and journals what
    trips, see ratchet.sandbox.host): none here, and nothing tripped is journaled."""

    def configure(self, guards: Guards, overrides: Mapping[str, Any] | None) -> None:
        self.g = UNGUARDED

    async def trip(
        self,
        kind: str,
        key: str,
        step_id: str | None,
        evidence: dict[str, Any],
        action: str | None = None,
    ) -> None:
        return None


def call_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """What a host-judged drive tells its host of a step's call, for the runaway-loop
    guard (the same arguments give the same digest); None for arguments that are not
    data."""
    try:
        return hashlib.sha256(dumps([list(args), kwargs]).encode()).hexdigest()[:16]
    except (TypeError, ValueError):
        return None


class RunContext:
    """One drive of one run: its lease, its folded journal, the events not yet committed,
    and the branches at work."""

    def __init__(
        self,
        store: Store,
        claimed: ClaimedRun,
        state: RunState,
        workflows: Mapping[str, WorkflowDef],
        control: Control,
        threads: StepThreads,
        signer: Signer | None = None,
        host_judged: bool = False,
    ) -> None:
        self.control = control
        self.host_judged = host_judged
        self.signer = signer
        self.trace: tracing.DriveTrace | None = None
        self.loop = asyncio.get_running_loop()
        self.lease = claimed.lease
        self.run_id = claimed.record.run_id
        self.record = claimed.record
        self.claim_reason = claimed.reason
        self.state = state
        self.workflows = workflows
        self.threads = threads
        self.store = DriveStore(store, self.run_id, self._busy, self._idle)
        self.waits = Waits(self.store, self._park, lambda: self.control.stop(StopReason.CANCEL))
        self.pending: list[Event] = []
        self.ordinal = 0
        self.journal_ordinals = max(state.by_ordinal, default=0)
        # The journal's steps by the seq of their first event (the order the fold met
        # them in, so state.steps is in it already), and for each prefix the highest
        # ordinal in it: a journaled outcome goes back to the workflow only once every
        # step first journaled before that outcome has been called again.
        self._first_seqs = [s.first_seq for s in state.steps.values()]
        self._called_before = [0]
        for s in state.steps.values():
            self._called_before.append(max(self._called_before[-1], s.ordinal))
        self._turns: list[tuple[int, int, asyncio.Future[None]]] = []  # (ordinal, n, turn)
        self._lock = asyncio.Lock()
        self._broken = False
        self._closing = False
        self._stepping: set[asyncio.Task[Any]] = set()  # branches inside step code
        self._abandoned: list[StepJob] = []  # threads of `def` steps nobody waits for
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._held: set[HeldStep] = set()  # steps held open while the workflow reads them
        self.guards = HostJudgedGuards(self) if host_judged else RunGuards(self)

    # -- progress and stops ----------------------------------------------------------------

    def _busy(self) -> None:
        self.waits.busy()

    def _idle(self) -> None:
        self.waits.idle()

    def interrupt(self) -> None:
        """The worker asked for a stop (``control.reason``): waits end now; running step
        code is interrupted for a cancel, a lost lease, or a shutdown past its grace."""
        reason = self.control.reason
        if reason is None:
            return
        self.waits.stop(reason)
        if self.control.interrupt_steps:
            for task in list(self._stepping):
                task.cancel()

    def arm_deadline(self) -> None:
        """The guards are configured: stop the drive at the run's deadline (now, if it has
        passed), and let no park outlast it (the park's wake-up time is the deadline at the
        latest, so the run fails on time with no worker driving it)."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        deadline = self.guards.deadline
        self.waits.deadline = deadline[0] if deadline is not None else None
        if deadline is None:
            return
        left = deadline[0] - time.time()
        if left <= 0:
            raise Stopped(StopReason.TIMEOUT)
        self._deadline_timer = self.loop.call_later(
            left, lambda: self.control.stop(StopReason.TIMEOUT)
        )

    def check_stop(self) -> None:
        """A step boundary: no step starts once a stop was requested."""
        reason = self.control.reason
        if reason is not None:
            raise Stopped(reason)
        if self._closing:
            raise Stopped(StopReason.CANCEL)

    def _ours(self) -> bool:
        """Whether a cancellation that reached step code came from the drive (a stop, the
        end of the drive) rather than from the workflow (a timeout around the step)."""
        return self._closing or (self.control.reason is not None and self.control.interrupt_steps)

    async def _close_branches(self) -> None:
        """The workflow is over (returned or raised): stop any branch still in step code,
        and wait until none is, so nothing is written after the terminal event."""
        self._closing = True
        self.waits.stop(StopReason.CANCEL)  # and no branch left waiting may park the run now
        current = asyncio.current_task()
        running = [t for t in self._stepping if t is not current]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)

    async def _settle_steps(self) -> None:
        """For a shutdown: wait until no branch runs step code (the worker interrupts them
        when the grace period is over)."""
        current = asyncio.current_task()
        while running := [t for t in self._stepping if t is not current]:
            await asyncio.wait(running)

    # -- the journal -----------------------------------------------------------------------

    def emit(
        self,
        kind: str,
        step_id: str | None = None,
        attempt: int | None = None,
        payload: dict[str, Any] | None = None,
        payload_json: str | None = None,
    ) -> Event:
        """Add an event to the chain, to be committed by the next write."""
        state = self.state
        if state.status.terminal:
            # The drive has emitted the run's end. A branch that was inside a store call
            # when the drive decided to end goes on afterwards; it adds nothing after the
            # terminal event (which may still be waiting for that call's write), it stops.
            raise Stopped(self.control.reason or StopReason.CANCEL)
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

    async def _write(
        self, op: Callable[[list[Event]], Awaitable[T]], last: Callable[[], Event] | None = None
    ) -> T:
        """Commit the pending events through ``op``, one write at a time, in seq order.
        ``last`` emits a final event once this write holds the lock, so that no other
        write (a branch's, queued for the lock) can carry it."""
        async with self._lock:
            if self._broken:
                raise DriveAborted(f"run {self.run_id}: an earlier write failed; drive abandoned")
            if last is not None:
                last()
            events, self.pending = self.pending, []
            try:
                return await op(events)
            except asyncio.CancelledError:
                raise  # the write completed (DriveStore); the cancellation comes after it
            except BaseException:
                self._broken = True
                raise

    async def flush(self) -> None:
        """Commit every pending event, in one transaction."""
        if not self.pending:
            return
        completed = any(e.kind == EventKind.STEP_COMPLETED for e in self.pending)
        await self._write(lambda events: self.store.append(self.lease, events))
        if completed:
            crash_point("after_step_completed")

    async def _park(self, waits: list[str], not_before: float | None) -> tuple[str, list[str]]:
        return await self._write(
            lambda events: self.store.park(self.lease, events, waits, not_before)
        )

    async def finish(
        self,
        status: RunStatus,
        output: Any = None,
        error: str | None = None,
        dead_letter: str | None = None,
    ) -> None:
        kind = {
            RunStatus.SUCCEEDED: EventKind.RUN_SUCCEEDED,
            RunStatus.FAILED: EventKind.RUN_FAILED,
            RunStatus.CANCELLED: EventKind.RUN_CANCELLED,
        }[status]
        payload: dict[str, Any] = (
            {"output": output} if status == RunStatus.SUCCEEDED else {"error": error}
        )
        if dead_letter:
            payload["reason"] = dead_letter

        async def op(events: list[Event]) -> None:
            crash_point("before_terminal")
            # Signed here, with the terminal event folded in, and stored in the commit that
            # ends the run: no extra transaction, and no run ends unsigned.
            await self.store.finish(
                self.lease,
                events,
                status,
                output,
                error,
                dead_letter,
                receipt_for(self.signer, self.record, self.state),
            )

        # The terminal event goes out only with the terminal status: were it emitted before
        # the lock, a branch's append waiting for the lock could commit it with the run
        # still running, and a failure before this write would leave the two apart.
        await self._write(op, last=lambda: self.emit(kind, payload=payload))
        if status != RunStatus.CANCELLED:
            self.guards.run_finished()
        STATS.finished(str(status))
        crash_point("after_terminal")

    # -- replay ----------------------------------------------------------------------------

    def next_step(self, name: str) -> tuple[str, StepState | None]:
        """Allocate the next ordinal; return its step id and what the journal holds for it.
        A journaled step of another name at this position means the code changed under the
        run: never guess, fail."""
        self.ordinal += 1
        ordinal = self.ordinal
        if self._turns:
            self._hand_turns()
        step = self.state.by_ordinal.get(ordinal)
        if step is not None and step.name != name:
            raise NonDeterminismError(
                f"non-deterministic workflow {self.record.workflow}: at step position "
                f"{ordinal} the journal has {step.step_id!r} but the code now calls "
                f"'{ordinal}:{name}'"
            )
        return f"{ordinal}:{name}", step

    def take_completed(self, name: str) -> StepState | None:
        """The next step, its ordinal taken, when the journal holds it as step ``name``
        completed and :meth:`run_step` would hand its output back at once (no guard's pause
        to ask again, no earlier step to wait for); else None, and nothing is taken. For
        callers that need only a finished step's output: they skip building its call. The
        caller reports the step to the guards (``guards.replayed_step``)."""
        ordinal = self.ordinal + 1
        step = self.state.by_ordinal.get(ordinal)
        if (
            step is None
            or step.status != "completed"
            or step.name != name
            or step.step_id in self.state.paused_at
            or ordinal
            < self._called_before[bisect.bisect_left(self._first_seqs, step.finished_seq)]
        ):
            return None
        self.ordinal = ordinal
        if self._turns:
            self._hand_turns()
        return step

    def take_completed_groups(self, names: Iterable[str], size: int) -> list[StepState]:
        """:meth:`take_completed` for the steps ``names`` in a row, by groups of ``size``:
        the steps of every whole group up to the first one with a step not there to take
        (of which nothing is taken)."""
        get, paused_at = self.state.by_ordinal.get, self.state.paused_at
        first_seqs, called_before = self._first_seqs, self._called_before
        bisect_left = bisect.bisect_left
        ordinal = self.ordinal
        steps: list[StepState] = []
        append = steps.append  # a resume may take tens of thousands of steps here
        for name in names:
            ordinal += 1
            step = get(ordinal)
            if (
                step is None
                or step.name != name
                or step.status != "completed"
                or step.step_id in paused_at
                or ordinal < called_before[bisect_left(first_seqs, step.finished_seq)]
            ):
                break
            append(step)
        taken = len(steps) - len(steps) % size  # steps in whole groups
        del steps[taken:]
        self.ordinal += taken
        if self._turns:
            self._hand_turns()
        return steps

    def take_step(self, step_id: str) -> StepState | None:
        """Take the next ordinal for a step whose id the journal already holds (a guard's
        pause, named by its anomaly); return what the journal holds for it. Branches that
        replay in another order than they first ran take the same ordinals between them."""
        self.ordinal += 1
        if self._turns:
            self._hand_turns()
        return self.state.steps.get(step_id)

    async def replayed(self, step: StepState) -> None:
        """Wait, before a journaled outcome goes back to the workflow, until every step the
        journal holds as begun before that outcome has been called again.

        Parallel branches call their next step when their last one returns; a replay, which
        returns journaled outcomes at once, would otherwise let a branch call its next step
        before another branch called the step it called first, and the two would swap
        ordinals. Handing outcomes back in the journal's order makes the calls come in the
        order they first came. Sequential code never waits here. A call that never comes is
        code that changed under the run."""
        need = self._called_before[bisect.bisect_left(self._first_seqs, step.finished_seq)]
        if self.ordinal >= need:
            return
        turn: asyncio.Future[None] = self.loop.create_future()
        heapq.heappush(self._turns, (need, id(turn), turn))
        seen = self.ordinal
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(turn), REPLAY_STALL_S)
                return
            except TimeoutError:
                if self.ordinal == seen:
                    raise NonDeterminismError(
                        f"non-deterministic workflow {self.record.workflow}: the journal "
                        f"holds step {step.step_id!r} as finished after step position {need} "
                        f"was begun, but the code has called only {self.ordinal} steps"
                    ) from None
                seen = self.ordinal

    def _hand_turns(self) -> None:
        while self._turns and self._turns[0][0] <= self.ordinal:
            turn = heapq.heappop(self._turns)[2]
            if not turn.done():
                turn.set_result(None)

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
        if step.error_type == ApprovalRejected.__name__:
            return ApprovalRejected(step.step_id, step.error or "rejected")
        cls = _REPLAYED_ERRORS.get(step.error_type or "")
        if cls is not None:
            return cls(step.error or "")
        return StepFailed(step.step_id, step.error or "failed")

    # -- steps held open ---------------------------------------------------------------------

    def hold(self, step: HeldStep) -> None:
        """``step`` stays open while the workflow reads it (a stream): until it is read to
        its end or let go, and at the latest until this branch journals anything else."""
        self._held.add(step)
        held_here.set((*held_here.get(), step))

    def release(self, step: HeldStep) -> None:
        """``step`` has ended (its end is journaled)."""
        self._held.discard(step)

    async def close_held(self, workflow_done: bool = False) -> None:
        """The workflow is about to journal something: first end the held steps this branch
        opened and those the workflow let go (all of them once ``workflow_done``), and wait
        until their ends are journaled, so that no step's end comes after a later step's
        start. A branch started before a stream was opened goes on beside it."""
        if not self._held:
            return
        mine = held_here.get()
        for step in [s for s in self._held if workflow_done or s.released or s in mine]:
            await step.end(workflow_done=workflow_done)

    # -- steps -----------------------------------------------------------------------------

    def call_step(
        self,
        sd: StepDef,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        started: dict[str, Any] | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """One call of ``sd`` as the workflow's next step. The ordinal is taken now, at call
        time, so steps started together (asyncio.gather) number the same way on every replay."""
        step_id, journaled = self.next_step(sd.name)
        return self.run_step(sd, args, kwargs, step_id, journaled, started)

    async def run_step(
        self,
        sd: StepDef,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        step_id: str,
        step: StepState | None,
        started: dict[str, Any] | None = None,
    ) -> Any:
        """Run one journaled step: its saved outcome if the journal has one, else its code,
        under its retry policy. ``started`` adds fields to its ``step_started`` events."""
        if self._held:
            await self.close_held()
        guards = self.guards
        if self.state.paused_at:
            await guards.replay_pauses(step_id)
        if step is not None:
            if step.status == "completed":
                await self.replayed(step)
                await guards.after_step(sd, step_id, args, kwargs, step.output, None, False)
                return sd.revive(step.output)
            if step.status == "failed":
                await self.replayed(step)
                raise self.replayed_failure(step)
        self.check_stop()
        base = step.attempt_base if step else 0
        attempt, resumed, key_attempt = self._next_attempt(step)
        if resumed and step is not None and step.interrupted >= MAX_STARTS_PER_ATTEMPT:
            error = (
                f"step {step_id}: attempt {attempt} was started {step.interrupted} times "
                "and never finished (its worker was lost each time)"
            )
            self.emit(
                EventKind.STEP_FAILED,
                step_id,
                attempt,
                {"error": error, "error_type": StepCrashLoop.__name__},
            )
            raise StepCrashLoop(step_id, error)
        if step is not None and step.status in ("retrying", "waiting"):
            until = (step.waiting or {}).get("retry_at")
            if until is not None:
                await self._wait_until(f"backoff:{step_id}", until)
        if self.host_judged:
            digest = call_digest(args, kwargs)
            if digest is not None:
                started = {**(started or {}), "call_sha256": digest}
        while True:
            self.check_stop()
            reserve = await guards.before_attempt(sd, step_id, args, kwargs)
            # The key follows the outcome: an attempt after a failure whose outcome is
            # unknown sends the key of the attempt before it (key_attempt, journaled).
            key = (
                idempotency_key(self.run_id, step_id, key_attempt)
                if sd.key is None
                else self._own_key(sd, step_id, key_attempt)
            )
            if sd.announce is not None and not resumed:
                kind, announced = sd.announce(args, kwargs)
                self.emit(kind, step_id, attempt, announced)
            payload: dict[str, Any] = {"idempotency_key": key}
            if resumed:
                payload["resumed"] = True
            if key_attempt != attempt:
                payload["key_attempt"] = key_attempt
            if sd.kind is None and started is None and key_attempt == attempt and reserve is None:
                # The key is hex: its canonical JSON is written out rather than encoded.
                text = (
                    f'{{"idempotency_key":"{key}","resumed":true}}'
                    if resumed
                    else f'{{"idempotency_key":"{key}"}}'
                )
                self.emit(EventKind.STEP_STARTED, step_id, attempt, payload, text)
            else:
                if reserve is not None:  # held until the call's outcome is known
                    payload["reserve"] = reserve
                self.emit(
                    EventKind.STEP_STARTED,
                    step_id,
                    attempt,
                    {**payload, "kind": sd.kind, **(started or {})},
                )
            await self.flush()
            crash_point("after_step_started")
            span = (
                self.trace.step(step_id, attempt, key, sd.kind, started)
                if self.trace is not None
                else None
            )
            began = time.monotonic()
            try:
                if span is None:
                    result = await self._call(sd, step_id, attempt, key, args, kwargs)
                else:
                    with tracing.active(span):
                        result = await self._call(sd, step_id, attempt, key, args, kwargs)
                extra: dict[str, Any] | None = None
                if sd.encode is not None:
                    result, extra = sd.encode(result)
                text = sd.output_json(result, step_id)
                output = json.loads(text)
                # Read back now as every replay will read it, so what this drive returns
                # is what a replay returns, and a value that does not fit its annotation
                # fails the step rather than completing it. (A step with a decoder of its
                # own, a model call, is rebuilt after it is journaled.)
                value = sd.revive(output, text) if sd.decode is None else None
            except (Stopped, Parked, LeaseLost, DriveAborted, DriveRefused):
                tracing.end_step(span, "interrupted")
                raise
            except asyncio.CancelledError:
                if self._ours():
                    tracing.end_step(span, "interrupted")
                    raise
                tracing.end_step(span, "abandoned")
                # What the step had sent by then may land (and be billed): its outcome is
                # unknown, and a model call keeps its reservation.
                self.emit(
                    EventKind.STEP_FAILED,
                    step_id,
                    attempt,
                    {
                        "error": f"step {step_id} was abandoned by its workflow (cancelled while "
                        "running, e.g. by asyncio.wait_for)",
                        "error_type": ABANDONED,
                        "outcome_unknown": True,
                    },
                )
                raise
            except BaseException as e:  # SystemExit from step code is the step's failure too
                STATS.step("failed", time.monotonic() - began)
                error = error_text(e)
                used = attempt - base
                unknown = bool(getattr(e, "outcome_unknown", False))
                if sd.retry.retryable(e) and used < sd.retry.max_attempts:
                    tracing.end_step(span, "retrying", error)
                    # A provider that says when to come back (429 retry-after) is believed.
                    delay = max(sd.retry.delay_s(used), _retry_after(e))
                    retry = {
                        "attempt": attempt,
                        "of": base + sd.retry.max_attempts,
                        "error": error,
                        "delay_s": delay,
                    }
                    if unknown:
                        retry["outcome_unknown"] = True
                    if delay >= PARK_BACKOFF_S:
                        until = await self.store.now() + delay
                        retry["retry_at"] = until
                        self.emit(EventKind.STEP_RETRYING, step_id, attempt, retry)
                        await guards.after_retry(step_id)
                        self.emit(
                            EventKind.STEP_WAITING,
                            step_id,
                            attempt,
                            {"reason": "backoff", "retry_at": until},
                        )
                        await self._wait_until(f"backoff:{step_id}", until)
                    else:
                        self.emit(EventKind.STEP_RETRYING, step_id, attempt, retry)
                        await guards.after_retry(step_id)
                        await self.flush()
                        await self._wait_until(f"backoff:{step_id}", await self.store.now() + delay)
                    attempt, resumed = attempt + 1, False
                    if not unknown:
                        key_attempt = attempt
                    continue
                tracing.end_step(span, "failed", error)
                failed: dict[str, Any] = {"error": error, "error_type": type(e).__name__}
                if unknown:  # a retry of the run sends this attempt's key again
                    failed["outcome_unknown"] = True
                self.emit(EventKind.STEP_FAILED, step_id, attempt, failed)
                raise StepFailed(step_id, error) from e
            STATS.step("completed", time.monotonic() - began)
            tracing.end_step(span, "completed", llm=extra.get("llm") if extra else None)
            if extra:
                self.emit(
                    EventKind.STEP_COMPLETED, step_id, attempt, *output_payload(output, text, extra)
                )
            else:
                # The canonical form of {"output": output}, without encoding the output again.
                self.emit(
                    EventKind.STEP_COMPLETED,
                    step_id,
                    attempt,
                    {"output": output},
                    f'{{"output":{text}}}',
                )
            await guards.after_step(
                sd, step_id, args, kwargs, output, extra.get("llm") if extra else None, True
            )
            return value if sd.decode is None else sd.decode(output)

    def _own_key(self, sd: StepDef, step_id: str, attempt: int) -> str:
        assert sd.key is not None
        key = sd.key(StepKey(self.run_id, step_id, attempt, self.record.workflow))
        if not isinstance(key, str) or not key or len(key) > 255:
            raise InvalidInput(
                f"step {step_id}: its idempotency_key function returned "
                f"{key!r}: expected a non-empty string of at most 255 characters"
            )
        return key

    async def _call(
        self,
        sd: StepDef,
        step_id: str,
        attempt: int,
        key: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run the step's code, as a branch the drive can interrupt."""
        task = asyncio.current_task()
        assert task is not None
        token = current_step_info.set(
            StepInfo(self.run_id, step_id, attempt, self.lease.epoch, key)
        )
        self._stepping.add(task)
        self._busy()
        try:
            if self._ours():
                raise asyncio.CancelledError  # stopped between the journal write and here
            if sd.is_async:
                return await self._call_async(sd, step_id, args, kwargs)
            return await self._call_in_thread(sd, step_id, args, kwargs)
        finally:
            self._stepping.discard(task)
            current_step_info.reset(token)
            self._idle()

    @staticmethod
    async def _call_async(
        sd: StepDef, step_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if sd.timeout_s is None:
            return await sd.fn(*args, **kwargs)
        # In this task, not a task of its own (as asyncio.wait_for would make): a task that
        # raises SystemExit or KeyboardInterrupt hands it to the event loop, which stops the
        # whole worker, instead of to this drive, which fails the step.
        deadline = asyncio.timeout(sd.timeout_s)
        try:
            async with deadline:
                return await sd.fn(*args, **kwargs)
        except TimeoutError as e:
            if not deadline.expired():
                raise  # the step's own TimeoutError, not its timeout
            raise StepTimeout(f"step {step_id} ran past its timeout of {sd.timeout_s:g}s") from e

    async def _call_in_thread(
        self, sd: StepDef, step_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        # The thread runs in a copy of this context, so current_step() works there.
        job = self.threads.submit(
            functools.partial(contextvars.copy_context().run, sd.fn, *args, **kwargs)
        )
        try:
            if sd.timeout_s is None:
                return await job.done
            await job.started  # the timeout counts from when a thread runs the step
            try:
                return await asyncio.wait_for(job.done, sd.timeout_s)
            except TimeoutError as e:
                if not job.done.cancelled():
                    raise  # the step's own TimeoutError
                raise StepTimeout(
                    f"step {step_id} ran past its timeout of {sd.timeout_s:g}s"
                ) from e
        finally:
            if not job.done.done() or job.done.cancelled():
                self.threads.abandon(job)
                if self._ours():  # stopped by the drive: its run must not be handed on
                    self._abandoned.append(job)

    def threads_still_running(self) -> int:
        """Threads of ``def`` steps the drive's stop interrupted that have not returned."""
        return sum(1 for job in self._abandoned if job.running)

    @staticmethod
    def _next_attempt(step: StepState | None) -> tuple[int, bool, int]:
        """The attempt to run now, whether it re-runs one a crash interrupted, and the
        attempt whose key it sends. Read from the journal, so crashes neither reset nor
        skip attempts, and a key is reused exactly when the journal says to."""
        if step is None:
            return 1, False, 1
        if step.status == "started":  # interrupted in flight: same attempt, same key
            return step.attempt, True, step.key_attempt or step.attempt
        # After a failed attempt (retrying, or waiting out its backoff), or pending again
        # after a manual retry of the run: the next attempt, under a key of its own unless
        # the failure left its outcome unknown.
        attempt = step.attempt + 1
        return attempt, False, (step.key_attempt or step.attempt) if step.same_key else attempt

    # -- waiting ---------------------------------------------------------------------------

    async def _wait_until(self, waiting_for: str, until: float) -> None:
        while (now := await self.store.now()) < until:
            await self.waits.wait(waiting_for, until, now)

    async def sleep(self, seconds: float) -> None:
        if self._held:
            await self.close_held()
        step_id, step = self.next_step("sleep")
        if step is not None and step.status == "completed":
            await self.replayed(step)
            return
        self.check_stop()
        if step is not None and step.waiting is not None:
            until = float(step.waiting["until"])
        else:
            until = await self.store.now() + seconds
            self.emit(
                EventKind.STEP_WAITING,
                step_id,
                None,
                {"reason": "sleep", "seconds": seconds, "until": until},
            )
        await self._wait_until(f"sleep:{step_id}", until)
        self.emit(EventKind.STEP_COMPLETED, step_id, None, {"output": None})

    async def wait_for_signal(
        self, name: str, timeout_s: float | None, codec: Codec | None = None
    ) -> Any:
        """The data of signal ``name``, once it arrives, read as ``codec`` says (the type
        the workflow waits for; None: the JSON data)."""
        if self._held:
            await self.close_held()
        step_id, step = self.next_step(f"signal:{name}")
        if step is not None and step.status in ("completed", "failed"):
            await self.replayed(step)
            if step.status == "completed":
                return _signal_data(codec, name, step.output)
            raise self.replayed_failure(step)
        self.check_stop()
        while True:
            found = await self.store.pending_signal(self.run_id, name)
            if found is not None:
                signal_id, payload = found
                self.emit(
                    EventKind.SIGNAL_RECEIVED, step_id, None, {"name": name, "signal_id": signal_id}
                )
                self.emit(EventKind.STEP_COMPLETED, step_id, None, {"output": payload})
                await self._consume_signal(signal_id)
                return _signal_data(codec, name, payload)
            now = await self.store.now()
            step = self.state.steps.get(step_id)
            if step is not None and step.waiting is not None:
                deadline = step.waiting.get("deadline")
            else:
                deadline = now + timeout_s if timeout_s is not None else None
                self.emit(
                    EventKind.STEP_WAITING,
                    step_id,
                    None,
                    {"reason": "signal", "name": name, "deadline": deadline},
                )
            if deadline is not None and now >= deadline:
                error = f"no signal {name!r} arrived within {timeout_s or 0:g}s"
                self.emit(
                    EventKind.STEP_FAILED,
                    step_id,
                    None,
                    {"error": error, "error_type": "SignalTimeout"},
                )
                raise SignalTimeout(error)
            await self.waits.wait(f"signal:{name}", deadline, now)

    async def _consume_signal(self, signal_id: int) -> None:
        await self._write(lambda events: self.store.consume_signal(self.lease, events, signal_id))

    async def child(
        self, wf: WorkflowDef, args: tuple[Any, ...], kwargs: dict[str, Any], queue: str | None
    ) -> Any:
        if self._held:
            await self.close_held()
        step_id, step = self.next_step(f"child:{wf.name}")
        if step is not None and step.status in ("completed", "failed"):
            await self.replayed(step)
            if step.status == "completed":
                return wf.revive(step.output)
            raise self.replayed_failure(step)
        self.check_stop()

        def new_child(child_id: str) -> NewRun:
            return NewRun(
                child_id,
                wf.name,
                wf.version,
                wf.bind(args, kwargs),
                queue=queue or self.record.queue,
                priority=self.record.priority,
                parent_run_id=self.run_id,
                parent_step_id=step_id,
            )

        if step is None or step.status == "pending":
            # Never started, or started afresh by a retry of the run: a new child, whose id
            # carries the attempt so the failed one is not found again.
            attempt = step.attempt + 1 if step is not None else 1
            child_id = child_run_id(self.run_id, int(step_id.split(":", 1)[0]), attempt)
            new = new_child(child_id)
            self.emit(EventKind.STEP_STARTED, step_id, attempt, {"child_run_id": child_id})
            created = await self._write(
                lambda events: self.store.start_child(self.lease, events, new)
            )
            self._check_child(created.parent_run_id, child_id, step_id)
        else:
            # Journaled by an earlier drive; runs journaled before child ids carried "/"
            # named their child "<parent>-<ordinal>".
            child_id = step.child_run_id or f"{self.run_id}-{step.ordinal}"
            if step.child_run_id is not None and await self.store.get_run(child_id) is None:
                # Journaled as started, never created: branches starting children together
                # share a commit for their step_started events, each child is created by its
                # own, and the drive ended between them. The journal came first (invariant
                # 1), so create the child now, as a step in flight is run again.
                new = new_child(child_id)
                await self._write(lambda events: self.store.start_child(self.lease, events, new))
        while True:
            rec = await self.store.get_run(child_id)
            if rec is None:
                raise RatchetError(f"child run {child_id} of step {step_id} is missing")
            self._check_child(rec.parent_run_id, child_id, step_id)
            if rec.status == RunStatus.SUCCEEDED:
                self.emit(EventKind.STEP_COMPLETED, step_id, None, {"output": rec.output})
                return wf.revive(rec.output)
            if rec.status.terminal:
                error = f"child run {child_id} {rec.status}: {rec.error}"
                self.emit(
                    EventKind.STEP_FAILED,
                    step_id,
                    None,
                    {"error": error, "error_type": "ChildRunFailed"},
                )
                raise ChildRunFailed(error)
            current = self.state.steps.get(step_id)
            if current is None or current.status != "waiting":
                self.emit(
                    EventKind.STEP_WAITING,
                    step_id,
                    None,
                    {"reason": "child", "child_run_id": child_id},
                )
            await self.waits.wait(f"child:{child_id}")

    def _check_child(self, parent: str | None, child_id: str, step_id: str) -> None:
        if parent != self.run_id:
            raise RatchetError(
                f"run {child_id} is not the child of run {self.run_id} started "
                f"by step {step_id} (its parent is {parent!r})"
            )

    # -- the drive -------------------------------------------------------------------------

    async def drive(self) -> DriveOutcome:
        if self.host_judged:  # its host has journaled this drive's start
            return await self._drive()
        rec, lease, state = self.record, self.lease, self.state
        kind = EventKind.RUN_RESUMED if state.started else EventKind.RUN_STARTED
        payload: dict[str, Any] = {
            "worker_id": lease.worker_id,
            "epoch": lease.epoch,
            "reason": self.claim_reason,
            "drive": state.drives + 1,
        }
        reason = self.claim_reason if state.started else "start"
        self.trace = tracing.start_drive(
            rec.run_id,
            rec.workflow,
            rec.workflow_version,
            state.drives + 1,
            "resume" if reason == "claim" else reason,
            lease.worker_id,
            state.trace,
        )
        if self.trace is None:
            self.emit(kind, payload=payload)
            return await self._drive()
        self.emit(kind, payload={**payload, "trace": self.trace.ids()})
        outcome = "error"
        try:
            outcome = await self._drive()
            return outcome
        finally:
            self.trace.end(str(outcome))

    async def _drive(self) -> DriveOutcome:
        rec = self.record
        try:
            try:
                wf = self.workflows.get(rec.workflow)
                if wf is None:
                    raise RatchetError(
                        f"workflow {rec.workflow!r} is not registered with this worker"
                    )
                self.guards.configure(wf.guards or DEFAULT_GUARDS, self.state.guards)
                args, kwargs = wf.call_args(rec.input)
                result = await wf.fn(*args, **kwargs)
                if self._held:  # streams still open end before the run does
                    await self.close_held(workflow_done=True)
                self.check_complete_replay()
                text = wf.result_json(result)
                output = json.loads(text)
                wf.revive(output, text)  # a result its annotation cannot read fails the run
            except (Stopped, Parked, LeaseLost, DriveAborted, DriveRefused, RunFinished):
                raise
            except asyncio.CancelledError:
                if self.control.reason is None:
                    raise  # not asked for: the task itself is being cancelled
                raise Stopped(self.control.reason) from None
            except BaseException as e:
                if self._held:
                    await self.close_held(workflow_done=True)
                await self._close_branches()
                reason = _dead_letter_reason(e)
                error = error_text(e) if not isinstance(e, StepFailed) else str(e)
                await self.finish(RunStatus.FAILED, error=error, dead_letter=reason)
                log.info(
                    "action=run_failed run_id=%s reason=%s error=%s", rec.run_id, reason, error
                )
                return DriveOutcome.FAILED
            await self._close_branches()
            await self.finish(RunStatus.SUCCEEDED, output=output)
            return DriveOutcome.SUCCEEDED
        except Stopped as e:
            return await self._stopped(e.reason)
        except Parked:
            return DriveOutcome.PARKED
        except (LeaseLost, RunFinished, DriveAborted) as e:
            return self._ended_by(e)
        except DriveRefused as e:
            return await self._refused(e)
        finally:
            if self._deadline_timer is not None:
                self._deadline_timer.cancel()
            self.waits.close()

    async def _refused(self, e: DriveRefused) -> DriveOutcome:
        """The database refused a write for good: fail the run with that error, chained
        after what the journal really holds (the refused events never landed)."""
        error = f"the database refused a write of this run: {e}"[:2000]
        log.error("action=run_refused run_id=%s error=%s", self.run_id, error)
        try:
            await self._close_branches()
            self.state = fold(self.run_id, await self.store.raw.load_events(self.run_id))
            self.pending, self._broken = [], False
            await self.finish(RunStatus.FAILED, error=error, dead_letter="store_refused")
        except (LeaseLost, RunFinished):
            return DriveOutcome.LEASE_LOST
        except (DriveAborted, DriveRefused, RatchetError) as again:
            log.warning("action=drive_aborted run_id=%s error=%s", self.run_id, again)
            return DriveOutcome.ABORTED
        return DriveOutcome.FAILED

    async def _stopped(self, reason: StopReason) -> DriveOutcome:
        """The drive stopped at a boundary or a wait. Finish it as the stop asks."""
        if reason is StopReason.LEASE_LOST:
            log.warning("action=lease_lost run_id=%s epoch=%s", self.run_id, self.lease.epoch)
            return DriveOutcome.LEASE_LOST
        try:
            if reason is StopReason.CANCEL:
                await self._close_branches()
                await self.finish(RunStatus.CANCELLED, error="cancelled")
                log.info("action=run_cancelled run_id=%s", self.run_id)
                return DriveOutcome.CANCELLED
            if reason is StopReason.TIMEOUT:
                # Wherever its branches were (step code is interrupted, waits end), the run
                # fails here; the commit that ends it cancels its unfinished children.
                await self._close_branches()
                error = self.guards.timed_out()
                await self.finish(RunStatus.FAILED, error=error, dead_letter="timeout")
                log.info("action=run_timed_out run_id=%s error=%s", self.run_id, error)
                return DriveOutcome.FAILED
            await self._settle_steps()
            if self.threads_still_running():
                # Python cannot stop a thread: the run stays leased to this worker until the
                # lease expires, rather than being handed to another while its step runs.
                log.warning(
                    "action=hand_back_skipped run_id=%s threads=%s",
                    self.run_id,
                    self.threads_still_running(),
                )
                return DriveOutcome.STOPPED
            await self._write(lambda events: self.store.hand_back(self.lease, events))
            return DriveOutcome.HANDED_BACK
        except (LeaseLost, RunFinished, DriveAborted) as e:
            return self._ended_by(e)

    def _ended_by(self, e: LeaseLost | RunFinished | DriveAborted) -> DriveOutcome:
        """The outcome of a drive that a write ended: another worker owns the run, the run
        had already finished, or the database failed (drive it again)."""
        if isinstance(e, RunFinished):
            return DriveOutcome.NOOP
        if isinstance(e, LeaseLost):
            log.warning("action=lease_lost run_id=%s epoch=%s", self.run_id, self.lease.epoch)
            return DriveOutcome.LEASE_LOST
        log.warning("action=drive_aborted run_id=%s error=%s", self.run_id, e)
        return DriveOutcome.ABORTED


async def drive(
    store: Store,
    claimed: ClaimedRun,
    workflows: Mapping[str, WorkflowDef],
    control: Control,
    threads: StepThreads | None = None,
    signer: Signer | None = None,
    *,
    host_judged: bool = False,
) -> DriveOutcome:
    """Drive one claimed run until it finishes, parks, stops or loses its lease; return how
    the drive ended. With ``signer``, a run that ends gets its signed receipt.
    ``host_judged``: a drive inside an isolated run's sandbox, whose host (the worker
    outside) has journaled the drive's start and judges its guards: it writes neither a
    drive marker nor an anomaly, and tells the host each step's call digest."""
    rec = claimed.record
    try:
        events = await store.load_events(rec.run_id)
        state = fold(rec.run_id, events)
        if state.status.terminal:
            # Re-driving a finished run changes nothing. A claim found it unfinished, so
            # its row is behind its journal (the journal is the truth): settle the row.
            await _settle_from_journal(
                store, claimed.lease, state, events[-1], receipt_for(signer, rec, state)
            )
            return DriveOutcome.NOOP
    except (LeaseLost, RunFinished):
        return DriveOutcome.NOOP
    except RatchetError as e:
        log.warning("action=drive_aborted run_id=%s error=%s", rec.run_id, e)
        return DriveOutcome.ABORTED
    ctx = RunContext(
        store,
        claimed,
        state,
        workflows,
        control,
        threads or _default_threads(),
        signer,
        host_judged,
    )
    control.listen(ctx.interrupt)
    token = current_run.set(ctx)
    try:
        return await ctx.drive()
    finally:
        control.listen(None)
        current_run.reset(token)


async def _settle_from_journal(
    store: Store, lease: Lease, state: RunState, last: Event, receipt: dict[str, Any] | None
) -> None:
    """Give the run's row the end its journal already holds, writing no event."""
    log.warning("action=run_settled_from_journal run_id=%s status=%s", state.run_id, state.status)
    reason = last.payload.get("reason") if last.kind == EventKind.RUN_FAILED else None
    await store.finish(
        lease, [], state.status, state.output, state.error, dead_letter=reason, receipt=receipt
    )


def _default_threads() -> StepThreads:
    global _DEFAULT_THREADS
    if _DEFAULT_THREADS is None:
        _DEFAULT_THREADS = StepThreads(32)
    return _DEFAULT_THREADS


def _retry_after(e: BaseException) -> float:
    """Seconds the error asks to wait before trying again (``retry_after_s``), else 0."""
    value = getattr(e, "retry_after_s", None)
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


def _signal_data(codec: Codec | None, name: str, payload: Any) -> Any:
    """A signal's data as the type its workflow waits for. The journal keeps what was
    sent, so data that does not fit raises here on the first drive and on every replay."""
    if codec is None:
        return payload
    try:
        return codec.revive(payload)
    except Invalid as e:
        raise NotSerializable(
            f"the data of signal {name!r} does not fit {codec.name}: {e}"
        ) from None


def _dead_letter_reason(e: BaseException) -> str:
    if isinstance(e, GuardTripped):
        return e.code
    if isinstance(e, NonDeterminismError):
        return "non_determinism"
    if isinstance(e, StepCrashLoop):
        return "crash_loop"
    if isinstance(e, StepFailed | SignalTimeout | ApprovalTimeout | ChildRunFailed):
        return "step_failed"
    if isinstance(e, NotSerializable):
        return "not_serializable"
    return "workflow_error"
