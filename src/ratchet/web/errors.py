"""One error shape for every response the API refuses: ``{"error": code, "message": ...,
"details": ...}``. Ratchet's exceptions map to statuses here, once; anything unexpected is
logged and answered 500 without a stack trace."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ratchet.errors import (
    ApprovalNotPending,
    DuplicateStart,
    InvalidInput,
    JournalPruned,
    NotCancelled,
    NotDeadLettered,
    RatchetError,
    RunFinished,
    RunNotFinished,
    ScheduleExists,
    SignalAlreadyConsumed,
    UnknownApproval,
    UnknownQueue,
    UnknownRun,
    UnknownSchedule,
    UnknownToken,
)
from ratchet.store.tenants import external_id, external_text

log = logging.getLogger("ratchet.api")

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "timeout",
    409: "conflict",
    413: "payload_too_large",
    422: "invalid_input",
    500: "internal",
}


class ApiError(Exception):
    """An answer other than success: status, code, message and optional details."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        details: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or _CODES.get(status, "error")
        self.message = message
        self.details = details
        self.headers = headers


def not_found(run_id: str) -> ApiError:
    # The same words for a missing run and another tenant's: nothing tells them apart.
    return ApiError(404, f"unknown run id {run_id!r}")


def error_response(
    status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": code, "message": message, "details": details}, status_code=status, headers=headers
    )


def _status_of(e: Exception) -> int:
    if isinstance(e, UnknownRun | UnknownApproval | UnknownToken | UnknownSchedule | UnknownQueue):
        return 404
    if isinstance(
        e,
        RunFinished
        | ApprovalNotPending
        | NotDeadLettered
        | NotCancelled
        | SignalAlreadyConsumed
        | RunNotFinished
        | JournalPruned
        | ScheduleExists,
    ):
        return 409
    if isinstance(e, InvalidInput):
        return 422
    return 500


def install(app: FastAPI) -> None:
    """Register the handlers that give every refusal the one shape."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return error_response(e.status, e.code, e.message, e.details, e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = str(e.detail)
        if e.status_code == 400 and e.__cause__ is not None:
            message = _unreadable(e.__cause__)
        return error_response(
            e.status_code,
            _CODES.get(e.status_code, "error"),
            message,
            getattr(e, "details", None),
            getattr(e, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        errors = e.errors()
        if errors and errors[0].get("type") == "json_invalid":
            return _not_json(errors[0], e.body)
        details = [
            {"field": _field(err.get("loc", ())[1:]) or "body", "message": err.get("msg", "")}
            for err in errors
        ]
        fields = ", ".join(d["field"] for d in details)
        return error_response(422, "invalid_input", f"invalid request: {fields}", details)

    @app.exception_handler(RatchetError)
    async def refused(request: Request, e: RatchetError) -> JSONResponse:
        if isinstance(e, DuplicateStart):
            tenant = getattr(request.state, "tenant", None)
            run_id = e.run_id if tenant is None else external_id(tenant, e.run_id)
            return error_response(409, "conflict", speak(request, str(e)), {"run_id": run_id})
        status = _status_of(e)
        if status == 500:
            return _internal(request, e)
        return error_response(status, _CODES[status], speak(request, str(e)))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception) -> JSONResponse:
        return _internal(request, e)


def speak(request: Request, text: str) -> str:
    """``text`` (a message of the engine's, naming runs by the engine's ids) with the
    calling tenant's own run ids."""
    tenant = getattr(request.state, "tenant", None)
    return text if tenant is None else external_text(tenant, text)


def _not_json(err: Any, doc: Any) -> JSONResponse:
    """422 for a body that is not JSON, saying where (line and column, from 1) and why."""
    loc = err.get("loc", ())
    pos = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else 0
    text = doc if isinstance(doc, str) else ""
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    why = (err.get("ctx") or {}).get("error") or "not JSON"
    message = f"invalid JSON at line {line}, column {column}: {why}"
    details = [{"field": "body", "message": message, "line": line, "column": column}]
    return error_response(422, "invalid_input", message, details)


def _unreadable(cause: BaseException) -> str:
    """Why a body could not be read (FastAPI answers 400 and keeps the cause)."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not UTF-8 text: byte {cause.start} cannot be decoded"
    return f"the body could not be read ({type(cause).__name__})"


def _field(loc: Any) -> str:
    """A validation error's location as a path: ``runs[3].input``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _internal(request: Request, e: Exception) -> JSONResponse:
    log.error(
        "action=request_failed path=%s error=%s", request.url.path, type(e).__name__, exc_info=e
    )
    return error_response(500, "internal", "internal error; see the server log")
