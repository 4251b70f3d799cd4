"""The runtime routes a sandbox reports on (the isolated tier).

``POST /v1/runtime/report`` appends the sandbox's journal writes to its run's journal,
exactly as an in-process drive would have; ``GET /v1/runtime/journal`` gives a resuming
sandbox the journal it replays. The bearer token is the sandbox's own, scoped to that run
and that sandbox (:mod:`ratchet.sandbox.grants`). A report is checked whole before
anything is written: its events must continue the journal's hash chain from where the
last report left it (else 409, out of order), each hash must match its content, and only
step events go through ``append`` and only a terminal event through ``finish``. The
write itself goes under the lease the sandbox was spawned under, so a sandbox that is no
longer its run's current one is refused by the store's own fence (409) and writes
nothing. A run a sandbox ends gets its signed receipt in the commit that ends it, as an
in-process run does (the worker serving the channel holds the app's signing key).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from ratchet.api.errors import ApiError
from ratchet.engine.driver import receipt_for
from ratchet.errors import LeaseLost, RunFinished, StorageError, StoreConflict, ValueRefused
from ratchet.model import Event, EventKind, RunStatus, dumps, fold
from ratchet.receipts import Signer
from ratchet.sandbox.grants import Grant, Grants
from ratchet.store.base import Store

router = APIRouter(prefix="/v1/runtime", tags=["runtime"])

_bearer = HTTPBearer(auto_error=False,
                     description="The sandbox's own token (RATCHET_REPORT_TOKEN).")
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
MAX_EVENTS = 1000

# What a sandbox's drive may append; the run's end goes through op=finish only.
STEP_KINDS = frozenset({
    EventKind.RUN_STARTED, EventKind.RUN_RESUMED, EventKind.STEP_STARTED,
    EventKind.STEP_COMPLETED, EventKind.STEP_FAILED, EventKind.STEP_RETRYING,
    EventKind.STEP_WAITING, EventKind.TOOL_CALLED, "anomaly_detected", "confidence_evaluated",
    "confidence_gate_bypassed"})
TERMINAL = {"succeeded": EventKind.RUN_SUCCEEDED, "failed": EventKind.RUN_FAILED}


class ReportedEvent(BaseModel):
    seq: int = Field(ge=1)
    kind: str = Field(min_length=1, max_length=64)
    step_id: str | None = Field(default=None, max_length=1000)
    attempt: int | None = Field(default=None, ge=1)
    payload_json: str = Field(description="The payload's canonical JSON, as hashed.")
    at: float
    prev_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")


class Report(BaseModel):
    """Events of one write of the sandbox's drive, in order."""

    run_id: str
    sandbox_id: str
    op: Literal["append", "finish"]
    events: list[ReportedEvent] = Field(max_length=MAX_EVENTS)
    status: Literal["succeeded", "failed"] | None = None
    output: Any = None
    error: str | None = None
    dead_letter: str | None = Field(default=None, max_length=64)


class ReportAccepted(BaseModel):
    accepted: int
    last_seq: int


class Journal(BaseModel):
    run: dict[str, Any]
    events: list[ReportedEvent]


async def sandbox_grant(request: Request, creds: Bearer) -> Grant:
    """A dependency: the grant of the sandbox whose token this is."""
    if creds is None:
        raise ApiError(401, "missing bearer token: send Authorization: Bearer <token>",
                       headers=_CHALLENGE)
    grants: Grants = request.app.state.grants
    found = grants.find(creds.credentials)
    if isinstance(found, str):
        raise ApiError(401, found, headers=_CHALLENGE)
    return found


Sandboxed = Annotated[Grant, Security(sandbox_grant)]


