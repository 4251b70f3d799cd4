"""The scheduler every worker runs beside its claim loop: it fires the ticks of schedules.

No leader: each pass reads every schedule in one query, computes the ticks due for the
ones whose workflow this worker has (see ratchet.engine.schedules), and starts each under
the run id derived from its schedule and tick. A run id is a key of the runs table, so the
first worker to start a tick creates its run and the others find it there: one run per
tick however many workers look, and a worker killed between starting a tick and noting it
fired leaves the next pass (its own or another's) to find the run and note it. Passes come
every :data:`PERIOD_S`, sooner when a tick is nearer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.schedules import ScheduleSpec, tick_run_id
from ratchet.errors import RatchetError, RunIdConflict
from ratchet.model import NewRun
from ratchet.store import schedules as stored
from ratchet.store import tenants
from ratchet.store.base import Store
from ratchet.store.tenants import DEFAULT_TENANT

log = logging.getLogger("ratchet.scheduler")

PERIOD_S = 1.0
# While the table holds no schedule this worker fires, it looks less often: an idle fleet
# should not read the table every second from every worker. A schedule added through the
# API is seen within this.
IDLE_PERIOD_S = 5.0
# The tag each scheduled run carries: the schedule that started it.
SCHEDULE_TAG = "ratchet.schedule"


def spec_of(row: stored.ScheduleRow) -> ScheduleSpec:
    return ScheduleSpec(row.name, row.workflow, row.cron, row.every_s, row.tz, row.missed)


def scheduled_run(
    wd: WorkflowDef, spec: ScheduleSpec, run_id: str, tick: float, tenant: str
) -> NewRun:
    """The run of one tick (or trigger): the workflow gets the tick's time as ``at``."""
    return NewRun(
        run_id,
        wd.name,
        wd.version,
        wd.bind((), {"at": spec.at(tick)}),
        tenant_id=tenant,
        tags={SCHEDULE_TAG: spec.name},
    )


async def start_scheduled(store: Store, tenant: str, new: NewRun) -> tuple[str, bool]:
    """Create ``new`` under its tenant's engine id (idempotent): that id, and whether this
    call created the run."""
    [run_id] = await tenants.internal_ids(store, tenant, [new.run_id])
    new = dataclasses.replace(new, run_id=run_id)
    _, created = await store.create_run(new, redact=tenant != DEFAULT_TENANT)
    if created:
        log.info("action=schedule_fired run_id=%s", run_id)
    return run_id, created


class Scheduler:
    """Fires due ticks of the schedules whose workflow is in ``workflows``.

    ``declared`` are the schedules declared in code (written to the table once, at
    :meth:`run`); ``now`` is the clock (epoch seconds), replaceable in tests."""

    def __init__(
        self,
        store: Store,
        workflows: Mapping[str, WorkflowDef],
        declared: Sequence[ScheduleSpec] = (),
        *,
        now: Callable[[], float] = time.time,
        period: float = PERIOD_S,
    ) -> None:
        self.store = store
        self.workflows = workflows
        self.declared = list(declared)
        self.now = now
        self.period = period
        self.fired = 0  # runs this scheduler created (a tick another worker started: not)

    async def declare(self) -> None:
        await stored.declare(self.store, DEFAULT_TENANT, self.declared, self.now())

    async def run(self) -> None:
        """Declare, then pass forever (until cancelled); a failed pass (the database
        away) is logged and tried again at the next one."""
        await self.declare()
        while True:
            wait = self.period
            try:
                wait = await self.fire_due()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never take the worker down with it
                log.warning("action=scheduler_pass_failed error=%s", e)
            await asyncio.sleep(wait)

    async def fire_due(self) -> float:
        """One pass: start every due tick; the seconds until the next pass."""
        now = self.now()
        nearest = now + self.period
        fired: list[tuple[str, str, float]] = []
        mine = False
        for row in await stored.every_schedule(self.store):
            wd = self.workflows.get(row.workflow)
            if row.paused or wd is None:
                continue
            mine = True
            spec = spec_of(row)
            after = row.last_tick if row.last_tick is not None else row.created_at
            try:
                for tick in spec.due(after, now):
                    new = scheduled_run(wd, spec, tick_run_id(spec.name, tick), tick, row.tenant_id)
                    try:
                        _, created = await start_scheduled(self.store, row.tenant_id, new)
                        self.fired += created
                    except RunIdConflict as e:  # its id taken by a run of another spec
                        log.warning("action=schedule_tick_taken schedule=%s error=%s", row.name, e)
                    fired.append((row.tenant_id, row.name, tick))
                nearest = min(nearest, spec.next_tick(now))
            except RatchetError as e:  # one bad schedule never holds up the others
                log.warning("action=schedule_failed schedule=%s error=%s", row.name, e)
        await stored.advance(self.store, fired)
        if not mine:
            return max(self.period, IDLE_PERIOD_S)
        return max(0.0, min(self.period, nearest - self.now()))
