"""``/v1/schedules``: the tenant's schedules, listed (``runs:read``), and added, changed,
deleted, paused, resumed and triggered (``admin``). A schedule added here is kept in the
database and fired by every worker, as one declared with ``@app.schedule`` is; its
workflow must be one of the server's app. Another tenant's schedule is unknown here (404)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response

from ratchet.api.auth import scope
from ratchet.api.runs import ERRORS, Reader
from ratchet.api.schemas import NewSchedule, ScheduleChange, ScheduleOut, ScheduleTriggered
from ratchet.app import Ratchet
from ratchet.errors import UnknownSchedule
from ratchet.store.tokens import Token

router = APIRouter(prefix="/v1", tags=["schedules"], responses=ERRORS)
Admin = Annotated[Token, Depends(scope("admin"))]
Name = Annotated[str, Path(max_length=100)]


def _app(request: Request) -> Ratchet:
    app: Ratchet = request.app.state.ratchet
    return app


async def _one(app: Ratchet, name: str, tenant: str) -> ScheduleOut:
    found = [s for s in await app.schedules_async(tenant=tenant) if s["name"] == name]
    if not found:
        raise UnknownSchedule(f"unknown schedule {name!r}")
    return ScheduleOut(**found[0])


@router.get("/schedules", response_model=list[ScheduleOut])
async def list_(request: Request, token: Reader) -> list[ScheduleOut]:
    """The tenant's schedules, by name: when each fires, whether it is paused, its last
    fired and next tick."""
    return [ScheduleOut(**s) for s in await _app(request).schedules_async(tenant=token.tenant_id)]


@router.get("/schedules/{name}", response_model=ScheduleOut)
async def get(name: Name, request: Request, token: Reader) -> ScheduleOut:
    return await _one(_app(request), name, token.tenant_id)


@router.post("/schedules", response_model=ScheduleOut, status_code=201)
async def add(body: NewSchedule, request: Request, token: Admin) -> ScheduleOut:
    """Add a schedule for a workflow of the server's app: exactly one of ``cron`` (read in
    ``tz``) and ``every``. A bad one is refused 422 naming the problem, a taken name 409;
    nothing is written then."""
    made = await _app(request).add_schedule_async(
        body.name,
        body.workflow,
        cron=body.cron,
        every=body.every,
        tz=body.tz,
        missed=body.missed,
        tenant=token.tenant_id,
    )
    return ScheduleOut(**made)


@router.patch("/schedules/{name}", response_model=ScheduleOut)
async def change(name: Name, body: ScheduleChange, request: Request, token: Admin) -> ScheduleOut:
    """Change the fields given (``cron`` replaces ``every`` and the reverse); its pause and
    fired ticks stay."""
    changes: dict[str, Any] = body.model_dump(exclude_unset=True)
    changes = {k: v for k, v in changes.items() if v is not None or k in ("cron", "every")}
    made = await _app(request).change_schedule_async(name, tenant=token.tenant_id, **changes)
    return ScheduleOut(**made)


@router.delete("/schedules/{name}", status_code=204)
async def delete(name: Name, request: Request, token: Admin) -> Response:
    """Delete a schedule (its runs stay). One declared in code comes back when a worker of
    that code starts: pause it instead."""
    await _app(request).delete_schedule_async(name, tenant=token.tenant_id)
    return Response(status_code=204)


@router.post("/schedules/{name}/pause", response_model=ScheduleOut)
async def pause(name: Name, request: Request, token: Admin) -> ScheduleOut:
    app = _app(request)
    await app.pause_schedule_async(name, tenant=token.tenant_id)
    return await _one(app, name, token.tenant_id)


@router.post("/schedules/{name}/resume", response_model=ScheduleOut)
async def resume(name: Name, request: Request, token: Admin) -> ScheduleOut:
    """Fire its ticks again from the next one; those that passed while paused are not."""
    app = _app(request)
    await app.resume_schedule_async(name, tenant=token.tenant_id)
    return await _one(app, name, token.tenant_id)


@router.post("/schedules/{name}/trigger", response_model=ScheduleTriggered, status_code=201)
async def trigger(name: Name, request: Request, token: Admin) -> ScheduleTriggered:
    """Run its workflow now, once, paused or not, under a run id of its own."""
    run_id = await _app(request).trigger_schedule_async(name, tenant=token.tenant_id)
    return ScheduleTriggered(run_id=run_id)
