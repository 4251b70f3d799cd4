"""``/v1/runs``: start, list, read, wait for, signal, cancel and decide approvals of runs.
Every route reads the run through :func:`owned`, so another tenant's run is a 404 exactly
like a missing one. Run ids are the tenant's own (:mod:`ratchet.store.tenants`): a route
finds the engine's run for the id in its path, acts on it, and answers with the tenant's
ids again (:func:`shown`)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import math
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response

from ratchet.api.auth import allows, decider, scope
from ratchet.api.guard_policy import authorised
from ratchet.api.schemas import (
    BatchRunAccepted,
    ChildRun,
    Decision,
    DecisionMade,
    DriveOut,
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
from ratchet.engine.start_options import Debounce, parse_start_at, start_options
from ratchet.engine.starts import RunRequest
from ratchet.errors import ApprovalNotPending, BatchItemInvalid, InvalidInput, RatchetError
from ratchet.model import RunRecord, RunStatus, drives, duration, failure, given_input
from ratchet.model.starts import StartPlan
from ratchet.names import MAX_RUN_PATH, MAX_SIGNAL, MAX_STEP, MAX_TAGS, MAX_WORKFLOW, parse_tag
from ratchet.store import Store, dashboard, tenants, tokens
from ratchet.store.base import DONE
from ratchet.store.tokens import Token
from ratchet.web.errors import ApiError, not_found, speak

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Error} for code in (400, 401, 403, 404, 409, 413, 422)
}
router = APIRouter(prefix="/v1", tags=["runs"], responses=ERRORS)
# A child run's id holds "/" (parent/step), so run ids are matched as paths; the bare
# /runs/{id} goes on a router included after every /runs/{id}/... route, which it would
# otherwise swallow.
last = APIRouter(prefix="/v1", tags=["runs"], responses=ERRORS)
Reader = Annotated[Token, Depends(scope("runs:read"))]
Writer = Annotated[Token, Depends(scope("runs:write"))]
MAX_WAIT_S = 60.0


def app_of(request: Request) -> Ratchet:
    """The Ratchet app this server serves."""
    app: Ratchet = request.app.state.ratchet
    return app


def store_of(request: Request) -> Store:
    """The opened store of the app this server serves."""
    store: Store = request.app.state.store
    return store


def check_path_id(run_id: str, what: str = "run id") -> str:
    """A run id from a path or a query, before it reaches the database: 422 for one no
    run can have (too long, or with a control character such as NUL, which PostgreSQL
    text cannot even be compared with)."""
    if len(run_id) > MAX_RUN_PATH or any(c < " " or c == "\x7f" for c in run_id):
        problem = (
            f"over {MAX_RUN_PATH} characters"
            if len(run_id) > MAX_RUN_PATH
            else "it contains a control character"
        )
        raise ApiError(422, f"invalid {what}: {problem}", details=[{"field": what}])
    return run_id


async def owned(request: Request, run_id: str, token: Token) -> RunRecord:
    """The run, if it exists and is the token's tenant's; else 404 (the same either way).
    The record carries the engine's run id; answer with :func:`shown`."""
    check_path_id(run_id)
    rec = await tenants.find_run(store_of(request), token.tenant_id, run_id)
    if rec is None:
        raise not_found(run_id)
    return rec


def shown(token: Token, run_id: str) -> str:
    """The engine's ``run_id`` as ``token``'s tenant knows it."""
    return tenants.external_id(token.tenant_id, run_id)


def shown_or_none(token: Token, run_id: str | None) -> str | None:
    return None if run_id is None else tenants.external_id(token.tenant_id, run_id)


def _run(rec: RunRecord, token: Token) -> Run:
    return Run(
        run_id=shown(token, rec.run_id),
        workflow=rec.workflow,
        workflow_version=rec.workflow_version,
        status=str(rec.status),
        input=given_input(rec.input),
        output=rec.output,
        error=None if rec.error is None else tenants.external_text(token.tenant_id, rec.error),
        parent_run_id=shown_or_none(token, rec.parent_run_id),
        queue=rec.queue,
        created_at=rec.created_at,
        updated_at=rec.updated_at,
        tags=rec.tags,
        forked_from=shown_or_none(token, rec.forked_from),
        forked_at=rec.forked_at,
        concurrency_key=(
            None
            if rec.concurrency_key is None
            else tenants.external_key(token.tenant_id, rec.concurrency_key)
        ),
    )


