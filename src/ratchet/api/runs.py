"""``/v1/runs``: start, list, read, wait for, signal, cancel and decide approvals of runs.
Every route reads the run through :func:`owned`, so another tenant's run is a 404 exactly
like a missing one."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response

from ratchet.api.auth import scope
from ratchet.api.errors import ApiError, not_found
from ratchet.api.models import (
    BatchRunAccepted,
    ChildRun,
    Decision,
    DecisionMade,
    Error,
    LLMUsage,
    Run,
    RunAccepted,
    RunDetail,
    RunPage,
    RunResult,
    RunsAccepted,
    SignalBody,
    StartRun,
    StartRuns,
    StatusAfter,
)
from ratchet.app import Ratchet
from ratchet.errors import BatchItemInvalid, InvalidInput
from ratchet.model import RunRecord, RunStatus
from ratchet.starts import RunRequest
from ratchet.store import Store, tokens
from ratchet.store.base import DONE
from ratchet.store.tokens import Token

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Error} for code in (401, 403, 404, 409, 413, 422)}
router = APIRouter(prefix="/v1", tags=["runs"], responses=ERRORS)
# A child run's id holds "/" (parent/step), so run ids are matched as paths; the bare
# /runs/{id} goes on a router included after every /runs/{id}/... route, which it would
# otherwise swallow.
last = APIRouter(prefix="/v1", tags=["runs"], responses=ERRORS)
Reader = Annotated[Token, Depends(scope("runs:read"))]
Writer = Annotated[Token, Depends(scope("runs:write"))]
MAX_WAIT_S = 60.0


def _app(request: Request) -> Ratchet:
    app: Ratchet = request.app.state.ratchet
    return app


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


async def owned(request: Request, run_id: str, token: Token) -> RunRecord:
    """The run, if it exists and is the token's tenant's; else 404 (the same either way)."""
    rec = await _store(request).get_run(run_id)
    if rec is None or rec.tenant_id != token.tenant_id:
        raise not_found(run_id)
    return rec


def _input(stored: Any) -> Any:
    """A run's input as the API takes it: arguments by name (a code workflow), the input
    object (a graph); the stored ``{args, kwargs}`` when it was started otherwise."""
    if isinstance(stored, dict) and set(stored) == {"args", "kwargs"}:
        args, kwargs = stored["args"], stored["kwargs"]
        if not args:
            return kwargs
        if len(args) == 1 and not kwargs:
            return args[0]
    return stored


def _run(rec: RunRecord) -> Run:
    return Run(run_id=rec.run_id, workflow=rec.workflow, workflow_version=rec.workflow_version,
               status=str(rec.status), input=_input(rec.input), output=rec.output, error=rec.error,
               parent_run_id=rec.parent_run_id, queue=rec.queue, created_at=rec.created_at,
               updated_at=rec.updated_at)


@router.post("/runs", status_code=202, response_model=RunAccepted,
             responses={200: {"model": RunAccepted, "description": "The run existed already "
                                                                   "(same run_id or key)."}})
async def start_run(body: StartRun, request: Request, response: Response, token: Writer,
                    idempotency_key: Annotated[str | None, Header(
                        description="Same key, same run; a different body is refused 422."
                    )] = None) -> RunAccepted:
    """Queue a run and return at once: 202 when created, 200 when it existed."""
    app = _app(request)
    run_id = body.run_id
    if run_id is None and idempotency_key is not None:
        run_id = _keyed_run_id(token.tenant_id, idempotency_key)
    r = _request(app, body, run_id)
    try:
        rec, created = await app.start_run_async(r.workflow, r.args, r.kwargs, run_id=run_id,
                                                 queue=body.queue, tenant=token.tenant_id,
                                                 guards=body.guards)
    except InvalidInput as e:
        raise ApiError(422, str(e), details={"workflow": body.workflow}) from e
    if rec.tenant_id != token.tenant_id:
        raise ApiError(409, f"run id {rec.run_id!r} is taken; choose another")
    if created:
        request.app.state.metrics.runs_started.inc()
    else:
        response.status_code = 200
    return RunAccepted(run_id=rec.run_id, status=str(rec.status))


def _keyed_run_id(tenant: str, key: str) -> str:
    # The key names the run (per tenant), so a repeat finds it and a different body
    # conflicts with it, with nothing else to store.
    digest = hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()
    return f"idem-{digest[:40]}"


def _request(app: Ratchet, body: StartRun, run_id: str | None) -> RunRequest:
    """A start's body as the app takes it: a graph's input is its one argument, a code
    workflow's its arguments by name."""
    graph = body.workflow not in app.workflows
    args: tuple[Any, ...] = (body.input,) if graph else ()
    kwargs: dict[str, Any] = {} if graph else body.input
    return RunRequest(body.workflow, args, kwargs, run_id, body.queue, 0, body.guards)


