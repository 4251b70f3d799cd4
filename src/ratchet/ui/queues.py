"""The dashboard's queues page: every queue of the fleet, its depth, runs in flight and
limits. Queues are fleet-wide, so only an admin session of the default tenant sees it (as
``GET /v1/queues``); their limits change through the API or ``ratchet queues set``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ratchet.ui.pages import _page, _session, _store, _to_signin, _user

router = APIRouter(include_in_schema=False)


@router.get("/queues", response_class=HTMLResponse)
async def queues_page(request: Request) -> Response:
    """The queues and their limits (an operator's page)."""
    found = await _session(request)
    if found is None:
        return _to_signin(request)
    token, secret = found
    user = _user(token, secret)
    if not user["operator"]:
        message = "Queues are fleet-wide: only an admin of the default tenant sees them."
        context = {"user": user, "heading": "Not allowed", "message": message}
        return _page(request, "missing.html", context, 403)
    views = await _store(request).list_queues()
    return _page(request, "queues.html", {"user": user, "queues": views})
