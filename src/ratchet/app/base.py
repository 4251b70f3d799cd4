"""The state every part of the application object shares: its database, its loop, its
definitions and its signing key."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ratchet.config import DatabaseURL, data_dir, database_url_from_env
from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.portal import Portal
from ratchet.engine.schedules import ScheduleSpec
from ratchet.engine.versions import WorkflowRegistry
from ratchet.errors import InvalidInput, UnknownWorkflow
from ratchet.extras import require
from ratchet.model import RunStatus
from ratchet.names import MAX_WORKFLOW, check_length, check_tags
from ratchet.receipts.keys import Signer, load_signer
from ratchet.store import Clock, Store, make_store
from ratchet.store.queues import QueueLimits

UNSET: Any = object()  # "not given", where None is a value (a JSON null)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop of this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def check_status(status: str | None) -> None:
    """Refuse a run status filter that names no status."""
    if status is not None and status not in RunStatus.__members__.values():
        raise InvalidInput(
            f"unknown status {status!r}: expected one of {', '.join(s.value for s in RunStatus)}"
        )


def check_filters(workflow: str | None, tags: Mapping[str, str] | None) -> None:
    """Refuse a workflow or tag filter no run could match, naming it."""
    if workflow is not None:
        if not isinstance(workflow, str) or "\x00" in workflow:
            raise InvalidInput(f"invalid workflow filter {workflow!r}: expected a name")
        check_length(workflow, "workflow filter", MAX_WORKFLOW)
    if tags is not None:
        try:
            check_tags(tags)
        except InvalidInput as e:
            e.field = "tags"
            raise


class AppBase:
    """The application's state; :class:`ratchet.Ratchet` adds its calls on top of it."""

    def __init__(
        self,
        database_url: str | None = None,
        *,
        lease_ttl: float | None = None,
        recovery_interval: float | None = None,
        clock: Clock | None = None,
        read_only: bool = False,
    ) -> None:
        self.database_url = database_url or database_url_from_env()
        if DatabaseURL.parse(self.database_url).scheme == "postgresql":
            # Here rather than at first use: a missing extra is a setup error, best told
            # where the app is made.
            require("a postgresql:// database", "postgres")
        self.read_only = read_only
        self.lease_ttl = lease_ttl
        self.recovery_interval = recovery_interval
        self.clock = clock or Clock()
        # By name, the newest version; name@version, that one (see ratchet.engine.versions).
        self.workflows = WorkflowRegistry()
        self.tools: dict[str, Any] = {}  # name -> the @app.tool callable
        # Schedules declared with @app.schedule, by name (see ratchet.app.scheduling).
        self.schedule_specs: dict[str, ScheduleSpec] = {}
        # The wall clock schedules are read by (epoch seconds); tests set it to simulate
        # downtime without sleeping through it.
        self.wall_clock: Callable[[], float] = time.time
        # The store this app wrote its declared schedules to, once (see app.scheduling).
        self._schedules_declared: Store | None = None
        self.graphs: dict[str, str] = {}  # graph name -> the version app.graph registered
        self._graph_defs: dict[str, WorkflowDef] = {}  # the interpreter, per graph name
        self._llm_clients: dict[str, Any] = {}  # provider -> wrapped client, for ai-steps
        self._store: Store | None = None
        self._store_lock = threading.Lock()
        self._portal = Portal()
        self._embedded: tuple[asyncio.Event, Any] | None = None
        self._signer: Signer | None = None
        self._queues: dict[str, QueueLimits] = {}  # app.queue's declarations, by name

    @property
    def store(self) -> Store:
        """The opened store (opened on first use, migrations applied)."""
        with self._store_lock:
            if self._store is None:
                # The queues first: a bad RATCHET_QUEUES is refused before anything opens.
                declared = [] if self.read_only else self._declared_queues()
                store = make_store(self.database_url, self.clock, read_only=self.read_only)
                self._portal.call(store.open())
                self._store = store
                if declared:
                    self._portal.call(store.declare_queues(declared))
            return self._store

    @property
    def portal(self) -> Portal:
        """The app's own event loop, on a thread of its own, for blocking code:
        ``app.portal.call(coro)`` runs a coroutine there and returns its result (the
        blocking client calls are built on it). Not for code already on that loop
        (a step, a workflow): it awaits instead."""
        return self._portal

    def _declared_queues(self) -> list[QueueLimits]:
        """The queues to write when the store opens (see ratchet.app.queues)."""
        return []

    async def _astore(self) -> Store:
        if self._store is not None:
            return self._store
        return await asyncio.to_thread(lambda: self.store)

    def _resolve(self, wf: WorkflowDef | str) -> WorkflowDef:
        if isinstance(wf, WorkflowDef):
            return wf
        if isinstance(wf, str):
            return self.workflows.resolve(wf)
        known = ", ".join(sorted(self.workflows)) or "none"
        raise UnknownWorkflow(f"unknown workflow {wf!r}; registered workflows: {known}")

    @property
    def signer(self) -> Signer:
        """The key that signs run receipts: ``RATCHET_SIGNING_KEY`` (a PEM file), else
        ``signing_key.pem`` in the data directory, made there the first time."""
        if self._signer is None:
            self._signer = load_signer(data_dir(self.database_url))
        return self._signer
