"""A drive's state and its journal writer.

Events are chained and folded in as they are emitted (:meth:`JournalWriter.emit`) and
committed by the next write, one write at a time and in seq order; every write goes
through the lease (invariant 4 of ``docs/concepts/invariants.md``). A write that fails
leaves the drive broken: nothing more is written by it. Here too: how a drive is stopped
(at a step boundary, a wait, or by interrupting step code) and its deadline's timer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ratchet.engine import tracing
from ratchet.engine.control import Control, Stopped, StopReason
from ratchet.engine.drive import HeldStep
from ratchet.engine.drive_store import DriveStore
from ratchet.engine.faults import crash_point
from ratchet.engine.requests import DriveRequests
from ratchet.engine.stats import STATS
from ratchet.engine.threads import StepJob, StepThreads
from ratchet.engine.waits import Waits
from ratchet.errors import DriveAborted
from ratchet.model import (
    UNNAMED_CANCEL,
    ClaimedRun,
    Event,
    EventKind,
    RunState,
    RunStatus,
    chain_next,
)
from ratchet.receipts.keys import Signer
from ratchet.receipts.service import receipt_for
from ratchet.store.base import Store

if TYPE_CHECKING:
    from ratchet.engine.guards.run import RunGuards

T = TypeVar("T")


def error_text(e: BaseException) -> str:
    """``Type: message``, with NUL characters spelled out: PostgreSQL text columns refuse
    them, and the same text must be stored on both backends."""
    try:
        message = str(e)
    except Exception:  # a broken __str__ must not hide the error itself
        message = "<unprintable>"
    return f"{type(e).__name__}: {message}".replace("\x00", "\\x00")


class JournalWriter:
    """One drive of one run: its lease, its folded journal, the events not yet committed,
    and the branches at work; how it writes its journal and how it stops."""

    guards: RunGuards  # set by the drive (RunContext), which the guards take

    def __init__(
        self,
        store: Store,
        claimed: ClaimedRun,
        state: RunState,
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
        self.threads = threads
        self.store = DriveStore(store, self.run_id, self._busy, self._idle)
        self.waits = Waits(
            self.store, self._park, lambda by: self.control.stop(StopReason.CANCEL, by=by)
        )
        self.pending: list[Event] = []
        self.ordinal = 0
        self.journal_ordinals = max(state.by_ordinal, default=0)
        self.journal_start = state.last_seq  # what earlier drives journaled ends here
        # The run's model requests, read back only once this drive makes a model call.
        self.requests = DriveRequests(self)
        self.request_drift = "error"  # the workflow's, once the drive has found it
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
        # Patches this drive found the run past the old way (ratchet.patched said False).
        self._old_patches: set[str] = set()

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
        ev = chain_next(state, kind, step_id, attempt, payload or {}, payload_json)
        self.pending.append(ev)
        return ev

    def journal(
        self,
        kind: str,
        step_id: str | None = None,
        attempt: int | None = None,
        payload: dict[str, Any] | None = None,
    ) -> None:
        """Add an event to the journal, committed with the drive's next write (the
        :class:`~ratchet.engine.drive.Drive` verb)."""
        self.emit(kind, step_id, attempt, payload)

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
        traceback: str | None = None,
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
        if traceback:
            payload["traceback"] = traceback
        if status == RunStatus.CANCELLED:  # who asked, as the cancel request named them
            payload["by"] = self.control.cancel_by or UNNAMED_CANCEL

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
