"""The runtime routes a sandbox reports on (the isolated tier): the server side of the
report channel (:mod:`ratchet.sandbox.channel` serves them).

``POST /v1/runtime/report`` proposes the sandbox's journal writes (op=append), or its
run's end as the last event (op=finish); ``GET /v1/runtime/journal`` gives a starting
sandbox the journal it replays; ``POST /v1/runtime/llm`` asks the worker to make one of
the run's model calls. The bearer token is the sandbox's own, scoped to that run and that
sandbox (:mod:`ratchet.sandbox.grants`).

The sandbox proposes, the worker writes (:mod:`ratchet.sandbox.host`): a report is checked
whole against the step state machine before anything is written (else 422, nothing
written), then chained after the journal's head with the worker's clock and written under
the lease the sandbox was spawned under, so a sandbox that is no longer its run's current
one is refused by the store's own fence (409 ``fenced``) and writes nothing. The run's
row takes its output, error and dead-letter reason from the terminal event, and its
signed receipt is stored in the commit that ends it (the worker serving the channel
holds the app's signing key).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from ratchet.errors import (
    DriveAborted,
    DriveRefused,
    LeaseLost,
    LLMError,
    RunFinished,
    StorageError,
    StoreConflict,
    ValueRefused,
)
from ratchet.model import dumps
from ratchet.sandbox.grants import Grant, Grants
from ratchet.sandbox.report_check import Proposal
from ratchet.store.base import Store
from ratchet.web.errors import ApiError

router = APIRouter(prefix="/v1/runtime", tags=["runtime"])

_bearer = HTTPBearer(
    auto_error=False, description="The sandbox's own token (RATCHET_REPORT_TOKEN)."
)
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
MAX_EVENTS = 1000
T = TypeVar("T")


class ReportedEvent(BaseModel):
    """One event the sandbox's drive wrote: what it says happened. Its place in the
    journal (seq, hashes) and its time are the worker's."""

    kind: str = Field(min_length=1, max_length=64)
    step_id: str | None = Field(default=None, max_length=1000)
    attempt: int | None = Field(default=None, ge=1)
    payload_json: str = Field(description="The payload's canonical JSON.")


class Report(BaseModel):
    """Events of one write of the sandbox's drive, in order. A finish report's last event
    is the run's end (``run_succeeded {output}`` or ``run_failed {error, reason}``): the
    run's row is set from it."""

    run_id: str
    sandbox_id: str
    op: Literal["append", "finish"]
    events: list[ReportedEvent] = Field(max_length=MAX_EVENTS)


class ReportAccepted(BaseModel):
    accepted: int
    last_seq: int


class JournalEvent(BaseModel):
    seq: int
    kind: str
    step_id: str | None
    attempt: int | None
    payload_json: str
    at: float
    prev_hash: str
    hash: str


class Journal(BaseModel):
    run: dict[str, Any]
    events: list[JournalEvent]


class ModelCall(BaseModel):
    """A model call of the step's attempt, made by the worker with its own client: the
    one made at ``site`` of the app's code (``ratchet.llm.wrap``'s file, line and
    occurrence there), with the SDK method's keyword arguments."""

    run_id: str
    sandbox_id: str
    step_id: str = Field(max_length=1000)
    attempt: int = Field(ge=1)
    site: str = Field(min_length=1, max_length=4096)
    kwargs_json: str = Field(description="The call's keyword arguments, as JSON.")


class ModelAnswer(BaseModel):
    body: dict[str, Any]
    meta: dict[str, Any]


async def sandbox_grant(request: Request, creds: Bearer) -> Grant:
    """A dependency: the grant of the sandbox whose token this is."""
    if creds is None:
        raise ApiError(
            401, "missing bearer token: send Authorization: Bearer <token>", headers=_CHALLENGE
        )
    grants: Grants = request.app.state.grants
    found = grants.find(creds.credentials)
    if isinstance(found, str):
        raise ApiError(401, found, headers=_CHALLENGE)
    return found


Sandboxed = Annotated[Grant, Security(sandbox_grant)]


