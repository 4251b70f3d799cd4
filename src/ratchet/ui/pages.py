"""The dashboard's pages: sign-in, the runs list and a run's waterfall.

Pages are rendered here (Jinja2) from the same store reads the API makes; their scripts
then talk to the API itself (``/v1/...``) on the session cookie, with the page's CSRF token
on every state-changing request. A run page carries its waterfall as JSON computed in
Python (:mod:`ratchet.api.timeline`), so the browser draws rows rather than folding events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates

from ratchet.api.auth import SESSION_COOKIE, allows, scope
from ratchet.api.events import ENDED
from ratchet.api.replay import waterfall_out
from ratchet.api.runs import owned
from ratchet.app import Ratchet
from ratchet.model import Event, EventKind, LLMTotals, RunRecord, RunStatus, given_input
from ratchet.model.requests import requests_of
from ratchet.names import MAX_STEP
from ratchet.store import Store, dashboard, sessions, tenants, tokens
from ratchet.store.base import DONE, READY
from ratchet.store.tokens import Token
from ratchet.ui import conversation, run_diff, tag_filters
from ratchet.web.errors import ApiError

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(include_in_schema=False)
PAGE_SIZE = 50
LIVE_POLL_S = 1.0  # the live list's probe interval, when no wake-up comes sooner
STATUSES = [str(s) for s in RunStatus]


def _when(at: float | None) -> str:
    if at is None:
        return ""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


templates.env.filters["when"] = _when
templates.env.filters["duration"] = _duration
# A run page embeds its waterfall: for thousands of rows, sorting every object's keys
# (Jinja's default for tojson) is time spent for nothing.
templates.env.policies["json.dumps_kwargs"] = {"sort_keys": False}


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


async def _session(request: Request) -> tuple[Token, str] | None:
    secret = request.cookies.get(SESSION_COOKIE)
    if not secret:
        return None
    token = await sessions.session_token(_store(request), secret)
    return (token, secret) if token is not None else None


def _to_signin(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/signin?{urlencode({'next': target})}", status_code=303)


def _same_origin(request: Request) -> bool:
    """A form post from another site (login CSRF) is refused: a browser sends Origin."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    default = {"http": 80, "https": 443}
    return (parts.scheme, parts.hostname, parts.port or default.get(parts.scheme)) == (
        request.url.scheme,
        request.url.hostname,
        request.url.port or default.get(request.url.scheme),
    )


# Scripts and styles from this server only (segments are placed with style attributes),
# and no framing: a page with Approve buttons must not be clickable through another site.
HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'",
}


