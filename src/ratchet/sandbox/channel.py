"""The report channel: the runtime routes (:mod:`ratchet.sandbox.report_routes`) served by the
worker itself on a Unix socket that is bound into each of its sandboxes.

The worker serves it, not ``ratchet server``: a worker started alone (``ratchet worker``,
``app.launch()``) runs isolated runs the same way, the grants never leave the process
that spawned their sandboxes, and a report travels no network. One socket per worker,
started with its first sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Generator
from typing import Any

from ratchet.extras import require
from ratchet.sandbox.grants import Grants
from ratchet.store.base import Store

log = logging.getLogger("ratchet.sandbox")
# A report carries step outputs whole; past this, a sandbox's report is refused (413)
# rather than held in the worker's memory.
MAX_REPORT = 64 << 20


class ReportChannel:
    """The worker's report endpoint, for all its sandboxes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.grants = Grants()
        self.path = ""
        self._server: object | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._dir: str | None = None

    async def start(self) -> str:
        """Serve (once); the socket's path."""
        async with self._lock:
            if self._task is None:
                await self._serve()
            return self.path

    def _build(self) -> Any:
        """The uvicorn server of the channel, built off the event loop: importing FastAPI
        and uvicorn takes long enough on a busy machine to hold up the loop's lease
        renewals past their TTL."""
        require("the isolated tier's report channel", "server")
        import uvicorn
        from fastapi import FastAPI

        from ratchet.sandbox import report_routes
        from ratchet.web import errors
        from ratchet.web.limits import BodyLimit

        class _Server(uvicorn.Server):
            # The worker's process owns its signals (SIGTERM hands runs back); the
            # channel must not take them over.
            @contextlib.contextmanager
            def capture_signals(self) -> Generator[None, None, None]:
                yield

        api = FastAPI(title="Ratchet runtime", openapi_url=None, docs_url=None, redoc_url=None)
        api.state.store = self.store
        api.state.grants = self.grants
        errors.install(api)
        api.include_router(report_routes.router)
        api.add_middleware(BodyLimit, limit=MAX_REPORT)
        self._dir = tempfile.mkdtemp(prefix="ratchet-report-")
        self.path = os.path.join(self._dir, "report.sock")
        return _Server(
            uvicorn.Config(
                api, uds=self.path, log_level="warning", lifespan="off", access_log=False
            )
        )

    async def _serve(self) -> None:
        server = await asyncio.to_thread(self._build)
        self._server = server
        self._task = asyncio.create_task(server.serve(), name="ratchet-report-channel")
        while not server.started:
            if self._task.done():
                self._task.result()  # the serving error, raised here
                raise RuntimeError("the report channel stopped before it started")
            await asyncio.sleep(0.01)
        log.info("action=report_channel_started path=%s", self.path)

    async def close(self) -> None:
        if self._task is not None:
            server = self._server
            if server is not None:
                server.should_exit = True  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
