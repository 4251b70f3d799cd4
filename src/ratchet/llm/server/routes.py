"""The HTTP face of the local provider: the model endpoints of both wire formats and the
``/_ratchet`` control endpoints, as a Starlette app.

Routes only translate: the provider decides what a request gets; a route sends it, in the
error shape of the API the path belongs to (Anthropic's for ``/v1/messages``, OpenAI's
otherwise), with that API's request id header.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from ratchet.llm.server.answer import Outcome
from ratchet.llm.server.connection import Droppable, drop
from ratchet.llm.server.script import FaultSpec, ScriptError, fault_spec


class Provider(Protocol):
    """What the routes ask of the provider behind them
    (:class:`ratchet.llm.server.provider.LocalProvider`, which builds its app from here)."""

    def arrived(self) -> None:
        """Count a model request whose body has arrived."""

    async def answer(self, endpoint: str, path: str, key: str | None, raw: bytes) -> Outcome:
        """Answer one model request."""
        ...

    def refuse(self, path: str, status: int, message: str) -> Outcome:
        """A request to no model endpoint, logged and counted as refused."""
        ...

    def stats(self) -> dict[str, int]:
        """The provider's counters."""
        ...

    def requests(self) -> list[dict[str, Any]]:
        """The request log, oldest first."""
        ...

    def add_fault(self, spec: FaultSpec) -> None:
        """Queue an already validated fault."""

    def pending_faults(self) -> list[dict[str, Any]]:
        """The faults still queued."""
        ...

    def reset(self) -> None:
        """Back to the state the provider started in."""


#: Model endpoint paths and the endpoint names used by rules, faults and the log.
MODEL_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
    "/v1/messages": "messages",
}
CONTROL_PATHS = {
    "/_ratchet/stats": "GET",
    "/_ratchet/requests": "GET",
    "/_ratchet/faults": "POST",
    "/_ratchet/reset": "POST",
    "/_ratchet/health": "GET",
}
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_OPENAI_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    404: ("invalid_request_error", "unknown_url"),
    405: ("invalid_request_error", "method_not_allowed"),
    422: ("invalid_request_error", "idempotency_key_reused"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
}


def build_app(provider: Provider) -> ASGIApp:
    """The ASGI app serving ``provider``."""

    async def model(request: Request) -> Response:
        path = request.url.path
        raw = await request.body()
        # Counted once the body is in: from here on the request is answered and logged even
        # if the client goes away, so a test that waits on ``received`` may kill the client.
        provider.arrived()
        key = request.headers.get("idempotency-key")
        # Shielded: once a request is in, it is answered, stored and billed even if the
        # client goes away and the server cancels the handler.
        task = asyncio.ensure_future(provider.answer(MODEL_PATHS[path], path, key, raw))
        task.add_done_callback(_retrieve)
        outcome = await asyncio.shield(task)
        if outcome.drop:
            await drop(request)
            return Response(status_code=204)  # never sent: the connection is gone
        return respond(path, outcome, request)

    async def stats(request: Request) -> Response:
        return JSONResponse(provider.stats())

    async def requests(request: Request) -> Response:
        return JSONResponse(provider.requests())

    async def faults(request: Request) -> Response:
        try:
            given = json.loads(await request.body())
            items = given if isinstance(given, list) else [given]
            specs = [fault_spec(**item) for item in items if isinstance(item, dict)]
            if len(specs) != len(items) or not specs:
                raise ScriptError(
                    "invalid fault: expected an object like "
                    '{"kind": "429", "times": 1} or a list of them'
                )
        except ValueError as e:  # ScriptError too
            return JSONResponse(
                {"error": {"message": str(e), "type": "invalid_request_error"}}, status_code=400
            )
        for spec in specs:
            provider.add_fault(spec)
        return JSONResponse({"pending": provider.pending_faults()})

    async def reset(request: Request) -> Response:
        provider.reset()
        return JSONResponse({"status": "reset"})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def elsewhere(request: Request) -> Response:
        path, method = request.url.path, request.method
        provider.arrived()
        known = {**dict.fromkeys(MODEL_PATHS, "POST"), **CONTROL_PATHS}
        if path in known:
            outcome = provider.refuse(
                path, 405, f"method {method} is not allowed on {path}: use {known[path]}"
            )
        else:
            outcome = provider.refuse(
                path,
                404,
                (
                    f"unknown path {method} {path}: this provider serves POST "
                    f"{', '.join(MODEL_PATHS)} (an OpenAI client's base_url ends in /v1; an "
                    "Anthropic client's is the bare server URL)"
                ),
            )
        return respond(path, outcome)

    control = {
        "/_ratchet/stats": stats,
        "/_ratchet/requests": requests,
        "/_ratchet/faults": faults,
        "/_ratchet/reset": reset,
        "/_ratchet/health": health,
    }
    routes = [Route(path, model, methods=["POST"]) for path in MODEL_PATHS]
    routes += [
        Route(path, handler, methods=[CONTROL_PATHS[path]]) for path, handler in control.items()
    ]
    routes.append(Route("/{rest:path}", elsewhere, methods=_ALL_METHODS))
    return Droppable(Starlette(routes=routes))


def respond(path: str, outcome: Outcome, request: Request | None = None) -> Response:
    """The HTTP response for an outcome, in the wire format of ``path``'s API (a stream cut
    short needs its ``request``, whose connection it closes)."""
    anthropic = path == "/v1/messages"
    headers = {**outcome.headers, "request-id" if anthropic else "x-request-id": outcome.request_id}
    answer = outcome.answer
    if answer is not None and answer.events is not None:
        cut = (outcome.cut_after, request) if outcome.cut_after is not None and request else None
        return StreamingResponse(
            _stream(answer.events, outcome.stall, cut),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )
    if answer is not None:
        return JSONResponse(answer.body, headers=headers)
    message = outcome.error or "error"
    body: dict[str, Any]
    if anthropic:
        body = {
            "type": "error",
            "request_id": outcome.request_id,
            "error": {
                "type": _ANTHROPIC_ERROR_TYPES.get(outcome.status, "api_error"),
                "message": message,
            },
        }
    else:
        kind, code = _OPENAI_ERROR_TYPES.get(outcome.status, ("server_error", None))
        body = {
            "error": {"message": message, "type": kind, "param": outcome.error_param, "code": code}
        }
    return JSONResponse(body, status_code=outcome.status, headers=headers)


async def _stream(
    events: tuple[bytes, ...],
    stall: tuple[int, float] | None,
    cut: tuple[int, Request] | None = None,
) -> AsyncIterator[bytes]:
    for n, event in enumerate(events):
        if stall is not None and n == stall[0]:
            await asyncio.sleep(stall[1])
        if cut is not None and n == cut[0]:
            await drop(cut[1])
            return
        yield event


def _retrieve(task: asyncio.Task[Outcome]) -> None:
    # A shielded answer whose handler was cancelled has nobody awaiting it: fetch its
    # exception here so it is not reported as never retrieved.
    if not task.cancelled():
        task.exception()