@router.post(
    "/runs",
    status_code=202,
    response_model=RunAccepted,
    responses={
        200: {"model": RunAccepted, "description": "The run existed already (same run_id or key)."}
    },
)
async def start_run(
    body: StartRun,
    request: Request,
    response: Response,
    token: Writer,
    idempotency_key: Annotated[
        str | None, Header(description="Same key, same run; a different body is refused 422.")
    ] = None,
) -> RunAccepted:
    """Queue a run and return at once: 202 when created, 200 when it existed. Guard
    overrides that raise or switch off the workflow's guards need the admin scope."""
    app = app_of(request)
    run_id = body.run_id
    if run_id is None and idempotency_key is not None:
        run_id = _keyed_run_id(token.tenant_id, idempotency_key)
    guards = await authorised(app, store_of(request), token, body.workflow, body.guards)
    try:
        r = _request(app, body, run_id, guards, token.tenant_id)
        rec, created = await app.start_run_async(
            r.workflow,
            r.args,
            r.kwargs,
            run_id=run_id,
            queue=body.queue,
            tenant=token.tenant_id,
            guards=guards,
            tags=body.tags,
            plan=r.plan,
            concurrency_key=r.concurrency_key,
        )
    except InvalidInput as e:
        raise ApiError(422, speak(request, str(e)), details={"workflow": body.workflow}) from e
    _mine(rec, token)
    if created:
        request.app.state.metrics.runs_started.inc()
    else:
        response.status_code = 200
    return RunAccepted(run_id=shown(token, rec.run_id), status=str(rec.status))


def _mine(rec: RunRecord, token: Token) -> None:
    # Scoped ids make another tenant's run unreachable from a start; were that ever to
    # break, the answer is an error of ours, not the other run.
    if rec.tenant_id != token.tenant_id:
        raise RatchetError(f"a start of tenant {token.tenant_id!r} reached a run of another tenant")


def _keyed_run_id(tenant: str, key: str) -> str:
    # The key names the run, so a repeat finds it and a different body conflicts with it,
    # with nothing else to store. The id lives in the tenant's namespace like any other:
    # knowing how it is made tells nothing of another tenant's runs.
    digest = hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()
    return f"idem-{digest[:40]}"


def _request(
    app: Ratchet,
    body: StartRun,
    run_id: str | None,
    guards: dict[str, Any] | None,
    token_tenant: str,
) -> RunRequest:
    """A start's body as the app takes it: a graph's input is its one argument, a code
    workflow's its arguments by name, checked strictly here (JSON input: ``true`` is no
    ``int``), where a Python caller's values would be coerced."""
    workflow = app.workflows.get(body.workflow)
    graph = workflow is None
    if workflow is not None:
        workflow.check_json(body.input)
    args: tuple[Any, ...] = (body.input,) if graph else ()
    kwargs: dict[str, Any] = {} if graph else body.input
    key = body.concurrency_key
    if key is not None:
        key = tenants.scoped_key(token_tenant, key)
    return RunRequest(
        body.workflow,
        args,
        kwargs,
        run_id,
        body.queue,
        0,
        guards,
        body.tags,
        plan=_plan(body),
        concurrency_key=key,
    )


def _plan(body: StartRun) -> StartPlan | None:
    """A start's dedup id, debounce and time to begin at, checked (naming the field). The
    run id an Idempotency-Key makes is no run id the caller chose: a debounced start takes
    one (its repeat pushes the same run)."""
    return start_options(
        dedup_id=body.dedup_id,
        debounce=None
        if body.debounce is None
        else Debounce(key=body.debounce.key, wait_s=body.debounce.wait_s),
        start_at=None if body.start_at is None else parse_start_at(body.start_at),
        delay_s=body.delay_s,
        run_id=body.run_id,
    )


