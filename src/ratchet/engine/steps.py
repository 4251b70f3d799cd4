"""Steps: one journaled step, run under its retry policy.

A new step journals ``step_started`` durably before its code runs (invariant 1 of
``docs/concepts/invariants.md``); its ``step_completed`` is buffered and committed with
whatever the run writes next (the next step's ``step_started``, a park, the terminal
event), so a step boundary costs one commit and the output is still durable before the next
step begins; a step that finishes while other branches are still in their step code is
committed at once, so a crash before they finish does not run it again. The attempt and
the idempotency key come from the journal, so crashes neither reset nor skip attempts.
Also here: steps held open while the workflow reads them (streams).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import time
from collections.abc import Coroutine
from typing import Any

from ratchet.engine import nested_spend, tracing
from ratchet.engine.context import StepInfo, current_step_info, held_here
from ratchet.engine.control import Stopped
from ratchet.engine.definitions import StepDef, StepKey
from ratchet.engine.drive import HeldStep
from ratchet.engine.evidence import traceback_text
from ratchet.engine.faults import crash_point
from ratchet.engine.guards.host_judged import call_digest
from ratchet.engine.journal_writer import error_text
from ratchet.engine.nested_spend import with_nested_spend
from ratchet.engine.replay import Replay
from ratchet.engine.stats import STATS
from ratchet.engine.waits import PARK_MIN_S
from ratchet.errors import (
    DriveAborted,
    DriveRefused,
    GuardTripped,
    InvalidInput,
    LeaseLost,
    Parked,
    StepCrashLoop,
    StepFailed,
    StepTimeout,
)
from ratchet.model import (
    ABANDONED,
    EventKind,
    StepState,
    WaitKey,
    idempotency_key,
    output_payload,
)

log = logging.getLogger("ratchet.engine")

# Backoffs at least this long park the run and free the worker instead of sleeping.
PARK_BACKOFF_S = PARK_MIN_S
# An attempt taken over this often from workers that never came back to finish it fails:
# the step's code most likely kills the process, and re-driving it forever helps nobody.
# Drives after a hand-back or a storage failure do not count: their worker was not lost.
MAX_STARTS_PER_ATTEMPT = 5


class Steps(Replay):
    """Running steps, and the steps held open."""

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
        # A model call's request (messages, params): journaled with each attempt's start,
        # checked against the journal when its call is replayed.
        request = sd.request(args, kwargs) if sd.request is not None else None
        done = await self.journaled_outcome(step)
        if done is not None:
            if request is not None:
                await self.requests.check_replayed(step_id, request)
            await guards.after_step(sd, step_id, args, kwargs, done.output, None, False)
            return sd.revive(done.output)
        self.check_stop()
        index = await self.requests.index() if request is not None else None
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
                await self._wait_until(str(WaitKey.backoff(step_id)), until)
        if self.host_judged:
            digest = call_digest(args, kwargs)
            if digest is not None:
                started = {**(started or {}), "call_sha256": digest}
        # What the step is called with, for people (replay never reads it): once per call,
        # not per attempt, as every attempt gets the same arguments.
        args_text = sd.args_json(args, kwargs)
        args_value = json.loads(args_text) if args_text is not None else None
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
            if args_text is not None:
                payload["args"] = args_value
            if sd.kind is None and started is None and key_attempt == attempt and reserve is None:
                # The key is hex and the arguments are canonical JSON already: the
                # payload's canonical JSON (keys sorted) is written out, not encoded again.
                head = "{" if args_text is None else f'{{"args":{args_text},'
                text = (
                    f'{head}"idempotency_key":"{key}","resumed":true}}'
                    if resumed
                    else f'{head}"idempotency_key":"{key}"}}'
                )
                self.emit(EventKind.STEP_STARTED, step_id, attempt, payload, text)
            else:
                if reserve is not None:  # held until the call's outcome is known
                    payload["reserve"] = reserve
                full = {**payload, "kind": sd.kind, **(started or {})}
                if request is not None and index is not None:
                    # Computed as it is emitted: which messages the journal already holds
                    # depends on what went before it, parallel calls included.
                    full["request"] = self.requests.entry(index, step_id, request)
                self.emit(EventKind.STEP_STARTED, step_id, attempt, full)
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
                    with_nested_spend(
                        self,
                        step_id,
                        {
                            "error": f"step {step_id} was abandoned by its workflow (cancelled "
                            "while running, e.g. by asyncio.wait_for)",
                            "error_type": ABANDONED,
                            "outcome_unknown": True,
                        },
                    ),
                )
                raise
            except GuardTripped as e:  # a model call inside the step would cross a budget
                STATS.step("failed", time.monotonic() - began)
                tracing.end_step(span, "failed", str(e))
                tripped = with_nested_spend(
                    self,
                    step_id,
                    {
                        "error": error_text(e),
                        "error_type": type(e).__name__,
                        "traceback": traceback_text(e),
                    },
                )
                self.emit(EventKind.STEP_FAILED, step_id, attempt, tripped)
                raise
            except BaseException as e:  # SystemExit from step code is the step's failure too
                STATS.step("failed", time.monotonic() - began)
                error = error_text(e)
                trace = traceback_text(e)
                log.warning(
                    "action=step_failed run_id=%s step_id=%s attempt=%s error=%s\n%s",
                    self.run_id,
                    step_id,
                    attempt,
                    error,
                    trace,
                )
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
                        "traceback": trace,
                        "delay_s": delay,
                    }
                    if unknown:
                        retry["outcome_unknown"] = True
                    with_nested_spend(self, step_id, retry)
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
                        await self._wait_until(str(WaitKey.backoff(step_id)), until)
                    else:
                        self.emit(EventKind.STEP_RETRYING, step_id, attempt, retry)
                        await guards.after_retry(step_id)
                        await self.flush()
                        await self._wait_until(
                            str(WaitKey.backoff(step_id)), await self.store.now() + delay
                        )
                    attempt, resumed = attempt + 1, False
                    if not unknown:
                        key_attempt = attempt
                    continue
                tracing.end_step(span, "failed", error)
                failed: dict[str, Any] = {
                    "error": error,
                    "error_type": type(e).__name__,
                    "traceback": trace,
                }
                if unknown:  # a retry of the run sends this attempt's key again
                    failed["outcome_unknown"] = True
                with_nested_spend(self, step_id, failed)
                self.emit(EventKind.STEP_FAILED, step_id, attempt, failed)
                raise StepFailed(step_id, error) from e
            STATS.step("completed", time.monotonic() - began)
            if (nested := nested_spend.step_ended(self, step_id)) is not None:
                extra = {**(extra or {}), "llm": nested}  # the model calls made inside it
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
            if self._stepping:
                # Branches beside it are still in their step code (a gather, an agent's
                # tool calls): commit this outcome now rather than with whatever the run
                # writes next, which may be minutes away, so a crash meanwhile does not
                # run a finished step again. Alone, it waits for the next write as usual.
                await self.flush()
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

    async def _wait_until(self, waiting_for: str, until: float) -> None:
        while (now := await self.store.now()) < until:
            await self.waits.wait(waiting_for, until, now)


def _retry_after(e: BaseException) -> float:
    """Seconds the error asks to wait before trying again (``retry_after_s``), else 0."""
    value = getattr(e, "retry_after_s", None)
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0