def _page(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    return templates.TemplateResponse(
        request, name, context, status_code=status_code, headers=HEADERS
    )


def _user(token: Token, secret: str) -> dict[str, Any]:
    return {
        "tenant": token.tenant_id,
        "name": token.name or token.token_id,
        "csrf": sessions.csrf_token(secret),
        "can_write": allows(token, "runs:write"),
        "admin": allows(token, "admin"),
        # Fleet-wide pages (the queues) are the default tenant's admins' alone.
        "operator": allows(token, "admin") and token.tenant_id == tenants.DEFAULT_TENANT,
    }


# -- signing in and out ----------------------------------------------------------------------


def _next(target: str | None) -> str:
    # Only a path on this site: an absolute or scheme-relative URL would be an open redirect.
    if target and target.startswith("/") and not target.startswith("//"):
        return target
    return "/runs"


@router.get("/signin", response_class=HTMLResponse)
async def signin_page(request: Request, next: str | None = None) -> Response:
    """The sign-in form; ``next``: the dashboard page to go to afterwards."""
    return _page(request, "signin.html", {"next": _next(next), "error": None, "user": None})


async def _form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (the first value of each)."""
    fields = parse_qs((await request.body()).decode(errors="replace"))
    return {name: values[0] for name, values in fields.items()}


@router.post("/signin", response_class=HTMLResponse)
async def signin(request: Request) -> Response:
    """Trade an API token for a session cookie, then go to ``next``."""
    form = await _form(request)
    secret = form.get("token", "").strip()
    target = _next(form.get("next"))
    if not _same_origin(request):
        return _page(
            request,
            "signin.html",
            {"next": target, "user": None, "error": "sign-in from another site refused"},
            403,
        )
    token = await tokens.authenticate(_store(request), secret) if secret else None
    if token is None:
        # The form again, with the reason (a 200: a page, not an API refusal).
        return _page(
            request,
            "signin.html",
            {"next": target, "user": None, "error": "invalid, revoked or expired token"},
        )
    session = await sessions.open_session(_store(request), token)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        session,
        max_age=int(sessions.SESSION_TTL_S),
        httponly=True,
        samesite="strict",
        path="/",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/signout")
async def signout(request: Request) -> Response:
    """End the session (its row is deleted) and drop the cookie."""
    found = await _session(request)
    form = await _form(request)
    if found is not None:
        if not sessions.csrf_matches(found[1], form.get("csrf")):
            raise ApiError(403, "missing or wrong CSRF token: sign out from the dashboard")
        await sessions.close_session(_store(request), found[1])
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


# -- the runs list ---------------------------------------------------------------------------


def _cursor(text: str | None) -> tuple[float, str] | None:
    if not text:
        return None
    at, _, run_id = text.partition("~")
    try:
        return float(at), run_id
    except ValueError:
        return None


async def _list(
    request: Request,
    token: Token,
    status: str | None,
    workflow: str | None,
    q: str | None,
    cursor: str | None,
    tag: list[str] | None = None,
) -> dict[str, Any]:
    store = _store(request)
    if status not in STATUSES:
        status = None
    tags, tag_error = tag_filters.parse(tag)
    recs = await tokens.runs_page(
        store,
        token.tenant_id,
        status=status,
        workflow=workflow or None,
        text=q or None,
        tags=tags,
        cursor=_cursor(cursor),
        limit=PAGE_SIZE + 1,
    )
    more, recs = len(recs) > PAGE_SIZE, recs[:PAGE_SIZE]
    ids = [r.run_id for r in recs]
    steps, totals, counts, now = await asyncio.gather(
        dashboard.step_counts(store, ids),
        store.llm_totals(ids),
        dashboard.status_counts(store, token.tenant_id),
        store.now(),
    )
    shown_tags = [f"{k}={v}" for k, v in tags.items()]
    filters = {
        k: v
        for k, v in {"status": status, "workflow": workflow, "q": q, "tag": shown_tags}.items()
        if v
    }
    rows = []
    for r in recs:
        t = totals.get(r.run_id)
        end = r.updated_at if r.status.terminal else now
        rows.append(
            {
                "run": _shown(token, r),
                "duration": max(0.0, end - r.created_at),
                "steps": steps.get(r.run_id, 0),
                "tokens": t.tokens if t else 0,
                "cost": None if t is None else (None if t.unpriced_calls else t.cost_usd),
                "tags": tag_filters.adding(filters, r.tags),
            }
        )
    next_cursor = f"{recs[-1].created_at!r}~{recs[-1].run_id}" if more else None
    return {
        "rows": rows,
        "counts": counts,
        "total": sum(counts.values()),
        "statuses": STATUSES,
        "filters": filters,
        "tag_chips": tag_filters.removing(filters),
        "tag_error": tag_error,
        "next_url": tag_filters.url(filters | {"cursor": next_cursor}) if next_cursor else None,
        "first_url": tag_filters.url(filters) if cursor else None,
        "query": urlencode(filters | ({"cursor": cursor} if cursor else {}), doseq=True),
    }


TagQuery = Annotated[list[str] | None, Query()]  # ?tag=key=value, repeatable


@router.get("/", response_class=HTMLResponse)
@router.get("/runs", response_class=HTMLResponse)
async def runs_page(
    request: Request,
    status: str | None = None,
    workflow: str | None = None,
    q: str | None = None,
    cursor: str | None = None,
    tag: TagQuery = None,
) -> Response:
    """The runs list: counts by status, filters, a page of runs, the dead letters."""
    found = await _session(request)
    if found is None:
        return _to_signin(request)
    token, secret = found
    context = await _list(request, token, status, workflow, q, cursor, tag)
    letters = (
        [
            dataclasses.replace(d, run_id=tenants.external_id(token.tenant_id, d.run_id))
            for d in await tokens.dead_letters(_store(request), token.tenant_id, 100)
        ]
        if allows(token, "admin")
        else []
    )
    return _page(
        request, "runs.html", context | {"user": _user(token, secret), "dead_letters": letters}
    )


@router.get("/ui/runs/rows", response_class=HTMLResponse)
async def runs_rows(
    request: Request,
    token: Annotated[Token, Depends(scope("runs:read"))],
    status: str | None = None,
    workflow: str | None = None,
    q: str | None = None,
    cursor: str | None = None,
    tag: TagQuery = None,
) -> Response:
    """The list's table and counts alone, for the live page to swap in."""
    context = await _list(request, token, status, workflow, q, cursor, tag)
    return _page(request, "_runs_table.html", context)


Changed = tuple[str, float] | None  # the run that changed last, and when


class RunsProbe:
    """The live lists' probe, shared: however many list pages of one tenant this process
    serves, the tenant's runs are probed once per wake-up or interval, not once per page."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, Changed]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def probe(self, store: Store, tenant: str, since: float) -> Changed:
        """The tenant's latest change, from a probe begun at ``since`` (monotonic) or later:
        after a wake-up, one begun after it, so it sees the commit that woke the page."""
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            at, value = self._seen.get(tenant, (-math.inf, None))
            if at < since:
                at = time.monotonic()
                value = await dashboard.runs_changed(store, tenant)
                self._seen[tenant] = (at, value)
            return value


async def _woken(events: tuple[asyncio.Event, ...], timeout: float) -> bool:
    """Whether one of ``events`` was set within ``timeout`` seconds."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    done, pending = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return bool(done)


async def _changes(
    request: Request, token: Token, poll_s: float, seen: Changed
) -> AsyncIterator[bytes]:
    """``changed`` whenever the probe's answer moves from ``seen``; ends when the token
    is revoked or expires."""
    store = _store(request)
    probe: RunsProbe = request.app.state.runs_probe
    tenant = token.tenant_id
    # The first probe is a fresh one: a change since ``seen`` was probed woke nobody.
    beat = since = time.monotonic()
    with request.app.state.token_watch.watching(token) as watched:
        while not watched.ended and not await request.is_disconnected():
            # A run becoming claimable (a start, a retry) or finishing in this process, or
            # on PostgreSQL in any (LISTEN/NOTIFY), wakes the probe at once; what announces
            # neither (a run parking, another SQLite process's work) is found by the poll.
            with store.watching(DONE) as finished, store.watching(READY) as queued:
                now = await probe.probe(store, tenant, since)
                if now != seen:
                    changed = None if now is None else tenants.external_id(tenant, now[0])
                    data = json.dumps({"run_id": changed})
                    yield f"event: changed\ndata: {data}\n\n".encode()
                    seen, beat = now, time.monotonic()
                elif time.monotonic() - beat > request.app.state.heartbeat_s:
                    yield b": heartbeat\n\n"
                    beat = time.monotonic()
                # After a wake-up, a probe begun since (pages woken together share one, bar
                # those that wake while it runs); after a quiet interval, one at most half
                # old.
                woken = await _woken((finished, queued, watched.event), poll_s)
                since = time.monotonic() - (0 if woken else poll_s / 2)
        if watched.ended:
            yield ENDED


@router.get("/ui/runs/live")
async def runs_live(
    request: Request, token: Annotated[Token, Depends(scope("runs:read"))]
) -> Response:
    """Server-Sent Events: ``changed`` whenever the tenant's runs change after the stream
    opened (what they were then is probed before it answers, so a client that reads the
    list once it is open misses nothing)."""
    poll_s = float(request.app.state.live_poll_s)
    seen = await dashboard.runs_changed(_store(request), token.tenant_id)
    return StreamingResponse(
        _changes(request, token, poll_s, seen),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# -- two runs side by side ------------------------------------------------------------------
# Before a run's page: its route takes any path under /runs/, these included.


def _run_url(run_id: str, *rest: str) -> str:
    return "/".join(["/runs", quote(run_id), *(quote(r) for r in rest)])


@router.get("/runs/{run_a:path}/diff/{run_b:path}", response_class=HTMLResponse)
async def diff_page(request: Request, run_a: str, run_b: str) -> Response:
    """Two runs of the tenant's step by step: same, changed, or only in one, with each
    side's output, tokens, cost and duration."""
    found = await _session(request)
    if found is None:
        return _to_signin(request)
    token, secret = found
    user = _user(token, secret)
    try:
        a = await owned(request, run_a, token)
        b = await owned(request, run_b, token)
    except ApiError as e:
        return _page(request, "missing.html", {"user": user, "message": e.message}, e.status)
    app: Ratchet = request.app.state.ratchet
    diff = await app.diff_async(a.run_id, b.run_id)
    # Where one of the two was forked from the other, that step is marked.
    fork_point = (
        b.forked_at
        if b.forked_from == a.run_id
        else a.forked_at
        if a.forked_from == b.run_id
        else None
    )
    return _page(
        request,
        "diff.html",
        {
            "user": user,
            "a": _shown(token, a),
            "b": _shown(token, b),
            "diff": run_diff.view(diff, fork_point),
        },
    )


@router.get("/runs/{run_id:path}/diff", response_class=HTMLResponse)
async def diff_with(
    request: Request, run_id: str, with_: Annotated[str | None, Query(alias="with")] = None
) -> Response:
    """The run page's "diff with run" form: to the diff of this run and the one named
    (no run named: back to this run's page). No run id holds "/diff": a user's cannot
    hold "/", a child's ends in its step's number."""
    other = (with_ or "").strip()
    target = _run_url(run_id, "diff", other) if other else _run_url(run_id)
    return RedirectResponse(target, status_code=303)


# -- a run -----------------------------------------------------------------------------------


@router.get("/runs/{run_id:path}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: str) -> Response:
    """A run: its waterfall, the replay scrubber, its pending approvals and actions."""
    found = await _session(request)
    if found is None:
        return _to_signin(request)
    token, secret = found
    user = _user(token, secret)
    try:
        rec: RunRecord = await owned(request, run_id, token)
    except ApiError as e:
        return _page(request, "missing.html", {"user": user, "message": e.message}, e.status)
    app: Ratchet = request.app.state.ratchet
    store = _store(request)
    # Retry is offered only where it can work: a failed run with a dead-letter row (the
    # retry route re-queues nothing else), to a token that may retry. Only such a run costs
    # the extra read.
    may_retry = rec.status == RunStatus.FAILED and allows(token, "admin")
    wf, approvals, children, dead_lettered, totals = await asyncio.gather(
        waterfall_out(store, rec, None, compact=True),
        app.approvals_async(rec.run_id),
        tokens.runs_page(store, token.tenant_id, parent=rec.run_id, limit=500),
        dashboard.dead_lettered(store, rec.run_id) if may_retry else asyncio.sleep(0, False),
        store.llm_totals([rec.run_id]),
    )
    # The page speaks the tenant's run ids, as the API does.
    ext = functools.partial(tenants.external_id, token.tenant_id)
    approvals = [
        dataclasses.replace(
            a,
            run_id=ext(a.run_id),
            root_run_id=ext(a.root_run_id),
            parent_run_id=None if a.parent_run_id is None else ext(a.parent_run_id),
        )
        for a in approvals
    ]
    return _page(
        request,
        "run.html",
        {
            "user": user,
            "run": _shown(token, rec),
            "waterfall": wf,
            "approvals": approvals,
            "children": [_shown(token, c) for c in children],
            "dead_lettered": dead_lettered,
            "story": _story(rec, wf, totals.get(rec.run_id)),
            "fork_input": fork_form_input(app, rec),
        },
    )


def fork_form_input(app: Ratchet, rec: RunRecord) -> Any:
    """The input a fork form starts from: a code workflow's arguments by name, as a fork
    takes them (a run started with positional arguments shows them as a list), else the
    input as it was given (a graph's)."""
    wd = app.workflows.version_of(rec.workflow, rec.workflow_version)
    stored = rec.input
    if wd is None or not (isinstance(stored, dict) and set(stored) == {"args", "kwargs"}):
        return given_input(stored)
    try:
        return dict(wd.signature.bind_partial(*stored["args"], **stored["kwargs"]).arguments)
    except TypeError:  # a signature the stored input no longer fits
        return given_input(stored)


def _story(rec: RunRecord, wf: dict[str, Any], llm: LLMTotals | None) -> dict[str, Any]:
    """The top of a run's page: what it was given, what came of it, how long it took,
    what it spent, and who drove it (the drives, with why each ended)."""
    drives = wf["drives"]
    took = wf["end"] - drives[0]["start"] if drives and wf["end"] is not None else None
    if llm is None or not llm.calls:
        cost = "$0"
    elif llm.unpriced_calls == llm.calls:
        cost = "unpriced"
    else:
        more = f" (+{llm.unpriced_calls} unpriced)" if llm.unpriced_calls else ""
        cost = f"${llm.cost_usd:.6f}{more}"
    return {
        "input": given_input(rec.input),
        "duration": took,
        "tokens": llm.tokens if llm is not None else 0,
        "cost": cost,
        "drives": drives,
        "failed_step": wf["failed_step"],
        "traceback": wf["traceback"],
    }


def _shown(token: Token, rec: RunRecord) -> RunRecord:
    """``rec`` with its ids as its tenant knows them, for a page."""
    ext = functools.partial(tenants.external_id, token.tenant_id)
    return dataclasses.replace(
        rec,
        run_id=ext(rec.run_id),
        parent_run_id=None if rec.parent_run_id is None else ext(rec.parent_run_id),
        forked_from=None if rec.forked_from is None else ext(rec.forked_from),
    )


# -- a run's conversation --------------------------------------------------------------------

TURNS_PAGE = 50  # turns a conversation fragment holds; "More turns" fetches the next
CLIP = 4000  # a message's characters shown inline; the whole of it is in the raw JSON


async def _journal(request: Request, token: Token, run_id: str) -> tuple[RunRecord, list[Event]]:
    rec = await owned(request, run_id, token)
    return rec, await _store(request).load_events(rec.run_id)


@router.get("/ui/runs/{run_id:path}/conversation", response_class=HTMLResponse)
async def run_conversation(
    request: Request,
    run_id: str,
    token: Annotated[Token, Depends(scope("runs:read"))],
    step_id: Annotated[str | None, Query(min_length=1, max_length=MAX_STEP)] = None,
    after: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    """The run's model calls as a conversation, ``TURNS_PAGE`` turns from turn ``after``;
    with ``step_id``, that LLM step's turn alone with every message it was sent."""
    rec, events = await _journal(request, token, run_id)
    shown = conversation.turns(events, requests_of(events), whole=step_id)
    if step_id is not None and not shown:
        raise ApiError(404, f"run {run_id!r} has no model call {step_id!r}")
    page = shown[after : after + TURNS_PAGE]
    more = after + TURNS_PAGE if len(shown) > after + TURNS_PAGE else None
    # Errors and drift reports name runs as the engine does; the page speaks the tenant's ids.
    for turn in page:
        turn.drifts = [tenants.external_text(rec.tenant_id, d) for d in turn.drifts]
        for attempt in turn.attempts:
            if attempt.error is not None:
                attempt.error = tenants.external_text(rec.tenant_id, attempt.error)
    context = {
        "turns": page,
        "total": len(shown),
        "more": more,
        "whole": step_id is not None,
        "clip": CLIP,
    }
    return _page(request, "_conversation.html", context)


@router.get("/ui/runs/{run_id:path}/turn")
async def run_turn(
    request: Request,
    run_id: str,
    token: Annotated[Token, Depends(scope("runs:read"))],
    step_id: Annotated[str, Query(min_length=1, max_length=MAX_STEP)],
) -> dict[str, Any]:
    """One model call's raw JSON: the request as it was sent (its messages whole), the
    provider's response and what the journal says of the call (usage, cost, latency)."""
    _, events = await _journal(request, token, run_id)
    if not any(e.step_id == step_id and e.kind == EventKind.STEP_STARTED for e in events):
        raise ApiError(404, f"run {run_id!r} has no step {step_id!r}")
    completed = next(
        (
            e.payload
            for e in reversed(events)
            if e.step_id == step_id and e.kind == EventKind.STEP_COMPLETED
        ),
        {},
    )
    return {
        "step_id": step_id,
        "request": requests_of(events).get(step_id),
        "response": completed.get("output"),
        "llm": completed.get("llm"),
    }


# -- schedules -------------------------------------------------------------------------------


@router.get("/schedules", response_class=HTMLResponse)
async def schedules_page(request: Request) -> Response:
    """The tenant's schedules: when each fires, its last and next tick; pause, resume and
    trigger for an admin (through ``/v1/schedules``)."""
    found = await _session(request)
    if found is None:
        return _to_signin(request)
    token, secret = found
    app: Ratchet = request.app.state.ratchet
    rows = await app.schedules_async(tenant=token.tenant_id)
    return _page(request, "schedules.html", {"user": _user(token, secret), "schedules": rows})