@router.post(
    "/runs:batch",
    status_code=202,
    response_model=RunsAccepted,
    responses={200: {"model": RunsAccepted, "description": "Every run existed already."}},
)
async def start_runs(
    body: StartRuns,
    request: Request,
    response: Response,
    token: Writer,
    idempotency_key: Annotated[
        str | None,
        Header(
            description="Same key, same runs: item i without a run_id is the "
            "run POST /v1/runs would start under the key "
            "'<key>#<i>'; a different body is refused 422."
        ),
    ] = None,
) -> RunsAccepted:
    """Queue many runs in one transaction and return at once, their ids and statuses in
    the order asked: 202 when any was created, 200 when all existed. A bad item is refused
    422 naming ``runs[i].field``, and then nothing is written; guard overrides that raise
    or switch off a workflow's guards need the admin scope (403 naming the item)."""
    app = app_of(request)
    store = store_of(request)
    requests = []
    for i, item in enumerate(body.runs):
        if item.concurrency_key is None and body.concurrency_key is not None:
            item = item.model_copy(update={"concurrency_key": body.concurrency_key})
        run_id = item.run_id
        if run_id is None and idempotency_key is not None:
            run_id = _keyed_run_id(token.tenant_id, f"{idempotency_key}#{i}")
        guards = (
            item.guards
            if item.guards is None
            else await authorised(
                app, store, token, item.workflow, item.guards, f"runs[{i}].guards"
            )
        )
        try:
            requests.append(_request(app, item, run_id, guards, token.tenant_id))
        except InvalidInput as e:
            field, problem = f"runs[{i}].{e.field or 'input'}", speak(request, str(e))
            raise ApiError(
                422, f"{field}: {problem}", details=[{"field": field, "message": problem}]
            ) from e
    try:
        started = await app.start_runs_async(requests, tenant=token.tenant_id)
    except BatchItemInvalid as e:
        field = f"runs[{e.index}].{e.field}"
        problem = speak(request, e.problem)
        raise ApiError(
            422, f"{field}: {problem}", details=[{"field": field, "message": problem}]
        ) from e
    created = sum(fresh for _, _, fresh in started)
    if created:
        request.app.state.metrics.runs_started.inc(created)
    else:
        response.status_code = 200
    return RunsAccepted(
        runs=[
            BatchRunAccepted(run_id=shown(token, run_id), status=str(status), created=fresh)
            for run_id, status, fresh in started
        ]
    )


def _cursor(text: str | None) -> tuple[float, str] | None:
    if not text:
        return None
    try:
        at, run_id = json.loads(base64.urlsafe_b64decode(text.encode()))
        at, run_id = float(at), str(run_id)
        check_path_id(run_id)
        if not math.isfinite(at):
            raise ValueError("not a time")
        return at, run_id
    except (ValueError, TypeError, ApiError) as e:
        raise ApiError(
            422, "invalid cursor: pass next_cursor as it came", details=[{"field": "cursor"}]
        ) from e


# Unix seconds from year 1 to year 9999: what both databases' timestamps can hold.
UnixTime = Annotated[float | None, Query(ge=-62135596800, le=253402300799, allow_inf_nan=False)]


def tag_filter(given: list[str] | None) -> dict[str, str] | None:
    """``?tag=k=v`` filters as one mapping (all of them must match); 422 naming the one
    that no run's tag could match."""
    if not given:
        return None
    if len(given) > MAX_TAGS:
        raise ApiError(
            422,
            f"invalid tag filter: {len(given)} tags, over the limit of {MAX_TAGS} a run can have",
            details=[{"field": "tag"}],
        )
    tags: dict[str, str] = {}
    for text in given:
        try:
            key, value = parse_tag(text)
        except InvalidInput as e:
            raise ApiError(422, str(e), details=[{"field": "tag"}]) from e
        if tags.setdefault(key, value) != value:
            raise ApiError(
                422,
                f"invalid tag filter: {key!r} given twice with different values "
                "(a run has one value per tag)",
                details=[{"field": "tag"}],
            )
    return tags