def _events(grant: Grant, report: Report) -> list[Event]:
    """The report's events, each checked; raises ApiError naming the first problem."""
    if report.run_id != grant.run_id or report.sandbox_id != grant.sandbox_id:
        raise ApiError(403, f"this token is for sandbox {grant.sandbox_id} of run "
                            f"{grant.run_id}, not sandbox {report.sandbox_id} of run "
                            f"{report.run_id}")
    if not report.events:
        raise ApiError(422, "a report carries at least one event")
    events: list[Event] = []
    for i, e in enumerate(report.events):
        try:
            payload = json.loads(e.payload_json)
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or dumps(payload) != e.payload_json:
            raise ApiError(422, f"event {e.seq}: payload_json is not a canonical JSON object")
        ev = Event(grant.run_id, e.seq, e.kind, e.step_id, e.attempt, payload, round(e.at, 6),
                   e.prev_hash, e.hash, e.payload_json)
        if not ev.verify():
            raise ApiError(422, f"event {e.seq}: its hash does not match its content")
        last = i == len(report.events) - 1
        allowed = ({TERMINAL[report.status]} if report.op == "finish" and last
                   and report.status is not None else STEP_KINDS)
        if e.kind not in allowed:
            where = "as a run's end" if report.op == "finish" and last else "here"
            raise ApiError(422, f"event {e.seq}: kind {e.kind!r} cannot be reported {where}")
        events.append(ev)
    if report.op == "finish" and report.status is None:
        raise ApiError(422, "a finish report names its status: succeeded or failed")
    return events


def _check_order(grant: Grant, events: list[Event]) -> None:
    seq, head = grant.next_seq, grant.head
    for ev in events:
        if ev.seq != seq or ev.prev_hash != head:
            raise ApiError(409, f"report out of order: event {ev.seq} does not continue the "
                                f"journal (expected seq {seq} after hash {head[:12]}...)",
                           code="out_of_order", details={"expected_seq": seq})
        seq, head = seq + 1, ev.hash


@router.post("/report", response_model=ReportAccepted, status_code=200)
async def report(request: Request, body: Report, grant: Sandboxed) -> ReportAccepted:
    """Append a sandbox's journal write (op=append), or end its run (op=finish)."""
    events = _events(grant, body)
    store: Store = request.app.state.store
    async with grant.lock:  # one write at a time per sandbox, in the order they came
        _check_order(grant, events)
        try:
            if body.op == "append":
                await store.append(grant.lease, events)
            else:
                assert body.status is not None
                await store.finish(grant.lease, events, RunStatus(body.status), body.output,
                                   body.error, body.dead_letter,
                                   await _receipt(store, request.app.state.signer, grant,
                                                  events))
        except LeaseLost:
            raise ApiError(409, f"sandbox {grant.sandbox_id} is no longer the current "
                                f"sandbox of run {grant.run_id}", code="fenced") from None
        except RunFinished as e:
            raise ApiError(409, str(e), code="finished") from e
        except StoreConflict as e:
            raise ApiError(409, f"the journal refused the report: {e}") from e
        except ValueRefused as e:
            raise ApiError(422, str(e)) from e
        except StorageError as e:
            raise ApiError(503, f"the database is unavailable: {e}", code="unavailable") from e
        grant.next_seq, grant.head = events[-1].seq + 1, events[-1].hash
        if body.op == "finish":
            grant.finished = body.status
    return ReportAccepted(accepted=len(events), last_seq=events[-1].seq)


async def _receipt(store: Store, signer: Signer | None, grant: Grant, events: list[Event]
                   ) -> dict[str, Any] | None:
    """The signed receipt over the journal ``events`` end (None without a key). The
    journal is read once here, at the run's end: under the grant's lock no other write
    of this sandbox lands meanwhile, and a write of another is fenced off with this one."""
    if signer is None:
        return None
    run = await store.get_run(grant.run_id)
    if run is None:
        raise ApiError(404, f"unknown run id {grant.run_id!r}")
    journal = await store.load_events(grant.run_id)
    return receipt_for(signer, run, fold(grant.run_id, [*journal, *events]))


@router.get("/journal", response_model=Journal)
async def journal(request: Request, grant: Sandboxed) -> Journal:
    """The sandbox's run and its journal so far, for the harness to replay."""
    store: Store = request.app.state.store
    async with grant.lock:
        try:
            run = await store.get_run(grant.run_id)
            events = await store.load_events(grant.run_id)
        except StorageError as e:
            raise ApiError(503, f"the database is unavailable: {e}", code="unavailable") from e
        if run is None:
            raise ApiError(404, f"unknown run id {grant.run_id!r}")
        if events:
            grant.next_seq, grant.head = events[-1].seq + 1, events[-1].hash
    return Journal(run=run.as_dict(), events=[
        ReportedEvent(seq=e.seq, kind=e.kind, step_id=e.step_id, attempt=e.attempt,
                      payload_json=e.payload_json or dumps(e.payload), at=e.at,
                      prev_hash=e.prev_hash, hash=e.hash) for e in events])
