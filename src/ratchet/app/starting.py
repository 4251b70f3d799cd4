"""Starting runs: one, or many in one transaction, every argument checked before anything
is written."""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ratchet.app.base import AppBase
from ratchet.engine.definitions import WorkflowDef, check_name
from ratchet.engine.guards import check_overrides
from ratchet.engine.start_options import Debounce, start_options
from ratchet.engine.starts import RunRequest, as_start, at_item
from ratchet.engine.versions import split_ref
from ratchet.errors import InvalidInput, RunIdConflict, UnknownWorkflow
from ratchet.model import NewRun, RunRecord, RunStatus
from ratchet.model.starts import StartPlan
from ratchet.names import MAX_QUEUE, MAX_WORKFLOW, check_length, check_tags
from ratchet.store import Store, tenants
from ratchet.store.tenants import DEFAULT_TENANT

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")
# Priorities are 32-bit signed integers on both backends (PostgreSQL's integer column).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1


async def _tenant_scoped(store: Store, tenant: str, news: list[NewRun]) -> list[NewRun]:
    """``news`` with each tenant's run id replaced by the engine's (see
    :mod:`ratchet.store.tenants`)."""
    internal = await tenants.internal_ids(store, tenant, [n.run_id for n in news])
    return [dataclasses.replace(n, run_id=i) for n, i in zip(news, internal, strict=True)]