@router.get("/runs", response_model=RunPage)
async def list_runs(
    request: Request,
    token: Reader,
    status: Annotated[RunStatus | None, Query()] = None,
    workflow: Annotated[str | None, Query(max_length=MAX_WORKFLOW)] = None,
    parent: Annotated[
        str | None, Query(description="Children of this run.", max_length=MAX_RUN_PATH)
    ] = None,
    tag: Annotated[
        list[str] | None,
        Query(
            description="key=value: only runs with this tag; repeat it for runs with all of them.",
        ),
    ] = None,
    created_after: Annotated[UnixTime, Query(description="Unix seconds, inclusive.")] = None,
    created_before: Annotated[UnixTime, Query(description="Unix seconds, exclusive.")] = None,
    cursor: Annotated[str | None, Query(max_length=4 * MAX_RUN_PATH)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> RunPage:
    """The tenant's runs, newest first, a page at a time."""
    store = store_of(request)
    parent_id = None
    if parent is not None:
        found = await tenants.find_run(store, token.tenant_id, check_path_id(parent, "parent"))
        if found is None:
            return RunPage(runs=[], next_cursor=None)
        parent_id = found.run_id
    if workflow is not None and "\x00" in workflow:
        raise ApiError(
            422, "invalid workflow: it contains a NUL character", details=[{"field": "workflow"}]
        )
    recs = await tokens.runs_page(
        store,
        token.tenant_id,
        status=str(status) if status else None,
        workflow=workflow,
        parent=parent_id,
        tags=tag_filter(tag),
        created_after=created_after,
        created_before=created_before,
        cursor=_cursor(cursor),
        limit=limit + 1,
    )
    more = len(recs) > limit
    recs = recs[:limit]
    next_cursor = None
    if more:
        last = recs[-1]
        next_cursor = base64.urlsafe_b64encode(
            json.dumps([last.created_at, last.run_id]).encode()
        ).decode()
    return RunPage(runs=[_run(r, token) for r in recs], next_cursor=next_cursor)


@last.get("/runs/{run_id:path}", response_model=RunDetail)
async def get_run(run_id: str, request: Request, token: Reader) -> RunDetail:
    """A run: status, input (as it was given), output, error and the failure's traceback,
    its duration, its model calls' tokens and cost, its drives (who drove it and why each
    ended), its children."""
    rec = await owned(request, run_id, token)
    store = store_of(request)
    totals = (await store.llm_totals([rec.run_id])).get(rec.run_id)
    children = await tokens.runs_page(store, token.tenant_id, parent=rec.run_id, limit=500)
    events = await dashboard.timeline_events(store, rec.run_id)
    failed_step, trace = failure(events)
    llm = LLMUsage(
        calls=totals.calls if totals else 0,
        input_tokens=totals.input_tokens if totals else 0,
        output_tokens=totals.output_tokens if totals else 0,
        cost_usd=(
            None if totals and totals.unpriced_calls else (totals.cost_usd if totals else 0.0)
        ),
    )
    return RunDetail(
        **_run(rec, token).model_dump(),
        llm=llm,
        children=[
            ChildRun(run_id=shown(token, c.run_id), workflow=c.workflow, status=str(c.status))
            for c in children
        ],
        duration_s=duration(events),
        drives=[DriveOut(**d.as_dict()) for d in drives(events)],
        failed_step=failed_step,
        traceback=None if trace is None else tenants.external_text(token.tenant_id, trace),
    )


@router.get(
    "/runs/{run_id:path}/result",
    response_model=RunResult,
    responses={202: {"model": RunResult, "description": "Still going after wait."}},
)
async def run_result(
    run_id: str,
    request: Request,
    response: Response,
    token: Reader,
    wait: Annotated[
        float, Query(ge=0, le=MAX_WAIT_S, allow_inf_nan=False, description="Seconds to wait.")
    ] = 0,
) -> RunResult:
    """The run's outcome: 200 once finished; 202 if still going after ``wait`` seconds."""
    store = store_of(request)
    deadline = time.monotonic() + wait
    rec: RunRecord | None = await owned(request, run_id, token)
    assert rec is not None
    internal = rec.run_id
    while not rec.status.terminal and deadline > time.monotonic():
        with store.watching(DONE, internal) as finished:
            # Read again once watching: a finish after the first read wakes this wait.
            rec = await store.get_run(internal)
            if rec is None:
                raise not_found(run_id)
            left = deadline - time.monotonic()
            if rec.status.terminal or left <= 0:
                break
            # Woken by the finish; the cap re-reads in case a wake-up was lost.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), min(left, 5.0))
    if not rec.status.terminal:
        response.status_code = 202
    return RunResult(
        run_id=shown(token, rec.run_id),
        status=str(rec.status),
        done=rec.status.terminal,
        output=rec.output,
        error=None if rec.error is None else tenants.external_text(token.tenant_id, rec.error),
    )


@router.post("/runs/{run_id:path}/signals/{name}", response_model=StatusAfter, status_code=202)
async def send_signal(
    run_id: str,
    name: Annotated[str, Path(max_length=MAX_SIGNAL)],
    request: Request,
    token: Writer,
    body: SignalBody | None = None,
) -> StatusAfter:
    """Deliver a signal; a run waiting for it wakes (answered with its status after the
    signal: ``queued`` when it woke). 409 once the run has finished."""
    rec = await owned(request, run_id, token)
    await app_of(request).signal_async(rec.run_id, name, body.data if body else None)
    # The status after the signal: queued when it woke a run that waited for it.
    after = await store_of(request).get_run(rec.run_id)
    status = rec.status if after is None else after.status
    return StatusAfter(run_id=shown(token, rec.run_id), status=str(status))


@router.post("/runs/{run_id:path}/cancel", response_model=StatusAfter, status_code=202)
async def cancel_run(run_id: str, request: Request, token: Writer) -> StatusAfter:
    """Cancel the run and its children (a running one at its worker's next renewal)."""
    rec = await owned(request, run_id, token)
    status = await app_of(request).cancel_async(rec.run_id, by=decider(token))
    return StatusAfter(run_id=shown(token, rec.run_id), status=str(status))


@router.post("/runs/{run_id:path}/approvals/{step_id:path}", response_model=DecisionMade)
async def decide(
    run_id: str,
    step_id: Annotated[str, Path(max_length=MAX_STEP)],
    body: Decision,
    request: Request,
    token: Writer,
) -> DecisionMade:
    """Approve or reject a pending approval, once; 409 if already decided or finished.
    The decision is journaled as the token's (its name, else its id); a ``by`` in the
    body is kept beside it as a note."""
    rec = await owned(request, run_id, token)
    app = app_of(request)
    by, note = decider(token), body.by
    if body.grant is not None and not allows(token, "admin"):
        # A grant moves a run's limits; raising a limit takes an admin, as at start.
        raise ApiError(
            403,
            "a grant moves the run's limits: it needs the admin scope",
            details={"needed": "admin", "scopes": list(token.scopes)},
        )
    if not body.approved and body.grant is not None:
        raise InvalidInput("a rejection grants nothing: give a grant only when approving")
    try:
        if body.approved:
            made = await app.approve_async(
                rec.run_id,
                step_id,
                by=by,
                comment=body.comment,
                note=None if note == by else note,
                grant=body.grant,
            )
        else:
            made = await app.reject_async(
                rec.run_id, step_id, by=by, comment=body.comment, note=None if note == by else note
            )
    except ApprovalNotPending as e:
        if allows(token, "runs:read"):
            raise
        # Who decided, and what they wrote, are the run's to read.
        raise ApiError(
            409, f"approval {step_id!r} of run {run_id!r} is no longer pending; nothing changed"
        ) from e
    return DecisionMade(
        run_id=shown(token, rec.run_id),
        step_id=step_id,
        approved=made.approved,
        by=made.by,
        comment=made.comment,
        note=None if note == by else note,
        grant=made.grant,
    )
