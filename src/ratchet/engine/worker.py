"""A worker: claims ready runs, drives them concurrently, keeps their leases alive, and
sweeps up runs whose worker died.

Loops, all on one event loop:
* claim: take up to the free capacity of ready runs; when none, wait for a wake-up
  (LISTEN/NOTIFY on PostgreSQL, in-process on SQLite) or the poll interval;
* renew: every ttl/3, extend the leases of every run this worker drives in one statement;
  a run missing from the answer was stolen, so its drive is stopped before it can write;
  while renewals fail, each drive is stopped at its lease's local deadline, since another
  worker may take the run from then on;
* liveness: every :data:`LIVENESS_S`, look for workers that died (their liveness lock,
  held while their process lives, is gone: see ratchet.store.workers) and take their runs
  at once, leases live or not, under a new epoch;
* schedules: every second or so, start the due ticks of the schedules (see
  ratchet.engine.scheduler);
* sweep: every recovery interval, steal up to 20 running runs whose lease expired (and at
  once again while passes come back full): the backstop for a holder whose death cannot
  be seen (one cut off, a worker of an earlier version). A sweep or a look that found no
  free slot is owed: the next slot freed sweeps before it claims, so orphans go ahead of
  fresh runs.
On start a worker takes its worker id's liveness lock (refused when a live worker holds
it), then reclaims the runs still under its own id, at once. A drive that a
storage failure abandoned is driven again on this worker after a short backoff while its
lease holds. On shutdown the worker stops claiming, lets steps in flight finish within a
grace period (then interrupts them), and hands each run back once its step has stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ratchet.config import lease_ttl_from_env, recovery_interval_from_env
from ratchet.engine.control import Control, DriveOutcome, StopReason
from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.driver import drive
from ratchet.engine.faults import crash_point
from ratchet.engine.gcpace import GcPacer
from ratchet.engine.scheduler import Scheduler
from ratchet.engine.stats import STATS
from ratchet.engine.threads import StepThreads
from ratchet.engine.versions import definition_for, every_version
from ratchet.errors import WorkerIdInUse
from ratchet.model import ClaimedRun, ClaimReason, RunRecord
from ratchet.receipts import Signer
from ratchet.store.base import CANCEL, READY, Store

log = logging.getLogger("ratchet.worker")

SWEEP_LIMIT = 20
# How often a worker looks for workers that died: a lookup of the workers table and a test
# of their locks, no write unless one died.
LIVENESS_S = 0.5
DEFAULT_GRACE_S = 10.0
# Backoffs before driving again a run whose drive a storage failure abandoned.
RETRY_DRIVE_S = (0.1, 0.3, 1.0, 2.0, 4.0)


def default_worker_id() -> str:
    """``RATCHET_WORKER_ID`` when set (keep it stable across restarts, e.g. a pod name, so a
    restarted worker reclaims its runs at once), else unique to this process."""
    return os.environ.get("RATCHET_WORKER_ID") or (
        f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )


# Takes the run's lease again under a new epoch for the drive (None: the run is no longer
# this drive's), so that whatever wrote under the old epoch is fenced off.
Relet = Callable[[], Awaitable[ClaimedRun | None]]


class Isolation(Protocol):
    """Drives isolated runs (``tier="isolated"``) for a worker: see ratchet.sandbox.isolated.
    Given by the app, so the engine knows nothing of sandboxes."""

    async def drive(
        self, claimed: ClaimedRun, wd: WorkflowDef, control: Control, relet: Relet
    ) -> DriveOutcome: ...

    async def unavailable(self) -> str | None:
        """Why no sandbox can be made on this machine, or None when one can."""

    async def close(self) -> None: ...


@runtime_checkable
class Pinning(Protocol):
    """Workflows whose definition depends on the run's version too (an app's graphs: one
    version may be isolated, another not)."""

    async def pinned(self, store: Store, name: str, version: str) -> WorkflowDef | None: ...


@dataclass(slots=True)
class _Active:
    task: asyncio.Task[str]
    claimed: ClaimedRun
    control: Control = field(default_factory=Control)
    # Local (monotonic) time by which the lease runs out unless a renewal lands: when the
    # claim or the last successful renewal was sent, plus the TTL.
    deadline: float = 0.0


class Worker:
    """Drives runs of ``workflows`` from ``store``."""

    def __init__(
        self,
        store: Store,
        workflows: Mapping[str, WorkflowDef],
        *,
        worker_id: str | None = None,
        concurrency: int = 16,
        lease_ttl: float | None = None,
        recovery_interval: float | None = None,
        queues: Sequence[str] = ("default",),
        poll_interval: float | None = None,
        grace: float = DEFAULT_GRACE_S,
        serve_graphs: bool = False,
        signer: Signer | None = None,
        isolation: Isolation | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if grace < 0:
            raise ValueError(f"grace must be >= 0, got {grace}")
        self.store = store
        self.workflows = workflows
        self.signer = signer  # signs the receipt of each run this worker ends
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl or lease_ttl_from_env()
        self.recovery_interval = recovery_interval or recovery_interval_from_env()
        # And the queues its workflows name (@app.workflow(queue=...)): their runs join those.
        named = [wd.queue for wd in every_version(workflows) if wd.queue is not None]
        self.queues = list(dict.fromkeys([*queues, *named]))
        # Claims take only runs of these (workflow, version) pairs: in a rolling deploy,
        # or beside workers of other apps, the rest wait for a worker that has them.
        self.code_served = frozenset((wd.name, wd.version) for wd in every_version(workflows))
        self.served = self.code_served
        # Whether this worker can make sandboxes: None until asked (once, when it first
        # has isolated runs to serve). A worker that cannot serves no isolated workflow,
        # so another one claims their runs instead of this one failing them.
        self.can_isolate: bool | None = None
        # Graph runs are runs of (graph name, content hash); ``workflows`` answers for any
        # graph name, and the served pairs grow as graphs are registered (by any process).
        self.serve_graphs = serve_graphs
        self.poll_interval = poll_interval or (0.05 if store.dialect == "sqlite" else 1.0)
        self.grace = grace
        self.isolation = isolation
        # Fires the ticks of schedules (ratchet.engine.scheduler), on every worker alike.
        self.scheduler = scheduler
        # Plain `def` steps run on threads of the worker's own, sized from its concurrency
        # (a run's parallel branches may each hold one).
        self.threads = StepThreads(2 * concurrency)
        self.active: dict[str, _Active] = {}
        self.outcomes: dict[str, int] = {}
        self._slot_freed = asyncio.Event()
        self._started = asyncio.Event()
        # Set when runs were taken over (swept, reclaimed): renew at once, since a cancel
        # requested while their last holder was gone is only learnt from a renewal.
        self._renew_now = asyncio.Event()
        # Full garbage collections paced by the runs' turnover (a worker of many runs).
        self._gc = GcPacer(concurrency)
        # Set when a sweep found every slot taken (or filled every free one): orphans may be
        # waiting, so the next freed slot sweeps before it claims a fresh run. Otherwise a
        # worker kept full by a queue of ready runs would leave a dead worker's runs until
        # the queue drained.
        self._sweep_owed = False
        # Held while a claim or a sweep counts the free slots and fills them, so the two
        # loops never both fill the same slot (the sweep's orphan and a fresh run at once).
        self._taking = asyncio.Lock()
        # Set when this worker's runs are not to be handed back at stop, nor its liveness
        # lock let go of: steps that could not be stopped hold them, or another live
        # worker took its id.
        self._kept = False

    @property
    def started(self) -> asyncio.Event:
        """Set once the worker has registered and reclaimed its own runs."""
        return self._started

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Work until ``stop`` is set (or the task is cancelled), then stop every drive
        (see the module docstring) so another worker can take its run at once."""
        stop = stop or asyncio.Event()
        with self._gc:
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
        isolated = frozenset(
            (wd.name, wd.version) for wd in every_version(self.workflows) if wd.sandbox is not None
        )
        if isolated and not await self._isolates():
            self.code_served -= isolated
            self.served = self.code_served
        await self._refresh_graphs()
        await self.store.hold_worker_id(self.worker_id)
        try:
            await self._work(stop)
        finally:
            if not self._kept:
                with contextlib.suppress(Exception):
                    await self.store.drop_worker_id(self.worker_id)

    async def _work(self, stop: asyncio.Event) -> None:
        sent_at = time.monotonic()
        reclaimed = await self.store.start_worker(
            self.worker_id,
            socket.gethostname(),
            os.getpid(),
            serves=self.served,
            queues=self.queues,
            lease_ttl=self.lease_ttl,
        )
        STATS.reclaimed(len(reclaimed))
        self._spawn(reclaimed, sent_at)
        if reclaimed:
            self._renew_now.set()
        log.info(
            "action=worker_started worker_id=%s concurrency=%s ttl=%ss sweep=%ss grace=%ss",
            self.worker_id,
            self.concurrency,
            self.lease_ttl,
            self.recovery_interval,
            self.grace,
        )
        self._started.set()
        claiming = [
            asyncio.create_task(self._claim_loop()),
            asyncio.create_task(self._sweep_loop()),
            asyncio.create_task(self._liveness_loop()),
        ]
        if self.scheduler is not None:
            claiming.append(asyncio.create_task(self.scheduler.run()))
        renewing = asyncio.create_task(self._renew_loop())
        waiter = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait(
                [waiter, renewing, *claiming], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task is not waiter and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            waiter.cancel()
            for task in claiming:
                task.cancel()
            try:
                held = await self._stop_runs()  # leases are still renewed meanwhile
            finally:
                renewing.cancel()
            # Runs whose step could not be stopped stay this worker's until their leases
            # expire: so does its liveness lock, lest another worker take them at once.
            if held:
                self._kept = True
            if not self._kept:
                with contextlib.suppress(Exception):
                    await self.store.release_worker(self.worker_id)
            if self.isolation is not None:
                await self.isolation.close()
            log.info(
                "action=worker_stopped worker_id=%s outcomes=%s",
                self.worker_id,
                ",".join(f"{k}:{v}" for k, v in sorted(self.outcomes.items())) or "-",
            )

    async def _stop_runs(self) -> int:
        """Stop every drive: no new step starts, steps in flight get the grace period to
        finish, then are interrupted. Returns how many runs stay leased to this worker
        because a `def` step's thread could not be stopped (their leases expire)."""
        actives = list(self.active.values())
        if not actives:
            return 0
        log.info(
            "action=shutdown_grace worker_id=%s runs=%s grace=%ss",
            self.worker_id,
            len(actives),
            self.grace,
        )
        for active in actives:
            active.control.stop(StopReason.SHUTDOWN)
        tasks = [a.task for a in actives]
        _, pending = await asyncio.wait(tasks, timeout=self.grace or None)
        if pending:
            log.warning(
                "action=shutdown_grace_over worker_id=%s interrupted=%s",
                self.worker_id,
                len(pending),
            )
            for active in actives:
                if not active.task.done():
                    active.control.stop(StopReason.SHUTDOWN, interrupt_steps=True)
            _, pending = await asyncio.wait(pending, timeout=max(1.0, self.lease_ttl / 3))
            for task in pending:  # a drive that ignores its stop: its lease fences it
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return self.outcomes.get(DriveOutcome.STOPPED, 0)

    # -- driving ---------------------------------------------------------------------------

    def _spawn(self, runs: list[ClaimedRun], sent_at: float) -> None:
        for claimed in runs:
            run_id = claimed.record.run_id
            old = self.active.get(run_id)
            if old is not None:  # taken again (a newer epoch): the old drive is fenced off
                old.control.stop(StopReason.LEASE_LOST)
            control = Control()
            task = asyncio.create_task(self._drive(claimed, control), name=f"run-{run_id}")
            self.active[run_id] = _Active(task, claimed, control, sent_at + self.lease_ttl)

    async def _drive(self, claimed: ClaimedRun, control: Control) -> str:
        run_id = claimed.record.run_id
        outcome: str = "error"
        try:
            for backoff in (*RETRY_DRIVE_S, None):
                outcome = await self._drive_once(claimed, control)
                if outcome != DriveOutcome.ABORTED or backoff is None:
                    break
                # A storage failure: drive it again here while the lease holds, rather than
                # wait for the lease to expire and the sweep to find it.
                self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
                retaken = await self._retake(claimed, control, backoff)
                if retaken is None:
                    break
                claimed = retaken
            return outcome
        except asyncio.CancelledError:
            outcome = "stopped"
            raise
        except BaseException as e:
            log.error("action=drive_error run_id=%s error=%s: %s", run_id, type(e).__name__, e)
            return outcome
        finally:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            current = self.active.get(run_id)
            if current is not None and current.control is control:
                del self.active[run_id]
            self._slot_freed.set()
            self._gc.run_finished(len(self.active))

    async def _workflow(self, record: RunRecord) -> WorkflowDef | None:
        wd = definition_for(self.workflows, record.workflow, record.workflow_version)
        if (
            wd is None
            or (wd.name, wd.version) in self.code_served
            or not isinstance(self.workflows, Pinning)
        ):
            return wd
        return (
            await self.workflows.pinned(self.store, record.workflow, record.workflow_version) or wd
        )

    async def _drive_once(self, claimed: ClaimedRun, control: Control) -> str:
        wd = await self._workflow(claimed.record)
        if wd is None or wd.sandbox is None:
            return await drive(
                self.store, claimed, self.workflows, control, self.threads, self.signer
            )
        if self.isolation is None or not await self._isolates():
            # Never in this process instead: the tier is the workflow's security boundary.
            # (Claimed before this worker knew the version was isolated; it serves no more
            # of them, and the run goes back for a worker that can.)
            log.warning(
                "action=isolated_run_handed_back run_id=%s workflow=%s",
                claimed.record.run_id,
                wd.name,
            )
            await self.store.hand_back(claimed.lease, [])
            return DriveOutcome.HANDED_BACK
        return await self.isolation.drive(
            claimed, wd, control, lambda: self._relet(claimed.record.run_id, control)
        )

    async def _isolates(self) -> bool:
        """Whether this worker can make sandboxes; asked once, and said once why not."""
        if self.can_isolate is None:
            why = (
                "the worker was made without an isolation runner"
                if self.isolation is None
                else await self.isolation.unavailable()
            )
            self.can_isolate = why is None
            if why is not None:
                log.warning(
                    "action=isolation_unavailable worker_id=%s why=%s: isolated runs "
                    "are left to workers that can make sandboxes",
                    self.worker_id,
                    why,
                )
        return self.can_isolate

    async def _relet(self, run_id: str, control: Control) -> ClaimedRun | None:
        """The run's lease one epoch up, for the same drive (see :data:`Relet`)."""
        active = self.active.get(run_id)
        if control.reason is not None or active is None or active.control is not control:
            return None
        sent_at = time.monotonic()
        lease = await self.store.retake_lease(active.claimed.lease, self.lease_ttl)
        if lease is None:
            return None
        relet = ClaimedRun(active.claimed.record, lease, active.claimed.reason)
        active.claimed, active.deadline = relet, sent_at + self.lease_ttl
        return relet

    async def _retake(
        self, claimed: ClaimedRun, control: Control, backoff: float
    ) -> ClaimedRun | None:
        """After ``backoff``, the run's lease under a new epoch for the next drive (so the
        abandoned one is fenced), or None when the run is no longer this worker's to drive."""
        run_id = claimed.record.run_id
        active = self.active.get(run_id)
        if (
            control.reason is not None
            or active is None
            or active.control is not control
            or time.monotonic() + backoff >= active.deadline
        ):
            return None
        log.info("action=drive_retry run_id=%s in=%ss", run_id, backoff)
        await asyncio.sleep(backoff)
        if control.reason is not None:
            return None
        sent_at = time.monotonic()
        try:
            lease = await self.store.retake_lease(claimed.lease, self.lease_ttl)
        except Exception as e:
            log.warning("action=retake_failed run_id=%s error=%s", run_id, e)
            return None  # the lease expires and the sweep takes the run
        if lease is None:
            return None
        retaken = ClaimedRun(claimed.record, lease, ClaimReason.RETRY)
        active.claimed, active.deadline = retaken, sent_at + self.lease_ttl
        return retaken

    # -- loops -----------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        while True:
            free = self.concurrency - len(self.active)
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            if self._sweep_owed and await self.sweep():
                continue  # the orphans first, then fresh runs with what is left
            # Watch before claiming: a run made ready after the claim looked is announced
            # to this watcher, not lost between the look and the wait.
            with self.store.watching(READY) as ready:
                async with self._taking:
                    free = self.concurrency - len(self.active)
                    if free <= 0 or self._sweep_owed:
                        continue  # a sweep filled the slot meanwhile, or is owed it
                    sent_at = time.monotonic()
                    try:
                        runs = await self.store.claim(
                            self.worker_id, self.lease_ttl, free, self.queues, self.served
                        )
                    except Exception as e:
                        log.warning("action=claim_failed error=%s", e)
                        runs = None
                    if runs:
                        crash_point("after_claim")
                        STATS.claimed(len(runs))
                        self._spawn(runs, sent_at)
                        continue
                if runs is None:
                    await asyncio.sleep(self.poll_interval)
                    continue
                if await self._refresh_graphs():
                    continue  # a graph registered since: its runs may be ready now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ready.wait(), self.poll_interval)

    async def _refresh_graphs(self) -> bool:
        """Serve every registered graph version too; whether the set grew."""
        if not self.serve_graphs:
            return False
        try:
            graphs, isolated = await self.store.graph_versions_tiers()
        except Exception as e:
            log.warning("action=graphs_refresh_failed error=%s", e)
            return False
        if isolated and not await self._isolates():
            graphs -= isolated
        served = self.code_served | graphs
        grew = not served <= self.served
        self.served = served
        return grew

    async def _renew_loop(self) -> None:
        every = self.lease_ttl / 3
        wait = every
        # A cancel request announced for a run renews early, so it is seen at once; so do
        # runs just taken over, whose cancel may have been requested meanwhile. Watched for
        # the loop's life: one announced while a renewal is under way renews again at once.
        with self.store.watching(CANCEL) as cancel:
            while True:
                waiters = [asyncio.ensure_future(e.wait()) for e in (cancel, self._renew_now)]
                try:
                    await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in waiters:
                        task.cancel()
                cancel.clear()
                self._renew_now.clear()
                wait = await self._renew(every)

    async def _renew(self, every: float) -> float:
        """Renew the leases of the drives under way; how long to wait for the next renewal."""
        snapshot = {run_id: (a, a.claimed.lease.epoch) for run_id, a in self.active.items()}
        sent_at = time.monotonic()
        try:
            held = await self.store.renew(self.worker_id, self.lease_ttl, list(snapshot))
        except Exception as e:
            log.warning("action=renew_failed error=%s", e)
            self._stop_expired(time.monotonic())
            return min(every, max(0.05, self.lease_ttl / 10))  # try again sooner
        crash_point("after_renew")
        by_run = {h.run_id: h for h in held}
        for run_id, (active, epoch) in snapshot.items():
            if self.active.get(run_id) is not active or active.task.done():
                continue
            lease = by_run.get(run_id)
            # Either epoch is ours: a retake may have moved it while this renewal ran.
            if lease is None or lease.epoch not in (epoch, active.claimed.lease.epoch):
                active.control.stop(StopReason.LEASE_LOST)
                log.warning("action=lease_lost run_id=%s", run_id)
                continue
            active.deadline = sent_at + self.lease_ttl
            if lease.cancel_requested:
                active.control.stop(StopReason.CANCEL, by=lease.cancel_by)
        return every

    def _stop_expired(self, now: float) -> None:
        """Renewals are failing: a drive whose lease has run out by now stops, because
        another worker may already own its run."""
        for run_id, active in list(self.active.items()):
            if now >= active.deadline and active.control.reason is not StopReason.LEASE_LOST:
                log.warning("action=lease_expired run_id=%s", run_id)
                active.control.stop(StopReason.LEASE_LOST)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.recovery_interval)
            # A full pass means more orphans may be waiting: go on at once.
            while len(await self.sweep()) == SWEEP_LIMIT:
                await asyncio.sleep(0)

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(LIVENESS_S)
            async with self._taking:
                await self._take_over()

    async def _take_over(self) -> list[ClaimedRun]:
        """Take the runs of workers that died, up to the free slots (none free: owe a sweep
        if some wait). A worker whose own id was taken meanwhile stops (WorkerIdInUse)."""
        free = max(0, min(SWEEP_LIMIT, self.concurrency - len(self.active)))
        sent_at = time.monotonic()
        try:
            runs, left = await self.store.take_over(
                self.worker_id, self.lease_ttl, free, self.queues, self.served
            )
        except WorkerIdInUse:
            self._kept = True  # the id's runs are the other worker's now
            raise
        except Exception as e:
            log.warning("action=takeover_failed error=%s", e)
            return []
        self._sweep_owed = self._sweep_owed or left
        self._adopt(runs, sent_at, "run_taken_over")
        return runs

    async def sweep(self) -> list[ClaimedRun]:
        """One pass of the recovery sweep: take the runs of workers that died, then steal
        up to 20 runs whose lease expired."""
        async with self._taking:
            return await self._sweep()

    async def _sweep(self) -> list[ClaimedRun]:
        free = min(SWEEP_LIMIT, self.concurrency - len(self.active))
        if free <= 0:
            self._sweep_owed = True
            return []
        self._sweep_owed = False
        taken = await self._take_over()
        free -= len(taken)
        if free <= 0:
            return taken
        sent_at = time.monotonic()
        try:
            runs = await self.store.steal_expired(
                self.worker_id, self.lease_ttl, free, self.queues, self.served
            )
        except Exception as e:
            log.warning("action=sweep_failed error=%s", e)
            return taken
        # Every free slot filled: more orphans may wait for the next one (a full pass of
        # SWEEP_LIMIT goes on at once in the sweep loop).
        self._sweep_owed = self._sweep_owed or len(runs) == free < SWEEP_LIMIT
        STATS.swept(len(runs))
        self._adopt(runs, sent_at, "run_stolen")
        return taken + runs

    def _adopt(self, runs: list[ClaimedRun], sent_at: float, action: str) -> None:
        """Drive runs taken from another worker."""
        for claimed in runs:
            log.info(
                "action=%s run_id=%s epoch=%s", action, claimed.record.run_id, claimed.lease.epoch
            )
        self._spawn(runs, sent_at)
        if runs:
            self._renew_now.set()
