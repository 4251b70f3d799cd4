"""Schedules: declared with ``@app.schedule``, listed, paused, resumed, triggered, and
added, changed or deleted at run time (the HTTP API's ``/v1/schedules``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ratchet.app.base import AppBase
from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.scheduler import scheduled_run, spec_of, start_scheduled
from ratchet.engine.schedules import ScheduleSpec, check_schedule_name, trigger_run_id
from ratchet.errors import InvalidInput, ScheduleExists, UnknownSchedule
from ratchet.store import schedules as stored
from ratchet.store.tenants import DEFAULT_TENANT


def _iso(t: float | None, spec: ScheduleSpec) -> str | None:
    return None if t is None else spec.at(t).isoformat()


def describe(row: stored.ScheduleRow, now: float) -> dict[str, Any]:
    """A schedule as the CLI, the API and the dashboard show it; times in its time zone."""
    spec = spec_of(row)
    return {
        "name": row.name,
        "workflow": row.workflow,
        "cron": row.cron,
        "every": spec.every,
        "tz": row.tz,
        "missed": row.missed,
        "source": row.source,
        "paused": row.paused,
        "last_fired": _iso(row.last_tick, spec),
        "next_tick": None if row.paused else _iso(spec.next_tick(now), spec),
    }


def _takes_at(wd: WorkflowDef) -> None:
    """Refuse a workflow that cannot receive the tick's time as ``at``."""
    params = inspect.signature(wd.fn).parameters
    at = params.get("at")
    if at is None or at.kind not in (at.POSITIONAL_OR_KEYWORD, at.KEYWORD_ONLY):
        raise InvalidInput(
            f"workflow {wd.name!r} cannot be scheduled: it needs a parameter "
            "`at: datetime`, the time of the tick"
        )
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    for p in params.values():
        if p.name != "at" and p.default is p.empty and p.kind not in variadic:
            raise InvalidInput(
                f"workflow {wd.name!r} cannot be scheduled: its parameter {p.name!r} "
                "has no default, and a tick gives only `at`"
            )
    try:  # `at` annotated as something a datetime is not
        wd.bind((), {"at": datetime(2000, 1, 1, tzinfo=UTC)})
    except InvalidInput as e:
        raise InvalidInput(
            f"workflow {wd.name!r} cannot be scheduled: its `at` must take a datetime ({e})"
        ) from None


