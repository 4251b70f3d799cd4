"""A run's state at any seq (the dashboard's replay scrubber), its waterfall and a step's
detail. The state is :func:`ratchet.model.fold`, the engine's own, over the journal cut at
the seq asked for: what the scrubber shows is what the engine would have computed then."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from ratchet.api.events import MAX_SEQ, event_dict
from ratchet.api.runs import ERRORS, Reader, owned, shown
from ratchet.api.schemas import (
    JournalEvent,
    LLMUsage,
    RunStateOut,
    StepDetail,
    StepStateOut,
    WaterfallOut,
)
from ratchet.api.timeline import SandboxSpan, as_compact, as_dict, waterfall
from ratchet.model import EventKind, RunRecord, StepState, answer_text, fold
from ratchet.model.requests import request_of
from ratchet.names import MAX_STEP
from ratchet.store import Store, dashboard, tenants
from ratchet.web.errors import ApiError

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERRORS)
AtSeq = Annotated[
    int | None,
    Query(
        ge=0,
        le=MAX_SEQ,
        description="Fold the events up to this seq; the whole journal when absent.",
    ),
]


def _step(s: StepState, tenant: str) -> StepStateOut:
    waiting = s.waiting
    if waiting is not None and isinstance(waiting.get("child_run_id"), str):
        waiting = {**waiting, "child_run_id": tenants.external_id(tenant, waiting["child_run_id"])}
    return StepStateOut(
        step_id=s.step_id,
        name=s.name,
        status=s.status,
        attempt=s.attempt,
        attempts_used=s.attempts_used,
        output=s.output,
        error=None if s.error is None else tenants.external_text(tenant, s.error),
        error_type=s.error_type,
        traceback=None if s.traceback is None else tenants.external_text(tenant, s.traceback),
        waiting=waiting,
        started_at=s.started_at,
        finished_at=s.finished_at,
        child_run_id=None
        if s.child_run_id is None
        else tenants.external_id(tenant, s.child_run_id),
        kind=s.kind,
        llm=s.llm,
    )


@router.get("/runs/{run_id:path}/state", response_model=RunStateOut)
async def run_state(
    run_id: str, request: Request, token: Reader, at_seq: AtSeq = None
) -> RunStateOut:
    """The run's state as the engine's fold computes it from its events up to ``at_seq``."""
    rec = await owned(request, run_id, token)
    store: Store = request.app.state.store
    events = await store.load_events(rec.run_id, 0, -1 if at_seq is None else at_seq)
    state = fold(rec.run_id, events)
    llm = state.llm
    tenant = rec.tenant_id
    return RunStateOut(
        run_id=shown(token, rec.run_id),
        last_seq=state.last_seq,
        status=str(state.status),
        output=state.output,
        error=None if state.error is None else tenants.external_text(tenant, state.error),
        drives=state.drives,
        steps=[_step(s, tenant) for s in state.steps.values()],
        llm=LLMUsage(
            calls=llm.calls,
            input_tokens=llm.input_tokens,
            output_tokens=llm.output_tokens,
            cost_usd=None if llm.unpriced_calls else llm.cost_usd,
        ),
    )


@router.get("/runs/{run_id:path}/waterfall", response_model=WaterfallOut)
async def run_waterfall(
    run_id: str, request: Request, token: Reader, at_seq: AtSeq = None
) -> WaterfallOut:
    """The run's steps as rows of attempts, backoffs and parked time, with its drive
    boundaries and guard events as markers; up to ``at_seq`` when given."""
    rec = await owned(request, run_id, token)
    return WaterfallOut.model_validate(await waterfall_out(request.app.state.store, rec, at_seq))


async def waterfall_out(
    store: Store, rec: RunRecord, at_seq: int | None, compact: bool = False
) -> dict[str, Any]:
    """The waterfall of the run's journal up to ``at_seq`` and of its sandboxes as JSON
    data, with its tenant's run ids, read in two queries (the route checks it against its
    model; a page embeds the ``compact`` form)."""
    events = await dashboard.timeline_events(store, rec.run_id, at_seq)
    # An indexed read by run id; empty unless the run is isolated.
    spans = [
        SandboxSpan(
            r.sandbox_id,
            r.attempt,
            r.started_at,
            r.ended_at,
            r.status,
            r.exit_code,
            r.signal,
            r.end_reason,
            r.peak_memory,
        )
        for r in await store.list_sandboxes(rec.run_id)
    ]
    until = None if at_seq is None or not events else events[-1].at
    form = as_compact if compact else as_dict
    view = waterfall(tenants.external_id(rec.tenant_id, rec.run_id), events, spans, until)
    for row in view.rows:
        if row.child_run_id is not None:
            row.child_run_id = tenants.external_id(rec.tenant_id, row.child_run_id)
    if view.traceback is not None:
        view.traceback = tenants.external_text(rec.tenant_id, view.traceback)
    return form(view) | {"now": await store.now()}


@router.get("/runs/{run_id:path}/step", response_model=StepDetail)
async def step_detail(
    run_id: str,
    request: Request,
    token: Reader,
    step_id: Annotated[str, Query(min_length=1, max_length=MAX_STEP)],
) -> StepDetail:
    """One step: its state, idempotency key, lease epoch, tokens, cost and raw events."""
    rec = await owned(request, run_id, token)
    store: Store = request.app.state.store
    events = await store.load_events(rec.run_id)
    state = fold(rec.run_id, events)
    step = state.steps.get(step_id)
    if step is None:
        raise ApiError(404, f"run {run_id!r} has no step {step_id!r}")
    epoch: int | None = None
    started: dict[str, object] | None = None
    started_epoch: int | None = None
    for ev in events:
        if ev.kind in (EventKind.RUN_STARTED, EventKind.RUN_RESUMED):
            epoch = ev.payload.get("epoch")
        elif ev.kind == EventKind.STEP_STARTED and ev.step_id == step_id:
            started, started_epoch = ev.payload, epoch
    usage = (step.llm or {}).get("usage") or {}
    cost = (step.llm or {}).get("cost_usd")
    key = started.get("idempotency_key") if started else None
    args_journaled = bool(started and "args" in started)
    args = started.get("args") if started else None
    if started and not args_journaled and "request" in started:
        # A model call journals its request (messages by digest) in place of its
        # arguments: the request resolved is what it was called with.
        args = request_of(events, step_id)
        args_journaled = args is not None
    return StepDetail(
        run_id=shown(token, rec.run_id),
        state=_step(step, rec.tenant_id),
        idempotency_key=str(key) if key else None,
        lease_epoch=started_epoch,
        input=started,
        args=args,
        args_journaled=args_journaled,
        answer=(
            answer_text(step.output) if step.kind == "llm" and step.status == "completed" else None
        ),
        tokens=(
            int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
            if step.llm
            else None
        ),
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
        events=[
            JournalEvent(**event_dict(e, rec.tenant_id)) for e in events if e.step_id == step_id
        ],
    )
