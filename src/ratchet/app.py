"""The application object: decorators, the client calls, and embedded workers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast, overload

from ratchet.config import DatabaseURL, data_dir, database_url_from_env, private_paths
from ratchet.engine import faults
from ratchet.engine.context import workflow_run
from ratchet.engine.definitions import StepDef, StepKey, WorkflowDef, check_name, to_json
from ratchet.engine.guards import DEFAULT as DEFAULT_GUARDS
from ratchet.engine.guards import Guards, check_grant, check_overrides
from ratchet.engine.portal import Portal
from ratchet.engine.retention import DEFAULT_STATUSES, PruneReport, prune
from ratchet.engine.retry import Retry, as_policy
from ratchet.engine.starts import RunRequest, as_start, at_item
from ratchet.engine.worker import Worker
from ratchet.errors import (
    InvalidInput,
    RatchetError,
    ResultTimeout,
    RunCancelled,
    RunFailed,
    RunIdConflict,
    RunTimeout,
    UnknownRun,
    UnknownWorkflow,
)
from ratchet.extras import require
from ratchet.model import (
    Approval,
    DeadLetter,
    Decision,
    DeliveryReceipt,
    Event,
    LLMTotals,
    NewRun,
    RunRecord,
    RunStatus,
)
from ratchet.names import (
    MAX_COMMENT,
    MAX_DECIDER,
    MAX_QUEUE,
    MAX_SIGNAL,
    MAX_STEP,
    MAX_WORKFLOW,
    check_length,
    check_step_name,
)
from ratchet.receipts.keys import Signer, load_signer
from ratchet.receipts.service import ensure_receipt
from ratchet.sandbox.spec import Sandbox, check_tier
from ratchet.store import Clock, Store, WorkerInfo, make_store, tenants
from ratchet.store.base import DONE
from ratchet.store.sandboxes import SandboxRecord
from ratchet.store.tenants import DEFAULT_TENANT

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_UNSET: Any = object()  # "not given", where None is a value (a JSON null)
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")
# Priorities are 32-bit signed integers on both backends (PostgreSQL's integer column).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _check_status(status: str | None) -> None:
    if status is not None and status not in RunStatus.__members__.values():
        raise InvalidInput(
            f"unknown status {status!r}: expected one of {', '.join(s.value for s in RunStatus)}"
        )


class Ratchet:
    """A Ratchet application: its workflows, its steps and its database.

    ``database_url`` defaults to ``RATCHET_DATABASE_URL``, else
    ``sqlite:///.ratchet/ratchet.db``. A malformed URL is refused here, before anything
    is opened. ``read_only=True`` only reads: a missing database is an error instead of
    being created, and a SQLite file is opened read-only.
    """

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
        self.workflows: dict[str, WorkflowDef] = {}
        self.tools: dict[str, Any] = {}  # name -> the @app.tool callable
        self.graphs: dict[str, str] = {}  # graph name -> the version app.graph registered
        self._graph_defs: dict[str, WorkflowDef] = {}  # the interpreter, per graph name
        self._llm_clients: dict[str, Any] = {}  # provider -> wrapped client, for ai-steps
        self._store: Store | None = None
        self._store_lock = threading.Lock()
        self._portal = Portal()
        self._embedded: tuple[asyncio.Event, Any] | None = None
        self._signer: Signer | None = None

    # -- definitions -----------------------------------------------------------------------

    @overload
    def workflow(self, fn: Callable[..., Any], /) -> WorkflowDef: ...
    @overload
    def workflow(
        self,
        name: str | None = None,
        version: str = "1",
        *,
        guards: Guards | None = None,
        tier: str = "process",
        sandbox: Sandbox | None = None,
        timeout_s: float | None = None,
    ) -> Callable[[Callable[..., Any]], WorkflowDef]: ...

    def workflow(
        self,
        name: Any = None,
        version: str = "1",
        *,
        guards: Guards | None = None,
        tier: str = "process",
        sandbox: Sandbox | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Declare an ``async def`` workflow, as ``@app.workflow`` or ``@app.workflow(...)``.
        Its name (default: the function's) and version are stored with each run; a worker
        drives runs of the workflows it has. ``guards`` are its :class:`ratchet.Guards`
        (default: ``ratchet.Guards()``). ``timeout_s`` is each run's deadline, in seconds
        from its first start (``Guards.timeout_s``): past it the run fails with
        :class:`RunTimeout`, also while parked. ``tier="isolated"`` runs each attempt in a
        sandbox of its own (``sandbox=ratchet.Sandbox(...)``; see ratchet.sandbox)."""
        fn = None
        if callable(name):  # used bare: @app.workflow
            fn, name = name, None
        if name is not None and not isinstance(name, str):
            raise InvalidInput(f"invalid workflow name {name!r}: expected a string")
        if guards is not None and not isinstance(guards, Guards):
            raise InvalidInput(f"guards must be a ratchet.Guards, got {guards!r}")
        if timeout_s is not None:
            guards = (guards or DEFAULT_GUARDS).override({"timeout_s": timeout_s})

        def decorate(fn: Callable[..., Any]) -> WorkflowDef:
            wf_name = name or fn.__name__
            wd = WorkflowDef(fn, wf_name, str(version), guards, check_tier(tier, sandbox, wf_name))
            if wd.name in self.workflows and self.workflows[wd.name].fn is not fn:
                raise InvalidInput(f"workflow {wd.name!r} is already registered")
            self.workflows[wd.name] = wd
            return wd

        return decorate(fn) if fn is not None else decorate

    @overload
    def step(self, fn: F, /) -> F: ...
    @overload
    def step(
        self,
        *,
        name: str | None = None,
        retry: Retry | Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        journal_args: bool = True,
    ) -> Callable[[F], F]: ...

    def step(  # type: ignore[misc]
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        retry: Retry | Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        journal_args: bool = True,
    ) -> Any:
        """Declare a step (``async def`` or plain ``def``, which runs in a thread). Inside a
        workflow each call is journaled and, once completed, never runs again for that run.
        Outside a workflow (or inside another step) it is a plain call. Its arguments are
        journaled with each attempt's ``step_started`` (bounded), unless
        ``journal_args=False``: for arguments that must not be stored."""
        policy = as_policy(retry)

        def decorate(fn: F) -> F:
            step_name = name or fn.__name__
            if isinstance(step_name, str):
                check_step_name(step_name, "step")
            sd = StepDef(fn, step_name, policy, timeout_s, journal_args=journal_args)

            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> Any:
                ctx = workflow_run()
                if ctx is None:
                    return fn(*args, **kwargs)
                return ctx.call_step(sd, args, kwargs)

            call.__ratchet_step__ = sd  # type: ignore[attr-defined]
            return call  # type: ignore[return-value]

        return decorate(fn) if fn is not None else decorate

    def tool(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        risk: str = "low",
        timeout_s: float | None = None,
        retry: Retry | Mapping[str, Any] | None = None,
        idempotency_key: Callable[[StepKey], str] | None = None,
        description: str | None = None,
        requires_approval: bool = False,
        journal_args: bool = True,
    ) -> Any:
        """Declare a tool: a step a model may call (``ratchet.Agent``), with a JSON schema
        from its type hints and a ``tool_called`` event (name, arguments, ``risk``: low,
        medium, high or critical) before each attempt. ``idempotency_key`` (a function of
        ``c.run_id``, ``c.step_id``, ``c.attempt``) replaces the step's default key. A
        ``critical`` tool, or one with ``requires_approval=True``, parks for a person's
        approval (named after the tool, its data the arguments) before it runs in a
        workflow; a rejection fails the call with :class:`ApprovalRejected`.
        ``journal_args=False`` keeps its arguments out of ``tool_called`` and
        ``step_started`` (an approval's data still shows them to the approver)."""
        from ratchet.llm.tools import make_tool

        policy = as_policy(retry)

        def decorate(fn: F) -> F:
            call = make_tool(
                fn,
                name,
                risk=risk,
                timeout_s=timeout_s,
                retry=policy,
                idempotency_key=idempotency_key,
                description=description,
                requires_approval=requires_approval,
                journal_args=journal_args,
            )
            self.tools[call.tool.name] = call
            return cast(F, call)

        return decorate(fn) if fn is not None else decorate

    # -- graphs ----------------------------------------------------------------------------

    def graph(self, source: Any) -> str:
        """Validate a graph (a YAML or JSON file, or its document as a mapping) against
        this app's tools and workflows, and register it by content; return its version.
        Every problem is listed in one :class:`GraphInvalid` and nothing is written then.
        Registering the same content again is a no-op; an edited file is a new version,
        and runs already started keep theirs."""
        return self._portal.call(self.graph_async(source))

    async def graph_async(self, source: Any) -> str:
        """:meth:`graph` without blocking the running event loop."""
        from ratchet.graphs.validate import load

        graph = load(source, tools=self.tools, workflows=self.workflows)
        if graph.name in self.workflows:
            raise InvalidInput(
                f"graph {graph.name!r}: the app has a code workflow of that "
                "name; rename one of them"
            )
        stored = await (await self._astore()).register_graph(
            graph.name, graph.version, graph.definition
        )
        self.graphs[graph.name] = stored.version
        return stored.version

    def llm_client(self, client: Any) -> None:
        """The ``openai.AsyncOpenAI`` or ``anthropic.AsyncAnthropic`` client graph ai-steps
        use for its provider (wrapped here if it is not already)."""
        from ratchet.llm.wrap import DurableClient, wrap

        durable = client if isinstance(client, DurableClient) else wrap(client)
        self._llm_clients[durable.provider] = durable

    def llm_client_for(self, provider: str) -> Any:
        """The client for ``provider`` (:meth:`llm_client`), else the SDK's default client
        from its own environment variables, wrapped."""
        client = self._llm_clients.get(provider)
        if client is None:
            from ratchet.llm.wrap import default_client

            client = self._llm_clients[provider] = default_client(provider)
        return client

    def graph_interpreter(self, name: str) -> WorkflowDef:
        """The workflow a worker of this app drives a run of graph ``name`` with: the
        interpreter, made once per name (each run loads the graph version it is pinned to)."""
        wd = self._graph_defs.get(name)
        if wd is None:
            from ratchet.graphs.registry import graph_workflow

            wd = self._graph_defs[name] = graph_workflow(self, name, "graph")
        return wd

    # -- the store -------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The opened store (opened on first use, migrations applied)."""
        with self._store_lock:
            if self._store is None:
                store = make_store(self.database_url, self.clock, read_only=self.read_only)
                self._portal.call(store.open())
                self._store = store
            return self._store

    @property
    def portal(self) -> Portal:
        """The app's own event loop, on a thread of its own, for blocking code:
        ``app.portal.call(coro)`` runs a coroutine there and returns its result (the
        blocking client calls are built on it). Not for code already on that loop
        (a step, a workflow): it awaits instead."""
        return self._portal

    async def _astore(self) -> Store:
        if self._store is not None:
            return self._store
        return await asyncio.to_thread(lambda: self.store)

    def _resolve(self, wf: WorkflowDef | str) -> WorkflowDef:
        if isinstance(wf, WorkflowDef):
            return wf
        if isinstance(wf, str) and wf in self.workflows:
            return self.workflows[wf]
        known = ", ".join(sorted(self.workflows)) or "none"
        raise UnknownWorkflow(f"unknown workflow {wf!r}; registered workflows: {known}")

    # -- client calls (async) --------------------------------------------------------------

    async def start_async(
        self,
        wf: WorkflowDef | str,
        /,
        *args: Any,
        run_id: str | None = None,
        queue: str = "default",
        priority: int = 0,
        guards: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> str:
        """Queue a run and return its id at once; nothing executes in the caller. With an
        explicit ``run_id`` the call is idempotent: the existing run's id comes back.
        ``guards`` overrides some of the workflow's guard fields for this run (their JSON
        form: ``{"max_steps": 5000, "actions": {"runaway_loop": "pause"}}``); ``timeout_s``
        is the run's deadline (the guard field of that name), in seconds from its start."""
        if timeout_s is not None:
            guards = {**(guards or {}), "timeout_s": timeout_s}
        rec, _ = await self.start_run_async(
            wf, args, kwargs, run_id=run_id, queue=queue, priority=priority, guards=guards
        )
        return rec.run_id

    async def start_run_async(
        self,
        wf: WorkflowDef | str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        run_id: str | None = None,
        queue: str = "default",
        priority: int = 0,
        tenant: str | None = None,
        guards: Mapping[str, Any] | None = None,
    ) -> tuple[RunRecord, bool]:
        """:meth:`start_async` for callers that need the record and whether it was created,
        its arguments given as a sequence and a mapping. With ``tenant`` (the HTTP API),
        ``run_id`` is that tenant's id (see :mod:`ratchet.store.tenants`; the record
        carries the engine's), and a conflict with an existing run names the fields that
        differ without quoting the stored values."""
        new, graph = await self._new_run(
            RunRequest(wf, tuple(args), kwargs, run_id, queue, priority, guards),
            tenant or DEFAULT_TENANT,
        )
        store = await self._astore()
        redact = tenant is not None
        if redact:
            assert tenant is not None
            [internal] = await tenants.internal_ids(store, tenant, [new.run_id])
            new = dataclasses.replace(new, run_id=internal)
        rec, created = await store.create_run(new, redact=redact)
        if (
            not created
            and graph
            and (rec.workflow, rec.workflow_version) != (new.workflow, new.workflow_version)
        ):
            raise RunIdConflict(
                f"run id {rec.run_id!r} already belongs to another version of the graph"
                if redact
                else f"run id {rec.run_id!r} already belongs to workflow "
                f"{rec.workflow!r} {rec.workflow_version}"
            )
        return rec, created

    async def start_runs_async(
        self, requests: Sequence[RunRequest], *, tenant: str | None = None
    ) -> list[tuple[str, RunStatus, bool]]:
        """Start many runs in one transaction: ``(run_id, status, created)`` per request,
        in order. Every request is checked first; a bad one raises
        :class:`BatchItemInvalid` naming its index and field, and nothing is written. With
        ``tenant`` (the HTTP API's batch start), as in :meth:`start_run_async`."""
        news = []
        for i, request in enumerate(requests):
            with at_item(i):
                news.append((await self._new_run(request, tenant or DEFAULT_TENANT))[0])
        if not news:
            return []
        store = await self._astore()
        if tenant is None:
            return await store.create_runs(news)
        internal = await tenants.internal_ids(store, tenant, [n.run_id for n in news])
        news = [dataclasses.replace(n, run_id=i) for n, i in zip(news, internal, strict=True)]
        return await store.create_runs(news, redact=True)

    async def _new_run(self, r: RunRequest, tenant: str) -> tuple[NewRun, bool]:
        """The run to create for ``r``, every argument checked (an :class:`InvalidInput`
        tagged with the field at fault), and whether it is a graph's run."""
        # One try for every check, naming the field being checked as it goes: a batch
        # start checks thousands of items, and a context manager per check costs more
        # than the checks themselves.
        field = "guards"
        try:
            overrides = check_overrides(r.guards) if r.guards is not None else None
            run_id, queue, priority = r.run_id, r.queue, r.priority
            field = "run_id"
            if run_id is not None and (
                not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id)
            ):
                raise InvalidInput(
                    f"invalid run id {run_id!r}: use 1-200 characters of "
                    "letters, digits and . _ : @ -, starting with a letter "
                    "or digit"
                )
            field = "queue"
            check_length(check_name(queue, "queue"), "queue", MAX_QUEUE)
            field = "priority"
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise InvalidInput(f"invalid priority {priority!r}: expected an integer")
            if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
                raise InvalidInput(
                    f"invalid priority {priority}: expected an integer from "
                    f"{PRIORITY_MIN} to {PRIORITY_MAX} (32-bit signed)"
                )
            wf = r.workflow
            field = "workflow"
            check_length(wf, "workflow name", MAX_WORKFLOW)
            if isinstance(wf, str) and wf not in self.workflows:
                from ratchet.graphs.start import new_graph_run

                field = "input"
                try:
                    new = await new_graph_run(
                        await self._astore(),
                        wf,
                        r.args,
                        dict(r.kwargs),
                        run_id or uuid.uuid4().hex,
                        queue,
                        priority,
                        known=self.workflows,
                    )
                except UnknownWorkflow:
                    field = "workflow"
                    raise
                return dataclasses.replace(new, tenant_id=tenant, guards=overrides), True
            field = "workflow"
            wd = self._resolve(wf)
            field = "input"
            data = wd.bind(r.args, dict(r.kwargs))
        except InvalidInput as e:
            if e.field is None:
                e.field = field
            raise
        return NewRun(
            run_id or uuid.uuid4().hex,
            wd.name,
            wd.version,
            data,
            queue,
            priority,
            tenant_id=tenant,
            guards=overrides,
        ), False

    async def start_many_async(
        self,
        wf: WorkflowDef | str,
        items: Iterable[Any],
        /,
        *,
        queue: str = "default",
        priority: int = 0,
        guards: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """Queue many runs of ``wf`` at once and return their ids, in order: one
        transaction and one wake-up for the whole batch. Each item is a
        :class:`ratchet.Start` (arguments, and optionally its own ``run_id``, ``queue``,
        ``priority``, ``guards``), a mapping of keyword arguments, or a tuple of positional
        arguments; ``queue``, ``priority`` and ``guards`` are the defaults. Each item
        behaves as :meth:`start_async` would (an explicit ``run_id`` is idempotent); a bad
        item raises :class:`BatchItemInvalid` naming its index, and nothing is written."""
        requests = []
        for i, item in enumerate(items):
            start = as_start(item, i)
            requests.append(
                RunRequest(
                    wf,
                    start.args,
                    start.kwargs,
                    start.run_id,
                    queue if start.queue is None else start.queue,
                    priority if start.priority is None else start.priority,
                    guards if start.guards is None else start.guards,
                )
            )
        return [run_id for run_id, _, _ in await self.start_runs_async(requests)]

    async def get_async(self, run_id: str) -> RunRecord:
        """The run's record, or :class:`UnknownRun`."""
        rec = await (await self._astore()).get_run(run_id)
        if rec is None:
            raise UnknownRun(f"unknown run id {run_id!r}")
        return rec

    async def result_async(self, run_id: str, timeout_s: float | None = None) -> Any:
        """Wait for the run to finish; return its result, or raise RunFailed/RunCancelled."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        store = await self._astore()
        while True:
            with store.watching(DONE, run_id) as finished:
                rec = await self.get_async(run_id)
                if not rec.status.terminal:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise ResultTimeout(
                            f"run {run_id} is still {rec.status} after {timeout_s:g}s"
                        )
                    # Woken when the run finishes, wherever its worker is; the timeout is
                    # a backstop for a notification lost with a dropped connection.
                    wait = 5.0 if deadline is None else min(5.0, deadline - time.monotonic())
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(finished.wait(), max(wait, 0))
                    continue
            if rec.status == RunStatus.SUCCEEDED:
                wd = self.workflows.get(rec.workflow)
                return wd.revive(rec.output) if wd else rec.output
            if rec.status == RunStatus.FAILED:
                cls = RunTimeout if (rec.error or "").startswith("RunTimeout:") else RunFailed
                raise cls(f"run {run_id} failed: {rec.error}")
            raise RunCancelled(f"run {run_id} was cancelled")

    async def signal_async(self, run_id: str, name: str, data: Any = None) -> None:
        """Send signal ``name`` with ``data``; a run waiting for it wakes up and gets it
        as the type it waits for (``wait_for_signal(name, type=...)``). Stored in its JSON
        form: pydantic's for what json cannot write (a datetime, a dataclass)."""
        check_length(check_name(name, "signal name"), "signal name", MAX_SIGNAL)
        data = json.loads(to_json(data, f"the data of signal {name!r}"))
        await (await self._astore()).send_signal(run_id, name, data)

    async def approve_async(
        self,
        run_id: str,
        step: str,
        *,
        by: str,
        comment: str | None = None,
        note: str | None = None,
        grant: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Approve the run's pending approval ``step`` (its step id, or its name when that
        picks one) as ``by``; the run wakes and ``ratchet.approval`` returns the decision.
        ``note``: a name given beside the decider, journaled with the decision (the HTTP
        API journals the deciding token's name as ``by`` and keeps the body's ``by`` so).
        A decision is recorded once: a second one raises :class:`ApprovalAlreadyDecided`
        (naming who decided what and when), and an approval of a finished run, or timed
        out, :class:`ApprovalNotPending`; nothing is written then.

        On a guard's pause of a limit (``guard:budget_exceeded``, ``guard:excessive_steps``)
        the approval says how far the run may go over: ``grant`` moves limits to new values
        (``{"budget_tokens": 5000}``; the fields of :data:`ratchet.engine.guards.LIMITS`,
        null for off). Without it, a budget rises to what the paused call needed (the next
        call over it pauses again) and ``max_steps`` is lifted. The grant is journaled with
        the decision (``approval_decided``: who, and the grant)."""
        return await self._decide(run_id, step, True, by, comment, note, grant)

    async def reject_async(
        self,
        run_id: str,
        step: str,
        *,
        by: str,
        comment: str | None = None,
        note: str | None = None,
    ) -> Decision:
        """Reject the run's pending approval ``step``; see :meth:`approve_async`."""
        return await self._decide(run_id, step, False, by, comment, note)

    async def _decide(
        self,
        run_id: str,
        step: str,
        approved: bool,
        by: str,
        comment: str | None,
        note: str | None = None,
        grant: Mapping[str, Any] | None = None,
    ) -> Decision:
        check_name(run_id, "run id")
        check_length(check_name(step, "approval step"), "approval step", MAX_STEP)
        check_length(check_name(by, "decider (by)"), "decider (by)", MAX_DECIDER)
        if comment is not None:
            check_length(check_name(comment, "comment"), "comment", MAX_COMMENT)
        if note is not None:
            check_length(check_name(note, "note"), "note", MAX_DECIDER)
        granted = check_grant(grant) if grant is not None else None
        found = await (await self._astore()).decide_approval(
            run_id, step, approved, by, comment, note, granted
        )
        assert found.decision is not None
        return found.decision

    async def approvals_async(self, run_id: str | None = None, limit: int = 100) -> list[Approval]:
        """Pending approvals of unfinished runs, oldest first: run, step, name, data, when
        asked, and the top-level run (``root_run_id``; a child run's approval carries its
        parent's). With ``run_id``, only that run's and those of the runs under it."""
        if run_id is not None:
            check_name(run_id, "run id")
        return await (await self._astore()).pending_approvals(run_id, limit)

    async def cancel_async(self, run_id: str, *, by: str | None = None) -> RunStatus:
        """Cancel a run; returns its status after the request (a running run is cancelled
        by its worker at its next lease renewal). ``by``, who asked, is journaled when the
        run is cancelled here and now (queued or waiting)."""
        if by is not None:
            check_name(by, "cancelled by (by)")
        return await (await self._astore()).cancel(run_id, by)

    async def retry_async(
        self, run_id: str, *, grant: Mapping[str, Any] | None = None, by: str | None = None
    ) -> RunRecord:
        """Re-queue a dead-lettered run; it resumes after its last completed step. It keeps
        its limits: a budget it crossed stops it again at the next call over it. ``grant``
        moves limits for the rest of the run (``{"budget_tokens": 5000}``, the fields of
        :data:`ratchet.engine.guards.LIMITS`, null for off) and needs ``by``, who granted
        it; both are journaled in the run's ``run_queued`` event."""
        check_name(run_id, "run id")
        granted = check_grant(grant) if grant is not None else None
        if by is not None:
            check_name(by, "retried by (by)")
        elif granted is not None:
            raise InvalidInput("a grant needs by=: who let the run go over its limits")
        return await (await self._astore()).retry_dead(run_id, granted, by)

    async def receipts_async(self, run_id: str) -> list[DeliveryReceipt]:
        """The run's delivery receipts: key, step, delivery, status, response, times."""
        await self.get_async(run_id)
        return await (await self._astore()).receipts(run_id)

    async def settle_receipt_async(
        self, key: str, *, response: Any = _UNSET, failed: bool = False
    ) -> DeliveryReceipt:
        """Resolve a receipt left ``claimed`` by hand, once a person knows what happened:
        ``response=`` what the receiver answered (the step then returns it, without
        dispatching), or ``failed=True``: it did not happen (the step's ``deliver`` then
        raises :class:`DeliveryFailed`). A dead-lettered run goes on after ``retry``."""
        if not isinstance(key, str) or not key:
            raise InvalidInput(f"invalid receipt key {key!r}")
        if not isinstance(failed, bool):
            raise InvalidInput(f"failed must be True or False, got {failed!r}")
        if failed == (response is not _UNSET):
            raise InvalidInput(
                "settle a receipt with either response=... (what the receiver "
                "answered) or failed=True (it did not happen), not "
                + ("both" if failed else "neither")
            )
        if not failed:
            response = json.loads(to_json(response, f"the response for receipt {key}"))
        return await (await self._astore()).resolve_receipt(
            key, None if failed else response, failed
        )

    @property
    def signer(self) -> Signer:
        """The key that signs run receipts: ``RATCHET_SIGNING_KEY`` (a PEM file), else
        ``signing_key.pem`` in the data directory, made there the first time."""
        if self._signer is None:
            self._signer = load_signer(data_dir(self.database_url))
        return self._signer

    async def run_receipt_async(self, run_id: str) -> dict[str, Any]:
        """The finished run's signed receipt (a DSSE envelope), signed now if it has none
        over its whole journal. Not to be confused with :meth:`receipts_async`, the
        delivery receipts of its side effects."""
        return (await ensure_receipt(await self._astore(), self.signer, run_id)).envelope

    async def prune_async(
        self,
        finished_before_s: float,
        *,
        statuses: Sequence[str] = DEFAULT_STATUSES,
        dry_run: bool = False,
    ) -> PruneReport:
        """Delete the journals (keeping the signed receipts) of runs that finished more than
        ``finished_before_s`` seconds ago, with one of ``statuses``."""
        if not isinstance(finished_before_s, int | float) or finished_before_s <= 0:
            raise InvalidInput(
                f"finished_before_s must be a positive number of seconds, got {finished_before_s!r}"
            )
        store = await self._astore()
        before = await store.now() - finished_before_s
        return await prune(store, self.signer, before, statuses, dry_run=dry_run)

    async def events_async(self, run_id: str, after: int = 0) -> list[Event]:
        """The run's journal after sequence number ``after``."""
        await self.get_async(run_id)
        return await (await self._astore()).load_events(run_id, after)

    async def runs_async(self, status: str | None = None, limit: int = 100) -> list[RunRecord]:
        """Runs, newest first, at most ``limit``, optionally only those with ``status``."""
        _check_status(status)
        return await (await self._astore()).list_runs(status, limit)

    async def sandboxes_async(
        self, run_id: str | None = None, limit: int = 100
    ) -> list[SandboxRecord]:
        """The sandboxes of an isolated run, by attempt (with ``run_id``), else the most
        recent ones of every run: status, times, exit code or signal, peak memory, and
        why each ended."""
        if run_id is not None:
            await self.get_async(run_id)
        return await (await self._astore()).list_sandboxes(run_id, limit)

    async def live_workers_async(self) -> list[WorkerInfo]:
        """The workers seen within their lease TTL, with the workflows and queues each
        serves."""
        return await (await self._astore()).live_workers()

    async def count_runs_async(self, status: str | None = None) -> int:
        """How many runs there are (with ``status``, if given)."""
        _check_status(status)
        return await (await self._astore()).count_runs(status)

    async def llm_totals_async(self, run_ids: list[str]) -> dict[str, LLMTotals]:
        """Each run's model calls, tokens and cost, summed from its journal."""
        return await (await self._astore()).llm_totals(run_ids)

    async def dead_letters_async(self, limit: int = 100) -> list[DeadLetter]:
        """Dead-lettered runs, newest first, at most ``limit``."""
        return await (await self._astore()).dead_letters(limit)

    async def count_dead_letters_async(self) -> int:
        """How many runs are dead-lettered."""
        return await (await self._astore()).count_dead_letters()

    # -- client calls (blocking) -----------------------------------------------------------

    def start(
        self,
        wf: WorkflowDef | str,
        /,
        *args: Any,
        run_id: str | None = None,
        queue: str = "default",
        priority: int = 0,
        guards: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> str:
        """Blocking :meth:`start_async`."""
        return self._portal.call(
            self.start_async(
                wf,
                *args,
                run_id=run_id,
                queue=queue,
                priority=priority,
                guards=guards,
                timeout_s=timeout_s,
                **kwargs,
            )
        )

    def start_many(
        self,
        wf: WorkflowDef | str,
        items: Iterable[Any],
        /,
        *,
        queue: str = "default",
        priority: int = 0,
        guards: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """Blocking :meth:`start_many_async`."""
        return self._portal.call(
            self.start_many_async(wf, items, queue=queue, priority=priority, guards=guards)
        )

    def get(self, run_id: str) -> RunRecord:
        """Blocking :meth:`get_async`."""
        return self._portal.call(self.get_async(run_id))

    def result(self, run_id: str, timeout_s: float | None = None) -> Any:
        """Blocking :meth:`result_async`."""
        return self._portal.call(self.result_async(run_id, timeout_s))

    def signal(self, run_id: str, name: str, data: Any = None) -> None:
        """Blocking :meth:`signal_async`."""
        self._portal.call(self.signal_async(run_id, name, data))

    def approve(
        self,
        run_id: str,
        step: str,
        *,
        by: str,
        comment: str | None = None,
        note: str | None = None,
        grant: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Blocking :meth:`approve_async`."""
        return self._portal.call(
            self.approve_async(run_id, step, by=by, comment=comment, note=note, grant=grant)
        )

    def reject(
        self,
        run_id: str,
        step: str,
        *,
        by: str,
        comment: str | None = None,
        note: str | None = None,
    ) -> Decision:
        """Blocking :meth:`reject_async`."""
        return self._portal.call(self.reject_async(run_id, step, by=by, comment=comment, note=note))

    def approvals(self, run_id: str | None = None, limit: int = 100) -> list[Approval]:
        """Blocking :meth:`approvals_async`."""
        return self._portal.call(self.approvals_async(run_id, limit))

    def cancel(self, run_id: str, *, by: str | None = None) -> RunStatus:
        """Blocking :meth:`cancel_async`."""
        return self._portal.call(self.cancel_async(run_id, by=by))

    def retry(
        self, run_id: str, *, grant: Mapping[str, Any] | None = None, by: str | None = None
    ) -> RunRecord:
        """Blocking :meth:`retry_async`."""
        return self._portal.call(self.retry_async(run_id, grant=grant, by=by))

    def events(self, run_id: str, after: int = 0) -> list[Event]:
        """Blocking :meth:`events_async`."""
        return self._portal.call(self.events_async(run_id, after))

    def runs(self, status: str | None = None, limit: int = 100) -> list[RunRecord]:
        """Blocking :meth:`runs_async`."""
        _check_status(status)
        return self._portal.call(self.runs_async(status, limit))

    def count_runs(self, status: str | None = None) -> int:
        """Blocking :meth:`count_runs_async`."""
        _check_status(status)
        return self._portal.call(self.count_runs_async(status))

    def llm_totals(self, run_ids: list[str]) -> dict[str, LLMTotals]:
        """Blocking :meth:`llm_totals_async`."""
        return self._portal.call(self.llm_totals_async(run_ids))

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Blocking :meth:`dead_letters_async`."""
        return self._portal.call(self.dead_letters_async(limit))

    def count_dead_letters(self) -> int:
        """Blocking :meth:`count_dead_letters_async`."""
        return self._portal.call(self.count_dead_letters_async())

    def receipts(self, run_id: str) -> list[DeliveryReceipt]:
        """Blocking :meth:`receipts_async`."""
        return self._portal.call(self.receipts_async(run_id))

    def run_receipt(self, run_id: str) -> dict[str, Any]:
        """Blocking :meth:`run_receipt_async`."""
        return self._portal.call(self.run_receipt_async(run_id))

    def prune(
        self,
        finished_before_s: float,
        *,
        statuses: Sequence[str] = DEFAULT_STATUSES,
        dry_run: bool = False,
    ) -> PruneReport:
        """Blocking :meth:`prune_async`."""
        return self._portal.call(
            self.prune_async(finished_before_s, statuses=statuses, dry_run=dry_run)
        )

    def sandboxes(self, run_id: str | None = None, limit: int = 100) -> list[SandboxRecord]:
        """Blocking :meth:`sandboxes_async`."""
        return self._portal.call(self.sandboxes_async(run_id, limit))

    def live_workers(self) -> list[WorkerInfo]:
        """Blocking :meth:`live_workers_async`."""
        return self._portal.call(self.live_workers_async())

    def settle_receipt(
        self, key: str, *, response: Any = _UNSET, failed: bool = False
    ) -> DeliveryReceipt:
        """Blocking :meth:`settle_receipt_async`."""
        return self._portal.call(self.settle_receipt_async(key, response=response, failed=failed))

    # -- workers ---------------------------------------------------------------------------

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
            options["serve_graphs"] or any(wd.sandbox is not None for wd in self.workflows.values())
        ):
            from ratchet.sandbox.on_demand import OnDemandRunner

            options["isolation"] = OnDemandRunner(
                self.store, signer=options["signer"], private=private_paths(self.database_url)
            )
        return Worker(self.store, AppWorkflows(self), **options)

    async def run_worker(self, stop: asyncio.Event | None = None, **options: Any) -> None:
        """Run a worker on the current event loop until ``stop`` is set."""
        await self._astore()
        await self.worker(**options).run(stop)

    async def _begin(self, worker: Worker) -> tuple[asyncio.Event, asyncio.Task[None]]:
        stop = asyncio.Event()
        task = asyncio.ensure_future(worker.run(stop))
        await worker.started.wait()
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
            if loop is not self._portal.current and _running_loop() is loop:
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

    def __enter__(self) -> Ratchet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