class Scheduling(AppBase):
    """The schedule calls of :class:`ratchet.Ratchet`."""

    def schedule(
        self,
        *,
        cron: str | None = None,
        every: str | None = None,
        tz: str = "UTC",
        missed: str = "latest",
        name: str | None = None,
    ) -> Callable[[WorkflowDef], WorkflowDef]:
        """Run a workflow by the clock, above its ``@app.workflow()``: ``cron="0 * * * *"``
        (five fields, read in ``tz``, an IANA zone, default UTC) or ``every="30s"`` (s, m,
        h, d; ``"1h30m"``). Every worker of the app fires its ticks, and each tick is one
        run however many workers there are; the workflow receives the tick's time as
        ``at`` (a timezone-aware datetime). After downtime ``missed`` says what the ticks
        nobody fired become: ``"skip"``, ``"latest"`` (one run, for the newest) or
        ``"all"`` (at most 100). ``name`` defaults to the workflow's
        (docs/how-to/schedules.md)."""

        def decorate(wd: WorkflowDef) -> WorkflowDef:
            if not isinstance(wd, WorkflowDef):
                raise InvalidInput(
                    "@app.schedule goes above @app.workflow(): it schedules a workflow"
                )
            spec = ScheduleSpec.make(
                name or wd.name, wd.name, cron=cron, every=every, tz=tz, missed=missed
            )
            _takes_at(wd)
            if spec.name in self.schedule_specs:
                raise InvalidInput(f"schedule {spec.name!r} is declared twice; give name=")
            self.schedule_specs[spec.name] = spec
            self._schedules_declared = None
            return wd

        return decorate

    async def schedules_async(self, *, tenant: str = DEFAULT_TENANT) -> list[dict[str, Any]]:
        """Every schedule (of ``tenant``): name, workflow, cron or every, tz, missed,
        source (code or api), paused, last_fired and next_tick (ISO, in its zone)."""
        store = await self._astore()
        await self._declare(tenant)
        now = self.wall_clock()
        return [describe(r, now) for r in await stored.of_tenant(store, tenant)]

    def schedules(self, *, tenant: str = DEFAULT_TENANT) -> list[dict[str, Any]]:
        """:meth:`schedules_async`, blocking."""
        return self._portal.call(self.schedules_async(tenant=tenant))

    async def _declare(self, tenant: str) -> None:
        # The code's schedules are in the table as soon as this app is asked, not only once
        # a worker has started; once per app, as a worker writes them once when it starts
        # (a change made through the API since then stays until the next).
        store = await self._astore()
        if (
            tenant == DEFAULT_TENANT
            and self.schedule_specs
            and not self.read_only
            and self._schedules_declared is not store
        ):
            self._schedules_declared = store
            await stored.declare(
                store, tenant, list(self.schedule_specs.values()), self.wall_clock()
            )

    async def _row(self, name: str, tenant: str) -> stored.ScheduleRow:
        check_schedule_name(name)
        await self._declare(tenant)
        row = await stored.get(await self._astore(), tenant, name)
        if row is None:
            raise UnknownSchedule(f"unknown schedule {name!r}")
        return row

    async def pause_schedule_async(self, name: str, *, tenant: str = DEFAULT_TENANT) -> None:
        """Stop firing ``name``'s ticks until it is resumed."""
        await self._row(name, tenant)
        await stored.pause(await self._astore(), tenant, name)

    def pause_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> None:
        """:meth:`pause_schedule_async`, blocking."""
        self._portal.call(self.pause_schedule_async(name, tenant=tenant))

    async def resume_schedule_async(self, name: str, *, tenant: str = DEFAULT_TENANT) -> None:
        """Fire ``name``'s ticks again, from the next one: the ticks that passed while it
        was paused are not fired."""
        await self._row(name, tenant)
        await stored.resume(await self._astore(), tenant, name, self.wall_clock())

    def resume_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> None:
        """:meth:`resume_schedule_async`, blocking."""
        self._portal.call(self.resume_schedule_async(name, tenant=tenant))

    async def trigger_schedule_async(self, name: str, *, tenant: str = DEFAULT_TENANT) -> str:
        """Run ``name``'s workflow now, once, with ``at`` now, under a run id of its own
        (``sched:NAME:trigger:TIME``); paused or not. Returns the run id."""
        row = await self._row(name, tenant)
        wd = self._scheduled_workflow(row.workflow)
        now = self.wall_clock()
        spec = spec_of(row)
        new = scheduled_run(wd, spec, trigger_run_id(name, now), now, tenant)
        await start_scheduled(await self._astore(), tenant, new)
        return new.run_id

    def trigger_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> str:
        """:meth:`trigger_schedule_async`, blocking."""
        return self._portal.call(self.trigger_schedule_async(name, tenant=tenant))

    def _scheduled_workflow(self, workflow: object) -> WorkflowDef:
        if not isinstance(workflow, str) or workflow not in self.workflows:
            known = ", ".join(sorted(self.workflows)) or "none"
            raise InvalidInput(f"unknown workflow {workflow!r}; registered workflows: {known}")
        wd = self.workflows[workflow]
        _takes_at(wd)
        return wd

    async def add_schedule_async(
        self,
        name: str,
        workflow: str,
        *,
        cron: str | None = None,
        every: str | None = None,
        tz: str = "UTC",
        missed: str = "latest",
        tenant: str = DEFAULT_TENANT,
    ) -> dict[str, Any]:
        """Add a schedule at run time, for a workflow this app has: kept in the database
        and fired by every worker, as a declared one is. Checked first: a bad cron, tz,
        every or missed is refused naming it, and nothing is written."""
        self._scheduled_workflow(workflow)
        spec = ScheduleSpec.make(name, workflow, cron=cron, every=every, tz=tz, missed=missed)
        store = await self._astore()
        await self._declare(tenant)
        if not await stored.add(store, tenant, spec, self.wall_clock()):
            raise ScheduleExists(f"schedule {name!r} exists already")
        return describe(await self._row(name, tenant), self.wall_clock())

    def add_schedule(
        self,
        name: str,
        workflow: str,
        *,
        cron: str | None = None,
        every: str | None = None,
        tz: str = "UTC",
        missed: str = "latest",
        tenant: str = DEFAULT_TENANT,
    ) -> dict[str, Any]:
        """:meth:`add_schedule_async`, blocking."""
        return self._portal.call(
            self.add_schedule_async(
                name, workflow, cron=cron, every=every, tz=tz, missed=missed, tenant=tenant
            )
        )

    async def change_schedule_async(
        self, name: str, *, tenant: str = DEFAULT_TENANT, **changes: Any
    ) -> dict[str, Any]:
        """Change a schedule's ``workflow``, ``cron`` or ``every``, ``tz`` or ``missed``
        (the ones given; giving ``cron`` drops ``every`` and the reverse). Checked as
        :meth:`add_schedule_async` checks; its fired ticks and pause stay."""
        unknown = set(changes) - {"workflow", "cron", "every", "tz", "missed"}
        if unknown:
            raise InvalidInput(f"unknown schedule field {sorted(unknown)[0]!r}")
        row = await self._row(name, tenant)
        current = spec_of(row)
        workflow = changes.get("workflow", row.workflow)
        self._scheduled_workflow(workflow)
        cron, every = row.cron, current.every
        if "cron" in changes or "every" in changes:
            cron, every = changes.get("cron"), changes.get("every")
        spec = ScheduleSpec.make(
            name,
            workflow,
            cron=cron,
            every=every,
            tz=changes.get("tz", row.tz),
            missed=changes.get("missed", row.missed),
        )
        await stored.change(await self._astore(), tenant, spec)
        return describe(await self._row(name, tenant), self.wall_clock())

    def change_schedule(
        self, name: str, *, tenant: str = DEFAULT_TENANT, **changes: Any
    ) -> dict[str, Any]:
        """:meth:`change_schedule_async`, blocking."""
        return self._portal.call(self.change_schedule_async(name, tenant=tenant, **changes))

    async def delete_schedule_async(self, name: str, *, tenant: str = DEFAULT_TENANT) -> None:
        """Delete a schedule (its runs stay). A schedule declared in code comes back when
        a worker of that code starts: remove it from the code instead, or pause it."""
        await self._row(name, tenant)
        await stored.delete(await self._astore(), tenant, name)

    def delete_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> None:
        """:meth:`delete_schedule_async`, blocking."""
        self._portal.call(self.delete_schedule_async(name, tenant=tenant))
