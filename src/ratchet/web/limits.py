"""A request body over the limit is refused with 413 before it is read whole; a path or a
query string holding a NUL character is refused with 422 before any route sees it."""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY = 1 << 20  # 1 MiB: a run's input, a signal's payload
# A batch start carries up to MAX_BATCH runs, each with its input: its own, wider limit.
BATCH_PATH = "/v1/runs:batch"
MAX_BATCH_BODY = 64 << 20


def error_body(code: str, message: str, details: Any = None) -> bytes:
    """The one error shape (see :mod:`ratchet.web.errors`), written as the error handler's
    responses are, for the answers given here before any route runs."""
    body = {"error": code, "message": message, "details": details}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _too_large(limit: int) -> tuple[str, dict[str, int]]:
    return f"request body over {limit} bytes", {"limit": limit}


class _TooLarge(HTTPException):
    """Raised from ``receive`` mid-body: an HTTPException, so the framework passes it on
    as it is (rather than as a body it could not parse) to the one error handler, which
    answers with its ``details``, as the refusal of a Content-Length over the limit does."""

    def __init__(self, limit: int) -> None:
        message, self.details = _too_large(limit)
        super().__init__(413, message)


class BodyLimit:
    """ASGI middleware: Content-Length over ``limit`` is answered 413 at once; a chunked
    body is counted as it arrives and cut off at the limit."""

    def __init__(
        self, app: ASGIApp, limit: int = MAX_BODY, batch_limit: int = MAX_BATCH_BODY
    ) -> None:
        self.app = app
        self.limit = limit
        self.batch_limit = max(batch_limit, limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.batch_limit if scope.get("path") == BATCH_PATH else self.limit
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return await self._refuse(send, limit)
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(limit)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if not started:
                await self._refuse(send, limit)

    async def _refuse(self, send: Send, limit: int) -> None:
        data = error_body("payload_too_large", *_too_large(limit))
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})


class PlainTarget:
    """ASGI middleware: a NUL character in the path or the query string (``%00``) is
    answered 422. No name or id may hold one, and PostgreSQL text cannot even be compared
    with one, so it is refused here, once, rather than in every route."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            "\x00" in scope.get("path", "")
            or b"%00" in scope.get("query_string", b"")
            or b"\x00" in scope.get("query_string", b"")
        ):
            body = error_body(
                "invalid_input",
                "invalid request: the path or the query string contains a NUL character",
                [{"field": "path"}],
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 422,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
