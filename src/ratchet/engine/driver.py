"""Driving a run: re-execute the workflow from the top, asking the journal at every step.

The drive is built in layers, one module each: its state and journal writer
(:mod:`ratchet.engine.journal_writer`), replay (:mod:`ratchet.engine.replay`), steps
(:mod:`ratchet.engine.steps`), and the waits that are steps (:mod:`ratchet.engine.primitives`:
sleep, signals, child runs, approvals). Here: the drive itself, from its start marker to
how it ends, and the verbs of :class:`~ratchet.engine.drive.Drive` that reach the outside
world.

The drive is structured: the workflow's branches (``asyncio.gather``, tasks it awaits) all
belong to it. It parks only when every branch waits (see :mod:`ratchet.engine.waits`), it
ends only once no branch runs step code, and it is stopped by request (see
:mod:`ratchet.engine.control`), never by cancelling a journal write.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

from ratchet.engine import tracing
from ratchet.engine.context import current_run
from ratchet.engine.control import Control, DriveOutcome, Stopped, StopReason
from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.drive import Drive
from ratchet.engine.evidence import traceback_text
from ratchet.engine.guards import DEFAULT as DEFAULT_GUARDS
from ratchet.engine.guards import Guards
from ratchet.engine.guards.host_judged import HostJudgedGuards
from ratchet.engine.guards.run import RunGuards
from ratchet.engine.journal_writer import error_text
from ratchet.engine.primitives import Primitives
from ratchet.engine.threads import StepThreads
from ratchet.engine.versions import definition_for, missing
from ratchet.errors import (
    ApprovalTimeout,
    ChildRunFailed,
    DriveAborted,
    DriveRefused,
    GuardTripped,
    LeaseLost,
    NonDeterminismError,
    NotSerializable,
    Parked,
    RatchetError,
    RunFinished,
    SignalTimeout,
    StepCrashLoop,
    StepFailed,
)
from ratchet.model import (
    ClaimedRun,
    DeliveryReceipt,
    Event,
    EventKind,
    Lease,
    RunState,
    RunStatus,
    fold,
)
from ratchet.receipts.keys import Signer
from ratchet.receipts.service import receipt_for
from ratchet.store.base import Store, StoredGraph

log = logging.getLogger("ratchet.engine")

_DEFAULT_THREADS: StepThreads | None = None


class RunContext(Primitives):
    """One drive of one run (see the module docstring); what the workflow and the code
    built on it see of it is the :class:`~ratchet.engine.drive.Drive` protocol."""

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
        super().__init__(store, claimed, state, control, threads, signer, host_judged)
        self.workflows = workflows
        self.guards = HostJudgedGuards(self) if host_judged else RunGuards(self)

    # -- what features ask of the outside world ---------------------------------------------

    def configure_guards(self, guards: Guards) -> None:
        """Guard the run with ``guards``, the run's overrides and grants on top."""
        self.guards.configure(guards, self.state.guards)

    async def get_graph(self, name: str, version: str | None = None) -> StoredGraph | None:
        """A registered graph version, or the latest one (None: not registered)."""
        return await self.store.raw.get_graph(name, version)

    async def claim_receipt(
        self, key: str, step_id: str, *, delivery: str, attempt: int
    ) -> DeliveryReceipt | None:
        """Claim a delivery's receipt under this drive's lease (see ratchet.effects)."""
        return await self.store.claim_receipt(
            self.lease, key, step_id, delivery=delivery, attempt=attempt
        )

    async def reclaim_receipt(self, key: str) -> None:
        """Take over a receipt claimed earlier, to dispatch again under its key."""
        await self.store.reclaim_receipt(self.lease, key)

    async def settle_receipt(self, key: str, response: Any) -> None:
        """Store a delivery's response on its receipt."""
        await self.store.settle_receipt(self.lease, key, response)

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
                # That version's code, never another's (see ratchet.engine.versions).
                wf = definition_for(self.workflows, rec.workflow, rec.workflow_version)
                if wf is None:
                    raise RatchetError(missing(self.workflows, rec.workflow, rec.workflow_version))
                self.guards.configure(wf.guards or DEFAULT_GUARDS, self.state.guards)
                self.request_drift = wf.request_drift
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
                # A failed step journaled its own traceback; the workflow's code, here.
                trace = None if isinstance(e, StepFailed) else traceback_text(e)
                await self.finish(
                    RunStatus.FAILED, error=error, dead_letter=reason, traceback=trace
                )
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
    run: Drive = ctx  # what the workflow and the features built on it see
    token = current_run.set(run)
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
