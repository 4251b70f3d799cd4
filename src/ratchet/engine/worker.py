"""A worker: claims ready runs, drives them concurrently, keeps their leases alive, and
sweeps up runs whose worker died.

Loops, all on one event loop:
* claim: take up to the free capacity of ready runs; when none, wait for a wake-up
  (LISTEN/NOTIFY on PostgreSQL, in-process on SQLite) or the poll interval;
* renew: every ttl/3, extend the leases of every run this worker drives in one statement;
  a run missing from the answer was stolen, so its drive is stopped before it can write;
* sweep: every recovery interval, steal up to 20 running runs whose lease expired.
On start a worker first reclaims the runs still under its own id, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ratchet.config import lease_ttl_from_env, recovery_interval_from_env
from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.driver import Control, drive
from ratchet.engine.faults import crash_point
from ratchet.model import ClaimedRun
from ratchet.store.base import CANCEL, READY, Store

log = logging.getLogger("ratchet.worker")

SWEEP_LIMIT = 20


def default_worker_id() -> str:
    """``RATCHET_WORKER_ID`` when set (keep it stable across restarts, e.g. a pod name, so a
    restarted worker reclaims its runs at once), else unique to this process."""
    return os.environ.get("RATCHET_WORKER_ID") or (
        f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")


@dataclass(slots=True)
class _Active:
    task: asyncio.Task[str]
    claimed: ClaimedRun
    control: Control = field(default_factory=Control)


class Worker:
    """Drives runs of ``workflows`` from ``store``."""

    def __init__(self, store: Store, workflows: Mapping[str, WorkflowDef], *,
                 worker_id: str | None = None, concurrency: int = 16,
                 lease_ttl: float | None = None, recovery_interval: float | None = None,
                 queues: Sequence[str] = ("default",), poll_interval: float | None = None
                 ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.store = store
        self.workflows = workflows
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl or lease_ttl_from_env()
        self.recovery_interval = recovery_interval or recovery_interval_from_env()
        self.queues = list(queues)
        # Claims take only runs of these (workflow, version) pairs: in a rolling deploy,
        # or beside workers of other apps, the rest wait for a worker that has them.
        self.served = frozenset((wd.name, wd.version) for wd in workflows.values())
        self.poll_interval = poll_interval or (0.05 if store.dialect == "sqlite" else 1.0)
        self.active: dict[str, _Active] = {}
        self.outcomes: dict[str, int] = {}
        self._slot_freed = asyncio.Event()
        self._started = asyncio.Event()

    @property
    def started(self) -> asyncio.Event:
        """Set once the worker has registered and reclaimed its own runs."""
        return self._started

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Work until ``stop`` is set (or the task is cancelled), then hand back every run
        still in progress so another worker can take it at once."""
        stop = stop or asyncio.Event()
        await self.store.register_worker(self.worker_id, socket.gethostname(), os.getpid(),
                                         serves=self.served, queues=self.queues,
                                         lease_ttl=self.lease_ttl)
        self._spawn(await self.store.reclaim_own(self.worker_id, self.lease_ttl, self.served))
        log.info("action=worker_started worker_id=%s concurrency=%s ttl=%ss sweep=%ss",
                 self.worker_id, self.concurrency, self.lease_ttl, self.recovery_interval)
        self._started.set()
        loops = [asyncio.create_task(coro) for coro in
                 (self._claim_loop(), self._renew_loop(), self._sweep_loop())]
        waiter = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([waiter, *loops], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not waiter and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            waiter.cancel()
            for task in loops:
                task.cancel()
            await self._stop_runs()
            with contextlib.suppress(Exception):
                await self.store.release_worker(self.worker_id)
            log.info("action=worker_stopped worker_id=%s", self.worker_id)

    async def _stop_runs(self) -> None:
        for active in self.active.values():
            active.control.stop_reason = active.control.stop_reason or "shutdown"
            active.task.cancel()
        tasks = [a.task for a in self.active.values()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- driving ---------------------------------------------------------------------------

    def _spawn(self, runs: list[ClaimedRun]) -> None:
        for claimed in runs:
            run_id = claimed.record.run_id
            old = self.active.get(run_id)
            if old is not None:  # taken again (a newer epoch): the old drive is fenced off
                old.control.stop_reason = "lease_lost"
                old.task.cancel()
            control = Control()
            task = asyncio.create_task(self._drive(claimed, control), name=f"run-{run_id}")
            self.active[run_id] = _Active(task, claimed, control)

    async def _drive(self, claimed: ClaimedRun, control: Control) -> str:
        run_id = claimed.record.run_id
        outcome = "error"
        try:
            outcome = await drive(self.store, claimed, self.workflows, control)
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

    # -- loops -----------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        while True:
            free = self.concurrency - len(self.active)
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            # Watch before claiming: a run made ready after the claim looked is announced
            # to this watcher, not lost between the look and the wait.
            with self.store.watching(READY) as ready:
                try:
                    runs = await self.store.claim(self.worker_id, self.lease_ttl, free,
                                                  self.queues, self.served)
                except Exception as e:
                    log.warning("action=claim_failed error=%s", e)
                    await asyncio.sleep(self.poll_interval)
                    continue
                if runs:
                    crash_point("after_claim")
                    self._spawn(runs)
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ready.wait(), self.poll_interval)

    async def _renew_loop(self) -> None:
        every = self.lease_ttl / 3
        while True:
            # A cancel request announced for a run renews early, so it is seen at once.
            with self.store.watching(CANCEL) as cancel, contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cancel.wait(), every)
            snapshot = {run_id: a for run_id, a in self.active.items()}
            try:
                held = await self.store.renew(self.worker_id, self.lease_ttl, list(snapshot))
            except Exception as e:
                log.warning("action=renew_failed error=%s", e)
                continue
            crash_point("after_renew")
            by_run = {h.run_id: h for h in held}
            for run_id, active in snapshot.items():
                if self.active.get(run_id) is not active or active.task.done():
                    continue
                lease = by_run.get(run_id)
                if lease is None or lease.epoch != active.claimed.lease.epoch:
                    active.control.stop_reason = "lease_lost"
                    active.task.cancel()
                    log.warning("action=lease_lost run_id=%s", run_id)
                elif lease.cancel_requested and active.control.stop_reason is None:
                    active.control.stop_reason = "cancel"
                    active.task.cancel()

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.recovery_interval)
            await self.sweep()

    async def sweep(self) -> list[ClaimedRun]:
        """One pass of the recovery sweep: steal up to 20 runs whose lease expired."""
        free = min(SWEEP_LIMIT, self.concurrency - len(self.active))
        if free <= 0:
            return []
        try:
            runs = await self.store.steal_expired(self.worker_id, self.lease_ttl, free,
                                                  self.queues, self.served)
        except Exception as e:
            log.warning("action=sweep_failed error=%s", e)
            return []
        for claimed in runs:
            log.info("action=run_stolen run_id=%s epoch=%s", claimed.record.run_id,
                     claimed.lease.epoch)
        self._spawn(runs)
        return runs
