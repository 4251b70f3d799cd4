"""Dead letters, workflows, health and metrics."""

from __future__ import annotations

import asyncio
import inspect
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from ratchet.api.auth import decider, scope
from ratchet.api.runs import ERRORS, Reader, owned, shown
from ratchet.api.schemas import DeadLetterOut, Error, Health, RetryBody, StatusAfter, WorkflowOut
from ratchet.app import Ratchet
from ratchet.errors import StorageError, StoreNotReady
from ratchet.store import tenants, tokens
from ratchet.store.tokens import Token
from ratchet.web.errors import error_response

router = APIRouter(tags=["operations"])
v1 = APIRouter(prefix="/v1", tags=["operations"], responses=ERRORS)
Admin = Annotated[Token, Depends(scope("admin"))]


@v1.get("/dead-letters", response_model=list[DeadLetterOut])
async def dead_letters(
    request: Request, token: Admin, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> list[DeadLetterOut]:
    """The tenant's dead-lettered runs, newest first (admin scope)."""
    found = await tokens.dead_letters(request.app.state.store, token.tenant_id, limit)
    return [
        DeadLetterOut(
            run_id=shown(token, d.run_id),
            workflow=d.workflow,
            reason=d.reason,
            error=tenants.external_text(token.tenant_id, d.error),
            at=d.at,
        )
        for d in found
    ]


@v1.post("/dead-letters/{run_id:path}/retry", response_model=StatusAfter, status_code=202)
async def retry(
    run_id: str, request: Request, token: Admin, body: RetryBody | None = None
) -> StatusAfter:
    """Re-queue a dead-lettered run; it resumes after its last completed step, keeping its
    limits unless the body grants more (journaled with the token's name as who)."""
    found = await owned(request, run_id, token)
    app: Ratchet = request.app.state.ratchet
    grant = body.grant if body is not None else None
    rec = await app.retry_async(found.run_id, grant=grant, by=decider(token))
    return StatusAfter(run_id=shown(token, rec.run_id), status=str(rec.status))


@v1.get("/workflows", response_model=list[WorkflowOut])
async def workflows(request: Request, token: Reader) -> list[WorkflowOut]:
    """What this server can start: its code workflows and every registered graph (the
    app's own and those of ``ratchet graph register``), at the version a start takes."""
    app: Ratchet = request.app.state.ratchet
    out = [
        WorkflowOut(
            name=w.name,
            kind="code",
            version=w.version,
            parameters=list(inspect.signature(w.fn).parameters),
            versions=[v.version for v in reversed(app.workflows.versions(w.name))],
        )
        for w in app.workflows.values()
    ]
    # Newest first within a name: the first of each is the version a start of it takes.
    graphs: dict[str, list[str]] = {}
    for g in await request.app.state.store.list_graphs():
        graphs.setdefault(g.name, []).append(g.version)
    out += [
        WorkflowOut(
            name=name, kind="graph", version=versions[0], parameters=["input"], versions=versions
        )
        for name, versions in graphs.items()
        if name not in app.workflows  # a code workflow of the same name is what starts
    ]
    return sorted(out, key=lambda w: w.name)


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Error}})
async def readyz(request: Request) -> Response:
    """The database answers, its file or schema is the one opened, and every migration
    this code knows is applied; 503 with the reason otherwise."""
    try:
        await request.app.state.readiness.check()
    except StoreNotReady as e:
        return error_response(503, "unavailable", f"not ready: {e}")
    return JSONResponse({"status": "ready"})


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}, 503: {"model": Error}},
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics; 503 with the reason while the database is not ready (the
    counts by status are read from it), as ``/readyz`` answers."""
    readiness = request.app.state.readiness
    try:
        await readiness.check()
        body, content_type = await asyncio.wait_for(
            request.app.state.metrics.render(request.app.state.store), readiness.timeout_s
        )
    except StoreNotReady as e:
        return error_response(503, "unavailable", f"not ready: {e}")
    except (StorageError, TimeoutError) as e:
        return error_response(
            503, "unavailable", f"not ready: the database did not answer ({type(e).__name__})"
        )
    return Response(body, media_type=content_type)
