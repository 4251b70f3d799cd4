"""``/v1/runs/{id}/events``: a run's journal as JSON pages, or as Server-Sent Events.

A stream is a replay plus a tail: the journal after the client's last seq, then what the
process's one reader of this run (:mod:`ratchet.api.tails`) reads on each of the store's
wake-ups (PostgreSQL: the journal trigger's NOTIFY, heard by the store's one listener per
process; SQLite: the commit in this process, or the store's one shared poll for other
processes). Seq is gapless and each run has one writer at a time, so taking ``seq > last``
misses nothing and repeats nothing, across reconnects too (``Last-Event-ID``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from ratchet.api.runs import ERRORS, Reader, owned
from ratchet.api.schemas import EventPage, JournalEvent
from ratchet.api.tails import PAGE, TERMINAL
from ratchet.model import Event, RunRecord
from ratchet.store import Store, tenants
from ratchet.store.tokens import Token
from ratchet.web.errors import ApiError

router = APIRouter(prefix="/v1", tags=["events"], responses=ERRORS)


def event_dict(ev: Event, tenant: str) -> dict[str, Any]:
    """The event as ``tenant`` reads it: its run ids the tenant's own."""
    payload = ev.payload
    child = payload.get("child_run_id")
    if isinstance(child, str):
        payload = {**payload, "child_run_id": tenants.external_id(tenant, child)}
    return {
        "run_id": tenants.external_id(tenant, ev.run_id),
        "seq": ev.seq,
        "kind": ev.kind,
        "step_id": ev.step_id,
        "attempt": ev.attempt,
        "payload": payload,
        "at": ev.at,
    }


def frame(ev: Event, tenant: str = tenants.DEFAULT_TENANT) -> bytes:
    """The event as one Server-Sent Events frame, as ``tenant`` reads it."""
    data = json.dumps(event_dict(ev, tenant), separators=(",", ":"), ensure_ascii=False)
    return f"id: {ev.seq}\nevent: {ev.kind}\ndata: {data}\n\n".encode()


ENDED = b": the token was revoked or has expired\n\n"


async def _stream(
    request: Request, rec: RunRecord, token: Token, after: int
) -> AsyncIterator[bytes]:
    state = request.app.state
    state.metrics.sse_subscribers.inc()
    encode = functools.partial(frame, tenant=rec.tenant_id)
    try:
        with (
            state.token_watch.watching(token) as watched,
            state.tails.subscribe(rec.run_id, encode) as tail,
        ):
            watched.on_end(tail.wake)
            async for frames in tail.follow(after, state.heartbeat_s, stop=lambda: watched.ended):
                # None: nothing happened for a heartbeat interval.
                yield b": heartbeat\n\n" if frames is None else frames
            if watched.ended:
                yield ENDED
    finally:
        state.metrics.sse_subscribers.dec()


# The largest seq a journal can hold (a bigint on PostgreSQL, SQLite's integer).
MAX_SEQ = 2**63 - 1
_SEQ = re.compile(r"[0-9]{1,19}")


@router.get(
    "/runs/{run_id:path}/events",
    response_model=EventPage,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "JSON pages, or SSE with Accept: text/event-stream.",
        }
    },
)
async def run_events(
    run_id: str,
    request: Request,
    token: Reader,
    after_seq: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    limit: Annotated[int, Query(ge=1, le=PAGE)] = 100,
    accept: Annotated[str | None, Header()] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Any:
    """The run's journal after ``after_seq``: a JSON page, or with ``Accept:
    text/event-stream`` a live stream (``id`` = seq, ``event`` = kind, ``data`` = the event)
    that resumes after ``Last-Event-ID`` and ends after the terminal event, or when its
    token is revoked or expires."""
    rec = await owned(request, run_id, token)
    store: Store = request.app.state.store
    if accept and "text/event-stream" in accept:
        after = after_seq
        if last_event_id:
            seq = last_event_id.strip()
            if not _SEQ.fullmatch(seq) or int(seq) > MAX_SEQ:
                raise ApiError(
                    422,
                    f"invalid Last-Event-ID {last_event_id[:40]!r}: expected a seq, 0 to {MAX_SEQ}",
                    details=[{"field": "Last-Event-ID"}],
                )
            after = int(seq)
        return StreamingResponse(
            _stream(request, rec, token, after),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    events = await store.load_events(rec.run_id, after_seq, limit)
    return EventPage(
        events=[JournalEvent(**event_dict(e, rec.tenant_id)) for e in events],
        next_after_seq=events[-1].seq if events else after_seq,
        done=any(e.kind in TERMINAL for e in events),
    )