class Starting(AppBase):
    """The start calls of :class:`ratchet.Ratchet`."""

    async def start_async(
        self,
        wf: WorkflowDef | str,
        /,
        *args: Any,
        run_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        guards: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        tags: Mapping[str, str] | None = None,
        dedup_id: str | None = None,
        debounce: Debounce | None = None,
        start_at: datetime | None = None,
        delay_s: float | None = None,
        concurrency_key: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Queue a run and return its id at once; nothing executes in the caller. With an
        explicit ``run_id`` the call is idempotent: the existing run's id comes back.
        ``guards`` overrides some of the workflow's guard fields for this run (their JSON
        form: ``{"max_steps": 5000, "actions": {"runaway_loop": "pause"}}``); ``timeout_s``
        is the run's deadline (the guard field of that name), in seconds from its start.
        ``tags`` (``{"customer": "acme"}``) are kept with the run, never changed, and given
        to its child runs; :meth:`runs` finds runs by them. At most 20, each key 1-64
        letters, digits and ``_ . : / -``, each value a string of at most 256 characters.
        ``queue`` defaults to the workflow's (``@app.workflow(queue=...)``, else
        ``"default"``); ``concurrency_key`` is the key its queue's ``per_key_concurrency``
        counts (docs/how-to/queues.md).
        ``dedup_id``: while a run of this workflow with this id is not terminal, another
        start with it raises :class:`DuplicateStart` naming that run. ``debounce``
        (:class:`ratchet.Debounce`): starts of its key within its window collapse into one
        run, which begins a window after the last of them with its input; every one of
        them returns that run's id. ``start_at`` (an aware datetime) or ``delay_s``: the
        run is stored now and no worker claims it before then (see
        :mod:`ratchet.engine.start_options`)."""
        plan = start_options(
            dedup_id=dedup_id, debounce=debounce, start_at=start_at, delay_s=delay_s, run_id=run_id
        )
        if timeout_s is not None:
            guards = {**(guards or {}), "timeout_s": timeout_s}
        rec, _ = await self.start_run_async(
            wf,
            args,
            kwargs,
            run_id=run_id,
            queue=queue,
            priority=priority,
            guards=guards,
            tags=tags,
            plan=plan,
            concurrency_key=concurrency_key,
        )
        return rec.run_id

    async def start_run_async(
        self,
        wf: WorkflowDef | str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        run_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        tenant: str | None = None,
        guards: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        plan: StartPlan | None = None,
        concurrency_key: str | None = None,
    ) -> tuple[RunRecord, bool]:
        """:meth:`start_async` for callers that need the record and whether it was created,
        its arguments given as a sequence and a mapping. With ``tenant`` (the HTTP API),
        ``run_id`` is that tenant's id (see :mod:`ratchet.store.tenants`; the record
        carries the engine's), and a conflict with an existing run names the fields that
        differ without quoting the stored values. ``plan``: the start's dedup id, debounce
        or time to begin at (:func:`ratchet.engine.start_options.start_options`)."""
        new, graph = await self._new_run(
            RunRequest(
                wf,
                tuple(args),
                kwargs,
                run_id,
                queue,
                priority,
                guards,
                tags,
                concurrency_key=concurrency_key,
            ),
            tenant or DEFAULT_TENANT,
        )
        store = await self._astore()
        redact = tenant is not None
        if tenant is not None:
            [new] = await _tenant_scoped(store, tenant, [new])
        if plan is None:
            rec, created = await store.create_run(new, redact=redact)
        else:
            rec, created = await store.create_planned_run(new, plan, redact=redact)
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
        news: list[NewRun] = []
        for i, request in enumerate(requests):
            with at_item(i):
                news.append((await self._new_run(request, tenant or DEFAULT_TENANT))[0])
        if not news:
            return []
        store = await self._astore()
        if any(r.plan is not None for r in requests):
            if tenant is not None:
                news = await _tenant_scoped(store, tenant, news)
            plans = [r.plan for r in requests]
            return await store.create_planned_runs(
                list(zip(news, plans, strict=True)), redact=tenant is not None
            )
        if tenant is None:
            return await store.create_runs(news)
        return await store.create_runs(await _tenant_scoped(store, tenant, news), redact=True)

    async def _new_run(self, r: RunRequest, tenant: str) -> tuple[NewRun, bool]:
        """The run to create for ``r``, every argument checked (an :class:`InvalidInput`
        tagged with the field at fault), and whether it is a graph's run."""
        # One try for every check, naming the field being checked as it goes: a batch
        # start checks thousands of items, and a context manager per check costs more
        # than the checks themselves.
        field = "guards"
        try:
            overrides = check_overrides(r.guards) if r.guards is not None else None
            field = "tags"
            tags = check_tags(r.tags)
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
            if queue is not None:
                check_length(check_name(queue, "queue"), "queue", MAX_QUEUE)
            field = "concurrency_key"
            key = r.concurrency_key
            if key is not None:
                check_length(check_name(key, "concurrency key"), "concurrency key", MAX_QUEUE)
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
            if (
                isinstance(wf, str)
                and wf not in self.workflows
                and split_ref(wf)[0] not in self.workflows  # name@version: a code workflow's
            ):
                from ratchet.graphs.start import new_graph_run

                field = "input"
                try:
                    new = await new_graph_run(
                        await self._astore(),
                        wf,
                        r.args,
                        dict(r.kwargs),
                        run_id or uuid.uuid4().hex,
                        queue or "default",
                        priority,
                        known=self.workflows,
                    )
                except UnknownWorkflow:
                    field = "workflow"
                    raise
                return dataclasses.replace(
                    new, tenant_id=tenant, guards=overrides, tags=tags, concurrency_key=key
                ), True
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
            queue if queue is not None else (wd.queue or "default"),
            priority,
            tenant_id=tenant,
            guards=overrides,
            tags=tags,
            concurrency_key=key,
        ), False

    async def start_many_async(
        self,
        wf: WorkflowDef | str,
        items: Iterable[Any],
        /,
        *,
        queue: str | None = None,
        priority: int = 0,
        guards: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        concurrency_key: str | None = None,
    ) -> list[str]:
        """Queue many runs of ``wf`` at once and return their ids, in order: one
        transaction and one wake-up for the whole batch. Each item is a
        :class:`ratchet.Start` (arguments, and optionally its own ``run_id``, ``queue``,
        ``priority``, ``guards``, ``tags``), a mapping of keyword arguments, or a tuple of
        positional arguments; ``queue``, ``priority``, ``guards`` and ``tags`` are the
        defaults (an item's own tags replace the default ones). Each item
        behaves as :meth:`start_async` would (an explicit ``run_id`` is idempotent); a bad
        item raises :class:`BatchItemInvalid` naming its index, and nothing is written."""
        requests = []
        for i, item in enumerate(items):
            start = as_start(item, i)
            with at_item(i):
                plan = start_options(
                    dedup_id=start.dedup_id,
                    debounce=start.debounce,
                    start_at=start.start_at,
                    delay_s=start.delay_s,
                    run_id=start.run_id,
                )
            requests.append(
                RunRequest(
                    wf,
                    start.args,
                    start.kwargs,
                    start.run_id,
                    queue if start.queue is None else start.queue,
                    priority if start.priority is None else start.priority,
                    guards if start.guards is None else start.guards,
                    tags if start.tags is None else start.tags,
                    plan=plan,
                    concurrency_key=(
                        concurrency_key if start.concurrency_key is None else start.concurrency_key
                    ),
                )
            )
        return [run_id for run_id, _, _ in await self.start_runs_async(requests)]
