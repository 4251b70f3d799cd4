"""The ``schedules`` table: every schedule of every tenant, its pause and the newest tick
fired (see ratchet.engine.schedules for what a tick is)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ratchet.store.dialect import Dialect


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    tenant_id: str
    name: str
    workflow: str
    cron: str | None
    every_s: int | None
    tz: str
    missed: str
    source: str  # "code" (declared with @app.schedule) or "api" (added at run time)
    paused: bool
    created_at: float
    last_tick: float | None


def _row(row: Any) -> ScheduleRow:
    return ScheduleRow(
        str(row["tenant_id"]),
        str(row["name"]),
        str(row["workflow"]),
        row["cron"],
        None if row["every_s"] is None else int(row["every_s"]),
        str(row["tz"]),
        str(row["missed"]),
        str(row["source"]),
        bool(row["paused"]),
        float(row["created_at"]),
        None if row["last_tick"] is None else float(row["last_tick"]),
    )


def _params(tenant: str, spec: Any, now: float | None = None) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "name": spec.name,
        "workflow": spec.workflow,
        "cron": spec.cron,
        "every_s": spec.every_s,
        "tz": spec.tz,
        "missed": spec.missed,
        "now": now,
    }


async def declare(d: Dialect, tenant: str, specs: Sequence[Any], now: float) -> None:
    """Write the schedules declared in code (a ``ScheduleSpec`` each): new ones from
    ``now``, known ones with their spec as the code has it now."""
    if specs:
        rows = [_params(tenant, s, now) for s in specs]
        await d._run(lambda tx: tx.send_many("schedule_declare", rows))


async def add(d: Dialect, tenant: str, spec: Any, now: float) -> bool:
    """Add a schedule; False when ``tenant`` has one of that name already."""
    params = _params(tenant, spec, now)
    return bool(await d._run(lambda tx: tx.run("schedule_add", params)))


async def change(d: Dialect, tenant: str, spec: Any) -> bool:
    params = _params(tenant, spec)
    del params["now"]
    return bool(await d._run(lambda tx: tx.run("schedule_change", params)))


async def delete(d: Dialect, tenant: str, name: str) -> bool:
    params = {"tenant_id": tenant, "name": name}
    return bool(await d._run(lambda tx: tx.run("schedule_delete", params)))


async def every_schedule(d: Dialect) -> list[ScheduleRow]:
    """Every schedule of every tenant: one read, what a scheduler pass starts from."""
    return [_row(r) for r in await d._read(lambda tx: tx.all("schedules_all", {}))]


async def of_tenant(d: Dialect, tenant: str) -> list[ScheduleRow]:
    params = {"tenant_id": tenant}
    return [_row(r) for r in await d._read(lambda tx: tx.all("schedules_of_tenant", params))]


async def get(d: Dialect, tenant: str, name: str) -> ScheduleRow | None:
    params = {"tenant_id": tenant, "name": name}
    row = await d._read(lambda tx: tx.one("schedule_get", params))
    return None if row is None else _row(row)


async def advance(d: Dialect, fired: Sequence[tuple[str, str, float]]) -> None:
    """Move each ``(tenant, name, tick)``'s newest fired tick forward to ``tick``."""
    rows = [{"tenant_id": t, "name": n, "tick": tick} for t, n, tick in fired]
    if rows:
        await d._run(lambda tx: tx.send_many("schedule_advance", rows))


async def pause(d: Dialect, tenant: str, name: str) -> bool:
    params = {"tenant_id": tenant, "name": name}
    return bool(await d._run(lambda tx: tx.run("schedule_pause", params)))


async def resume(d: Dialect, tenant: str, name: str, tick: float) -> bool:
    """Resume, owing nothing at or before ``tick`` (the ticks that passed while paused)."""
    params = {"tenant_id": tenant, "name": name, "tick": tick}
    return bool(await d._run(lambda tx: tx.run("schedule_resume", params)))
