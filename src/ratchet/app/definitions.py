"""Declaring what an application runs: workflows, steps, tools, graphs and model clients."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast, overload

from ratchet.app.base import AppBase
from ratchet.engine.context import workflow_run
from ratchet.engine.definitions import StepDef, StepKey, WorkflowDef
from ratchet.engine.guards import DEFAULT as DEFAULT_GUARDS
from ratchet.engine.guards import Guards
from ratchet.engine.retry import Retry, as_policy
from ratchet.engine.versions import check_workflow_name
from ratchet.errors import InvalidInput
from ratchet.names import check_step_name
from ratchet.sandbox.spec import Sandbox, check_tier

F = TypeVar("F", bound=Callable[..., Any])


class Definitions(AppBase):
    """The decorators and registrations of :class:`ratchet.Ratchet`."""

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
        request_drift: str = "error",
        queue: str | None = None,
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
        request_drift: str = "error",
        queue: str | None = None,
    ) -> Any:
        """Declare an ``async def`` workflow, as ``@app.workflow`` or ``@app.workflow(...)``.
        Its name (default: the function's; no ``@``) and version are stored with each run;
        a worker drives runs of the workflows it has. Several versions of one name may be
        registered side by side: a start of the name takes the newest (natural order:
        ``"10"`` after ``"9"``), ``app.start("name@1", ...)`` that version, and a run keeps
        its version to the end (docs/how-to/upgrading.md). ``guards`` are its
        :class:`ratchet.Guards` (default: ``ratchet.Guards()``). ``timeout_s`` is each
        run's deadline, in seconds from its first start (``Guards.timeout_s``): past it the
        run fails with :class:`RunTimeout`, also while parked. ``tier="isolated"`` runs
        each attempt in a sandbox of its own (``sandbox=ratchet.Sandbox(...)``; see
        ratchet.sandbox).
        ``request_drift`` says what a replay does when a completed model call's request
        differs from the journaled one (the prompt changed under a running run):
        ``"error"`` (the default) fails the run with :class:`NonDeterminismError`,
        ``"warn"`` journals ``request_drifted`` and goes on with the journaled answer.
        ``queue`` is the queue its runs join unless a start names another (default:
        ``"default"``; see :meth:`queue` for limits); a worker serves its workflows' queues."""
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
            if isinstance(wf_name, str):
                check_workflow_name(wf_name)
            wd = WorkflowDef(
                fn,
                wf_name,
                str(version),
                guards,
                check_tier(tier, sandbox, wf_name),
                request_drift=request_drift,
                queue=queue,
            )
            self.workflows.add(wd)
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
