"""``/v1/runs/{id}/fork``, ``/resume`` and ``/v1/runs/{a}/diff/{b}``: forking a run from one
of its steps, resuming a cancelled run, and two runs side by side. Every run is read through
:func:`ratchet.api.runs.owned`, so another tenant's run is a 404 exactly like a missing
one, and a fork belongs to its source's tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from ratchet.api.auth import decider
from ratchet.api.runs import ERRORS, Reader, Writer, app_of, owned, shown
from ratchet.api.schemas import (
    ForkAccepted,
    ForkBody,
    Resumed,
    RunDiffOut,
    StepDiffOut,
    StepSideOut,
)
from ratchet.app.base import UNSET
from ratchet.errors import InvalidInput, NotCancelled
from ratchet.model import StepSide
from ratchet.names import MAX_RUN_PATH
from ratchet.web.errors import ApiError, speak

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERRORS)


@router.post("/runs/{run_id:path}/fork", response_model=ForkAccepted, status_code=202)
async def fork_run(run_id: str, body: ForkBody, request: Request, token: Writer) -> ForkAccepted:
    """Fork the run at its step ``at``: a new run of the same workflow (and tenant) whose
    journal starts with copies of the run's completed steps before ``at``, which replay at
    no cost, and which runs from ``at`` on; ``edit`` replaces outputs of ``at`` or of steps
    before it, ``input`` gives it other input. The run itself is not changed. 422 for a
    step the run does not have, an edit after ``at``, or input that does not fit."""
    rec = await owned(request, run_id, token)
    app = app_of(request)
    given = body.input if "input" in body.model_fields_set else UNSET
    try:
        fork = await app.fork_run_async(
            rec.run_id, body.at, input=given, edit=body.edit, by=decider(token), strict=True
        )
    except InvalidInput as e:
        field = e.field or "at"
        raise ApiError(422, speak(request, str(e)), details=[{"field": field}]) from e
    request.app.state.metrics.runs_started.inc()
    return ForkAccepted(
        run_id=shown(token, fork.run_id), forked_from=shown(token, rec.run_id), forked_at=body.at
    )


@router.post(
    "/runs/{run_id:path}/resume",
    response_model=Resumed,
    status_code=202,
    responses={409: {"description": "The run is not cancelled."}},
)
async def resume_run(run_id: str, request: Request, token: Writer) -> Resumed:
    """Queue a cancelled run again, under its own id: it goes on from its last completed
    step. 409 for a run that is not cancelled; nothing is written then."""
    rec = await owned(request, run_id, token)
    try:
        await app_of(request).resume_async(rec.run_id, by=decider(token))
    except NotCancelled as e:
        raise ApiError(409, speak(request, str(e))) from e
    return Resumed(run_id=shown(token, rec.run_id))


def _side(side: StepSide | None) -> StepSideOut | None:
    return None if side is None else StepSideOut(**side.as_dict())


@router.get("/runs/{a:path}/diff/{b:path}", response_model=RunDiffOut)
async def diff_runs(
    a: str,
    b: Annotated[str, Path(max_length=MAX_RUN_PATH)],
    request: Request,
    token: Reader,
) -> RunDiffOut:
    """Runs ``a`` and ``b`` (both the caller's) step by step, matched by step id: each
    ``same``, ``changed`` (outputs differ, or one failed), ``only_a`` or ``only_b``, with
    both sides' status, output, tokens, cost and duration."""
    ra = await owned(request, a, token)
    rb = await owned(request, b, token)
    found = await app_of(request).diff_async(ra.run_id, rb.run_id)
    return RunDiffOut(
        a=shown(token, ra.run_id),
        b=shown(token, rb.run_id),
        steps=[
            StepDiffOut(step_id=s.step_id, status=s.status, a=_side(s.a), b=_side(s.b))
            for s in found.steps
        ],
    )
