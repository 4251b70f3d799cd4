"""Queues and their limits: ``GET /v1/queues`` and ``PATCH /v1/queues/{name}``.

Queues are fleet-wide (every tenant's runs share a queue's slots), so their limits are an
operator's: only admin tokens of the default tenant may read or change them. Another
tenant's admin is refused 403, since the depths and runs in flight count every tenant's
runs, and a limit it set would throttle the others."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from ratchet.api.auth import scope
from ratchet.api.runs import ERRORS
from ratchet.api.schemas import QueueLimitsIn, QueueOut
from ratchet.store import Store, tenants
from ratchet.store.queues import QueueView
from ratchet.store.tokens import Token
from ratchet.web.errors import ApiError

router = APIRouter(prefix="/v1", tags=["queues"], responses=ERRORS)
Admin = Annotated[Token, Depends(scope("admin"))]


def _operator(token: Token) -> None:
    if token.tenant_id != tenants.DEFAULT_TENANT:
        raise ApiError(
            403,
            "queues are fleet-wide: only admin tokens of the default tenant may "
            "read or change their limits",
        )


def _out(view: QueueView) -> QueueOut:
    return QueueOut(**view.as_dict())


@router.get("/queues", response_model=list[QueueOut])
async def queues(request: Request, token: Admin) -> list[QueueOut]:
    """Every declared queue, by name: its limits, depth (runs queued) and runs in flight
    (admin scope of the default tenant: queues are fleet-wide)."""
    _operator(token)
    store: Store = request.app.state.store
    return [_out(v) for v in await store.list_queues()]


@router.patch("/queues/{name}", response_model=QueueOut)
async def set_limits(name: str, body: QueueLimitsIn, request: Request, token: Admin) -> QueueOut:
    """Change a queue's limits at run time, for every worker's next claim: the fields the
    body names (null removes a limit). 404 for a queue nobody declared; a bad value is
    refused 422 and nothing is written. The limits stand over the code's declaration until
    changed again (admin scope of the default tenant)."""
    _operator(token)
    store: Store = request.app.state.store
    changes: dict[str, Any] = body.model_dump(exclude_unset=True)
    if changes.get("hold_while_parked", False) is None:
        raise ApiError(422, "hold_while_parked must be true or false")
    await store.set_queue_limits(name, changes)
    [view] = [v for v in await store.list_queues() if v.limits.name == name]
    return _out(view)
