"""``/v1/runs/{id}/events``: a run's journal as JSON pages, or as Server-Sent Events.

A stream is a replay plus a tail: the journal after the client's last seq, then what the
process's one reader of this run (:mod:`ratchet.api.tails`) reads on each of the store's
wake-ups (PostgreSQL: the journal trigger's NOTIFY, heard by the store's one listener per
process; SQLite: the commit in this process, or the store's one shared poll for other
processes). Seq is gapless and each run has one writer at a time, so taking ``seq > last``
misses nothing and repeats nothing, across reconnects too (``Last-Event-ID``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from ratchet.api.errors import ApiError
from ratchet.api.models import EventPage, JournalEvent
from ratchet.api.runs import ERRORS, Reader, owned
from ratchet.api.tails import PAGE, TERMINAL
from ratchet.model import Event
from ratchet.store import Store

router = APIRouter(prefix="/v1", tags=["events"], responses=ERRORS)


def event_dict(ev: Event) -> dict[str, Any]:
    return {"run_id": ev.run_id, "seq": ev.seq, "kind": ev.kind, "step_id": ev.step_id,
            "attempt": ev.attempt, "payload": ev.payload, "at": ev.at}


def frame(ev: Event) -> bytes:
    """The event as one Server-Sent Events frame."""
    data = json.dumps(event_dict(ev), separators=(",", ":"), ensure_ascii=False)
    return f"id: {ev.seq}\nevent: {ev.kind}\ndata: {data}\n\n".encode()


async def _stream(request: Request, run_id: str, after: int) -> AsyncIterator[bytes]:
    state = request.app.state
    state.metrics.sse_subscribers.inc()
    try:
        with state.tails.subscribe(run_id) as tail:
            async for frames in tail.follow(after, state.heartbeat_s):
                # None: nothing happened for a heartbeat interval.
                yield b": heartbeat\n\n" if frames is None else frames
    finally:
        state.metrics.sse_subscribers.dec()


@router.get("/runs/{run_id:path}/events", response_model=EventPage,
            responses={200: {"content": {"text/event-stream": {}},
                             "description": "JSON pages, or SSE with Accept: "
                                            "text/event-stream."}})
async def run_events(run_id: str, request: Request, token: Reader,
                     after_seq: Annotated[int, Query(ge=0)] = 0,
                     limit: Annotated[int, Query(ge=1, le=PAGE)] = 100,
                     accept: Annotated[str | None, Header()] = None,
                     last_event_id: Annotated[str | None, Header()] = None) -> Any:
    """The run's journal after ``after_seq``: a JSON page, or with ``Accept:
    text/event-stream`` a live stream (``id`` = seq, ``event`` = kind, ``data`` = the event)
    that resumes after ``Last-Event-ID`` and ends after the terminal event."""
    await owned(request, run_id, token)
    store: Store = request.app.state.store
    if accept and "text/event-stream" in accept:
        after = after_seq
        if last_event_id:
            if not last_event_id.strip().isdigit():
                raise ApiError(422, f"invalid Last-Event-ID {last_event_id!r}: expected a seq",
                               details=[{"field": "Last-Event-ID"}])
            after = int(last_event_id)
        return StreamingResponse(
            _stream(request, run_id, after), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    events = await store.load_events(run_id, after_seq, limit)
    return EventPage(events=[JournalEvent(**event_dict(e)) for e in events],
                     next_after_seq=events[-1].seq if events else after_seq,
                     done=any(e.kind in TERMINAL for e in events))