@router.post("/runs:batch", status_code=202, response_model=RunsAccepted,
             responses={200: {"model": RunsAccepted,
                              "description": "Every run existed already."}})
async def start_runs(body: StartRuns, request: Request, response: Response, token: Writer,
                     idempotency_key: Annotated[str | None, Header(
                         description="Same key, same runs: item i without a run_id is the "
                                     "run POST /v1/runs would start under the key "
                                     "'<key>#<i>'; a different body is refused 422."
                     )] = None) -> RunsAccepted:
    """Queue many runs in one transaction and return at once, their ids and statuses in
    the order asked: 202 when any was created, 200 when all existed. A bad item is refused
    422 naming ``runs[i].field`` (409 when its run id is another tenant's), and then
    nothing is written."""
    app = _app(request)
    requests = []
    for i, item in enumerate(body.runs):
        run_id = item.run_id
        if run_id is None and idempotency_key is not None:
            run_id = _keyed_run_id(token.tenant_id, f"{idempotency_key}#{i}")
        requests.append(_request(app, item, run_id))
    try:
        started = await app.start_runs_async(requests, tenant=token.tenant_id)
    except BatchItemInvalid as e:
        field = f"runs[{e.index}].{e.field}"
        raise ApiError(409 if e.taken else 422, f"{field}: {e.problem}",
                       details=[{"field": field, "message": e.problem}]) from e
    created = sum(fresh for _, _, fresh in started)
    if created:
        request.app.state.metrics.runs_started.inc(created)
    else:
        response.status_code = 200
    return RunsAccepted(runs=[BatchRunAccepted(run_id=run_id, status=str(status),
                                               created=fresh)
                              for run_id, status, fresh in started])


def _cursor(text: str | None) -> tuple[float, str] | None:
    if not text:
        return None
    try:
        at, run_id = json.loads(base64.urlsafe_b64decode(text.encode()))
        return float(at), str(run_id)
    except (ValueError, TypeError) as e:
        raise ApiError(422, "invalid cursor: pass next_cursor as it came",
                       details=[{"field": "cursor"}]) from e


@router.get("/runs", response_model=RunPage)
async def list_runs(request: Request, token: Reader,
                    status: Annotated[RunStatus | None, Query()] = None,
                    workflow: str | None = None,
                    parent: Annotated[str | None, Query(description="Children of this run.")
                                      ] = None,
                    created_after: Annotated[float | None, Query(
                        description="Unix seconds, inclusive.")] = None,
                    created_before: Annotated[float | None, Query(
                        description="Unix seconds, exclusive.")] = None,
                    cursor: str | None = None,
                    limit: Annotated[int, Query(ge=1, le=500)] = 50) -> RunPage:
    """The tenant's runs, newest first, a page at a time."""
    recs = await tokens.runs_page(
        _store(request), token.tenant_id, status=str(status) if status else None,
        workflow=workflow, parent=parent, created_after=created_after,
        created_before=created_before, cursor=_cursor(cursor), limit=limit + 1)
    more = len(recs) > limit
    recs = recs[:limit]
    next_cursor = None
    if more:
        last = recs[-1]
        next_cursor = base64.urlsafe_b64encode(
            json.dumps([last.created_at, last.run_id]).encode()).decode()
    return RunPage(runs=[_run(r) for r in recs], next_cursor=next_cursor)


