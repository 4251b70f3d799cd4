"""The ASGI app of ``ratchet server``: the API's routes (:mod:`ratchet.api`) and the
dashboard's pages (:mod:`ratchet.ui`) over one Ratchet app's store, and the embedded
workers that drive its runs in the same process (none for an API-only node). It sits above
both: the dashboard builds on the API's auth and views, and the API knows nothing of it.
Needs the server extra."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from ratchet.extras import require

require("ratchet server", "server")

from fastapi import FastAPI  # noqa: E402
from fastapi.staticfiles import StaticFiles  # noqa: E402

from ratchet import __version__  # noqa: E402
from ratchet.api import (  # noqa: E402
    admin,
    events,
    forks,
    queues,
    receipts,
    replay,
    runs,
    schedules,
    tokens,
)
from ratchet.api.metrics import Metrics  # noqa: E402
from ratchet.api.readiness import READY_TIMEOUT_S, Readiness  # noqa: E402
from ratchet.api.tails import Tails  # noqa: E402
from ratchet.api.token_watch import TOKEN_CHECK_S, TokenWatch  # noqa: E402
from ratchet.app import Ratchet  # noqa: E402
from ratchet.ui import pages  # noqa: E402
from ratchet.ui import queues as queues_page  # noqa: E402
from ratchet.web import errors  # noqa: E402
from ratchet.web.limits import MAX_BODY, BodyLimit, PlainTarget  # noqa: E402

log = logging.getLogger("ratchet.api")
HEARTBEAT_S = 15.0
PRUNE_INTERVAL_S = 3600.0


async def _prune_every(
    ratchet: Ratchet, finished_before: float, interval: float, stop: asyncio.Event
) -> None:
    """Prune at start and then every ``interval`` until ``stop``; a failed pass is logged
    and the next one tries again (a prune interrupted midway is finished by the next)."""
    while not stop.is_set():
        try:
            await ratchet.prune_async(finished_before)
        except Exception as e:
            log.warning("action=prune_failed error=%s: %s", type(e).__name__, e)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


def _embedded(
    i: int, workers: int, concurrency: int, options: dict[str, Any] | None
) -> dict[str, Any]:
    """The options of embedded worker ``i`` of ``workers``: each its own worker id, since
    two live workers under one id are refused (a stable id given gets ``-<i>`` suffixes)."""
    options = {"concurrency": concurrency, **(options or {})}
    given = options.get("worker_id") or os.environ.get("RATCHET_WORKER_ID")
    if given and workers > 1:
        options["worker_id"] = f"{given}-{i}"
    return options


def create_app(
    ratchet: Ratchet,
    *,
    workers: int = 0,
    concurrency: int = 16,
    heartbeat_s: float = HEARTBEAT_S,
    max_body: int = MAX_BODY,
    live_poll_s: float = pages.LIVE_POLL_S,
    worker_options: dict[str, Any] | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    prune_finished_before: float | None = None,
    prune_interval: float = PRUNE_INTERVAL_S,
    token_check_s: float = TOKEN_CHECK_S,
) -> FastAPI:
    """The API for ``ratchet``'s workflows, with ``workers`` embedded workers, and the
    dashboard (``live_poll_s``: how often its live runs list looks for changes). With
    ``prune_finished_before`` (seconds), every ``prune_interval`` seconds the journals of
    runs that finished longer ago than that are pruned (their receipts stay). Open event
    streams end within ``token_check_s`` of their token's revocation, and at its expiry."""

    @contextlib.asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        # Opened off this loop (the app's own), then used and closed on it: what the store
        # starts on first use here (PostgreSQL's listener) lives on the serving loop.
        store = await asyncio.to_thread(lambda: ratchet.store)
        api.state.store = store
        api.state.tails = Tails(store, events.frame)
        api.state.readiness = Readiness(store, ready_timeout_s)
        api.state.token_watch = TokenWatch(store, token_check_s)
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(
                ratchet.worker(**_embedded(i, workers, concurrency, worker_options)).run(stop),
                name=f"ratchet-embedded-worker-{i}",
            )
            for i in range(workers)
        ]
        pruning = (
            None
            if prune_finished_before is None
            else asyncio.create_task(
                _prune_every(ratchet, prune_finished_before, prune_interval, stop),
                name="ratchet-prune",
            )
        )
        log.info(
            "action=server_ready workers=%d workflows=%s",
            workers,
            ",".join(sorted(ratchet.workflows)) or "-",
        )
        try:
            yield
        finally:
            stop.set()  # workers hand their runs back, as on a worker's SIGTERM
            if pruning is not None:
                # A prune can take minutes; stopped between two of its transactions, it is
                # finished by the next one.
                pruning.cancel()
                tasks.append(pruning)
            await asyncio.gather(*tasks, return_exceptions=True)
            await api.state.tails.close()
            await api.state.token_watch.close()
            api.state.readiness.close()
            await store.close()

    api = FastAPI(
        title="Ratchet",
        version=__version__,
        lifespan=lifespan,
        description="Durable runs of AI-agent workflows: start them, follow their "
        "journals live, signal, cancel and approve.",
    )
    api.state.ratchet = ratchet
    api.state.heartbeat_s = heartbeat_s
    api.state.live_poll_s = live_poll_s
    api.state.runs_probe = pages.RunsProbe()
    api.state.metrics = Metrics()
    errors.install(api)
    api.include_router(runs.router)
    api.include_router(forks.router)
    api.include_router(replay.router)
    api.include_router(events.router)
    api.include_router(receipts.router)
    api.include_router(admin.v1)
    api.include_router(queues.router)
    api.include_router(tokens.router)
    api.include_router(schedules.router)
    api.include_router(admin.router)
    api.include_router(runs.last)
    # The dashboard: its pages, and its scripts and stylesheet from the package.
    api.include_router(pages.router)
    api.include_router(queues_page.router)
    api.mount("/ui/static", StaticFiles(directory=pages.HERE / "static"), name="ui-static")
    api.add_middleware(BodyLimit, limit=max_body)
    api.add_middleware(PlainTarget)
    return api


def drain(api: FastAPI) -> None:
    """Call on the serving loop as the server starts to stop, before it waits for open
    requests: the event streams end at once (see :meth:`Tails.drain`)."""
    tails: Tails | None = getattr(api.state, "tails", None)
    if tails is not None:
        tails.drain()
