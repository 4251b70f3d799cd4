"""Workers in the application's own process: made, launched, and shut down with it."""

from __future__ import annotations

import asyncio
from typing import Any, Self

from ratchet.app.base import running_loop
from ratchet.app.definitions import Definitions
from ratchet.config import private_paths
from ratchet.engine import faults
from ratchet.engine.scheduler import Scheduler
from ratchet.engine.worker import Worker
from ratchet.errors import RatchetError


class Embedded(Definitions):
    """The worker calls of :class:`ratchet.Ratchet`."""

    def worker(self, **options: Any) -> Worker:
        """A worker for this app's workflows (see :class:`ratchet.engine.worker.Worker`)."""
        faults.check()
        options.setdefault("lease_ttl", self.lease_ttl)
        options.setdefault("recovery_interval", self.recovery_interval)
        from ratchet.graphs.registry import AppWorkflows

        options.setdefault("serve_graphs", True)
        options.setdefault("signer", self.signer)
        # Graph versions may be isolated too (tier: isolated); the runner costs nothing
        # until a sandbox is needed.
        if "isolation" not in options and (
            options["serve_graphs"] or any(wd.sandbox is not None for wd in self.workflows.every())
        ):
            from ratchet.sandbox.on_demand import OnDemandRunner

            options["isolation"] = OnDemandRunner(
                self.store, signer=options["signer"], private=private_paths(self.database_url)
            )
        # Every worker fires schedules' ticks: the declared ones and those added at run time.
        options.setdefault(
            "scheduler",
            Scheduler(
                self.store,
                self.workflows,
                list(self.schedule_specs.values()),
                now=self.wall_clock,
            ),
        )
        return Worker(self.store, AppWorkflows(self), **options)

    async def run_worker(self, stop: asyncio.Event | None = None, **options: Any) -> None:
        """Run a worker on the current event loop until ``stop`` is set."""
        await self._astore()
        await self.worker(**options).run(stop)

    async def _begin(self, worker: Worker) -> tuple[asyncio.Event, asyncio.Task[None]]:
        stop = asyncio.Event()
        task = asyncio.ensure_future(worker.run(stop))
        started = asyncio.ensure_future(worker.started.wait())
        await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
        if not worker.started.is_set():  # it failed to start (its worker id in use, say)
            started.cancel()
            task.result()
        return stop, task

    def launch(self, **options: Any) -> Worker:
        """Start a worker in the background of this process (on the app's own loop)."""
        if self._embedded is not None:
            raise RatchetError("a worker is already launched; call shutdown() first")
        worker = self.worker(**options)
        self._embedded = self._portal.call(self._begin(worker))
        return worker

    async def launch_async(self, **options: Any) -> Worker:
        """Start a worker as a task on the running event loop (an async application's
        own); stop it with :meth:`shutdown_async`."""
        if self._embedded is not None:
            raise RatchetError("a worker is already launched; call shutdown() first")
        await self._astore()
        worker = self.worker(**options)
        self._embedded = await self._begin(worker)
        return worker

    def shutdown(self) -> None:
        """Stop a launched worker (its runs go back to the queue) and close the store."""
        if self._embedded is not None:
            stop, task = self._embedded
            loop = task.get_loop()
            if loop is not self._portal.current and running_loop() is loop:
                raise RatchetError(
                    "the worker was launched on this event loop with "
                    "launch_async(); await shutdown_async() instead"
                )
            self._embedded = None

            async def end() -> None:
                stop.set()
                await task

            if loop is self._portal.current:
                self._portal.call(end())
            elif not loop.is_closed():
                asyncio.run_coroutine_threadsafe(end(), loop).result()
        if self._store is not None:
            self._portal.call(self._store.close())
            self._store = None
        self._portal.stop()

    async def shutdown_async(self) -> None:
        """Stop a launched worker (its runs go back to the queue) and close the store,
        without blocking the running event loop."""
        if self._embedded is not None:
            stop, task = self._embedded
            self._embedded = None
            if task.get_loop() is asyncio.get_running_loop():
                stop.set()
                await task
            else:

                async def end() -> None:
                    stop.set()
                    await task

                await asyncio.to_thread(self._portal.call, end())
        store, self._store = self._store, None
        if store is not None:
            # Closed on this loop: what the store started here (PostgreSQL's LISTEN task)
            # is stopped here.
            await store.close()
        await asyncio.to_thread(self._portal.stop)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