@last.get("/runs/{run_id:path}", response_model=RunDetail)
async def get_run(run_id: str, request: Request, token: Reader) -> RunDetail:
    """A run: status, input, output, error, its model calls' tokens and cost, its children."""
    rec = await owned(request, run_id, token)
    store = _store(request)
    totals = (await store.llm_totals([run_id])).get(run_id)
    children = await tokens.runs_page(store, token.tenant_id, parent=run_id, limit=500)
    llm = LLMUsage(calls=totals.calls if totals else 0,
                   input_tokens=totals.input_tokens if totals else 0,
                   output_tokens=totals.output_tokens if totals else 0,
                   cost_usd=(None if totals and totals.unpriced_calls
                             else (totals.cost_usd if totals else 0.0)))
    return RunDetail(**_run(rec).model_dump(), llm=llm,
                     children=[ChildRun(run_id=c.run_id, workflow=c.workflow,
                                        status=str(c.status)) for c in children])


@router.get("/runs/{run_id:path}/result", response_model=RunResult,
            responses={202: {"model": RunResult, "description": "Still going after wait."}})
async def run_result(run_id: str, request: Request, response: Response, token: Reader,
                     wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S,
                                                  description="Seconds to wait.")] = 0
                     ) -> RunResult:
    """The run's outcome: 200 once finished; 202 if still going after ``wait`` seconds."""
    store = _store(request)
    deadline = time.monotonic() + wait
    while True:
        with store.watching(DONE, run_id) as finished:
            rec = await owned(request, run_id, token)
            left = deadline - time.monotonic()
            if rec.status.terminal or left <= 0:
                break
            # Woken by the finish; the cap re-reads in case a wake-up was lost.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), min(left, 5.0))
    if not rec.status.terminal:
        response.status_code = 202
    return RunResult(run_id=rec.run_id, status=str(rec.status), done=rec.status.terminal,
                     output=rec.output, error=rec.error)


@router.post("/runs/{run_id:path}/signals/{name}", response_model=StatusAfter, status_code=202)
async def send_signal(run_id: str, name: str, request: Request, token: Writer,
                      body: SignalBody | None = None) -> StatusAfter:
    """Deliver a signal; a run waiting for it wakes. 409 once the run has finished."""
    rec = await owned(request, run_id, token)
    await _app(request).signal_async(run_id, name, body.data if body else None)
    return StatusAfter(run_id=run_id, status=str(rec.status))


@router.post("/runs/{run_id:path}/cancel", response_model=StatusAfter, status_code=202)
async def cancel_run(run_id: str, request: Request, token: Writer) -> StatusAfter:
    """Cancel the run and its children (a running one at its worker's next renewal)."""
    await owned(request, run_id, token)
    status = await _app(request).cancel_async(run_id)
    return StatusAfter(run_id=run_id, status=str(status))


@router.post("/runs/{run_id:path}/approvals/{step_id:path}", response_model=DecisionMade)
async def decide(run_id: str, step_id: str, body: Decision, request: Request,
                 token: Writer) -> DecisionMade:
    """Approve or reject a pending approval, once; 409 if already decided or finished."""
    await owned(request, run_id, token)
    app = _app(request)
    if body.approved:
        made = await app.approve_async(run_id, step_id, by=body.by, comment=body.comment,
                                       grant=body.grant)
    else:
        if body.grant is not None:
            raise InvalidInput("a rejection grants nothing: give a grant only when approving")
        made = await app.reject_async(run_id, step_id, by=body.by, comment=body.comment)
    return DecisionMade(run_id=run_id, step_id=step_id, approved=made.approved, by=made.by,
                        comment=made.comment, grant=made.grant)