def _mine(grant: Grant, run_id: str, sandbox_id: str) -> None:
    if run_id != grant.run_id or sandbox_id != grant.sandbox_id:
        raise ApiError(
            403,
            f"this token is for sandbox {grant.sandbox_id} of run "
            f"{grant.run_id}, not sandbox {sandbox_id} of run {run_id}",
        )


def _proposals(report: Report) -> list[Proposal]:
    """The report's events, each a canonical JSON object; raises ApiError naming the first
    that is not."""
    if not report.events:
        raise ApiError(422, "a report carries at least one event")
    proposals = []
    for i, e in enumerate(report.events):
        try:
            payload = json.loads(e.payload_json)
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or dumps(payload) != e.payload_json:
            raise ApiError(422, f"event {i + 1}: payload_json is not a canonical JSON object")
        proposals.append(Proposal(e.kind, e.step_id, e.attempt, payload, e.payload_json))
    return proposals


async def _answer(grant: Grant, work: Awaitable[T]) -> T:
    """``work``'s result, or the refusal that says why not."""
    try:
        return await work
    except LeaseLost:
        raise ApiError(
            409,
            f"sandbox {grant.sandbox_id} is no longer the current sandbox of run {grant.run_id}",
            code="fenced",
        ) from None
    except RunFinished as e:
        raise ApiError(409, str(e), code="finished") from e
    except ValueRefused as e:
        raise ApiError(422, str(e)) from e
    except StoreConflict as e:
        raise ApiError(409, f"the journal refused the report: {e}") from e
    except DriveRefused as e:
        raise ApiError(409, f"the journal refused the report: {e}") from e
    except (StorageError, DriveAborted) as e:
        raise ApiError(503, f"the database is unavailable: {e}", code="unavailable") from e


@router.post("/report", response_model=ReportAccepted, status_code=200)
async def report(body: Report, grant: Sandboxed) -> ReportAccepted:
    """Propose a sandbox's journal write (op=append), or its run's end (op=finish)."""
    _mine(grant, body.run_id, body.sandbox_id)
    proposals = _proposals(body)
    last = await _answer(grant, grant.journal.propose(proposals, body.op == "finish"))
    return ReportAccepted(accepted=len(proposals), last_seq=last)


@router.post("/llm", response_model=ModelAnswer, status_code=200)
async def llm(body: ModelCall, grant: Sandboxed) -> ModelAnswer:
    """Make a model call of the run's step with the worker's own client and key, under
    the step's idempotency key and the run's budgets; the step's ``step_completed`` (the
    provider's usage and cost) is journaled before the answer goes back. A provider's
    refusal or failure answers 502 ``llm_error`` with what the SDK said."""
    _mine(grant, body.run_id, body.sandbox_id)
    try:
        kwargs = json.loads(body.kwargs_json)
    except ValueError:
        kwargs = None
    if not isinstance(kwargs, dict):
        raise ApiError(422, "kwargs_json is not a JSON object")
    try:
        answer = await _answer(
            grant, grant.journal.call_model(body.step_id, body.attempt, body.site, kwargs)
        )
    except LLMError as e:
        raise ApiError(
            502,
            str(e),
            code="llm_error",
            details={
                "type": type(e).__name__,
                "provider": e.provider,
                "status_code": e.status_code,
                "retry_after_s": e.retry_after_s,
                "request_id": e.request_id,
            },
        ) from e
    return ModelAnswer(**answer)


@router.get("/journal", response_model=Journal)
async def journal(request: Request, grant: Sandboxed) -> Journal:
    """The sandbox's run and its journal so far, for the harness to replay."""
    store: Store = request.app.state.store
    async with grant.journal.lock:
        try:
            run = await store.get_run(grant.run_id)
            events = await store.load_events(grant.run_id)
        except StorageError as e:
            raise ApiError(503, f"the database is unavailable: {e}", code="unavailable") from e
    if run is None:
        raise ApiError(404, f"unknown run id {grant.run_id!r}")
    return Journal(
        run=run.as_dict(),
        events=[
            JournalEvent(
                seq=e.seq,
                kind=e.kind,
                step_id=e.step_id,
                attempt=e.attempt,
                payload_json=e.payload_json or dumps(e.payload),
                at=e.at,
                prev_hash=e.prev_hash,
                hash=e.hash,
            )
            for e in events
        ],
    )
