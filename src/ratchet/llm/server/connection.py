"""Closing a request's connection without an answer, for the ``drop`` fault.

ASGI has no message for "hang up", so the outermost layer of the app notes how to abort the
request's connection: uvicorn's ``send`` is a method of the request's cycle, which holds
the connection's transport. Another server leaves no such handle, and a drop fails there.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

_ABORT = "ratchet.abort"


class Droppable:
    """ASGI wrapper that records, in each HTTP scope, how to abort its connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            transport: Any = getattr(getattr(send, "__self__", None), "transport", None)
            abort = getattr(transport, "abort", None)
            if abort is not None:
                scope[_ABORT] = abort
        await self.app(scope, receive, send)


async def drop(request: Request) -> None:
    """Close the request's connection at once, unanswered, and wait until the server has
    seen it go (so it does not try to answer on it)."""
    abort = request.scope.get(_ABORT)
    if abort is None:
        raise RuntimeError(
            "cannot drop the connection: this ASGI server does not expose it "
            "(serve the local provider with uvicorn)"
        )
    abort()
    while (await request.receive())["type"] != "http.disconnect":
        pass
