"""A bound on how long a client may take to send its request.

uvicorn closes a kept-alive connection that stays idle between requests
(``timeout_keep_alive``), but it has no bound on a request being sent: a connection that
opens and never finishes its head, or sends a head and then its body a byte at a time,
is held for as long as the client likes, and a few hundred such connections hold the
server's sockets and memory for nothing (slowloris). The protocol here is uvicorn's h11
one with a deadline per request: the head must arrive within ``request_timeout_s`` of the
connection opening (or, on a kept-alive connection, of the next request's first byte),
and the body within ``request_timeout_s`` after the head. Past it the connection is
answered ``408 Request Timeout`` (when nothing was answered yet) and closed; a body cut
short reaches the app as a disconnect. The deadline is one timer per connection, moved at
each stage, so the requests that arrive in time pay nothing for it; a request being
answered (a long poll, an event stream) is the app's time and not bounded here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ratchet.web.limits import error_body

log = logging.getLogger("ratchet.api")
REQUEST_TIMEOUT_S = 10.0
# In the one error shape, as every other refusal.
_SAID = error_body("timeout", "the request took too long to arrive")
_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_SAID), _SAID)
)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on receiving each request (see the module)."""

    request_timeout_s: float = REQUEST_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._stage: str | None = None  # "head", "body", or None: nothing is awaited

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._move("head")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()  # a pipelined request may be waiting in the buffer

    def connection_lost(self, exc: Exception | None) -> None:
        self._move(None)
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Set the deadline for what the connection now waits for from the client."""
        if self.transport.is_closing():
            self._move(None)
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._move("body")
        elif state is h11.IDLE and (self._stage == "head" or self.conn.trailing_data[0]):
            # Waiting for a head: from the connection's opening, or from the first byte of
            # a next request (idle time before that is the keep-alive timeout's).
            self._move("head")
        else:
            self._move(None)

    def _move(self, stage: str | None) -> None:
        if stage == self._stage:
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._stage = stage
        if stage is not None:
            self._deadline = self.loop.call_later(self.request_timeout_s, self._expired)

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        log.debug(
            "action=slow_client_closed stage=%s timeout_s=%s", self._stage, self.request_timeout_s
        )
        # A 408 only where this request has no answer under way: never a second answer.
        cycle = self.cycle
        unanswered = cycle is None or (
            cycle.response_complete if self._stage == "head" else not cycle.response_started
        )
        if unanswered:
            self.transport.write(_TIMEOUT)
        self._stage = None
        self.transport.close()


def bounded_protocol(request_timeout_s: float = REQUEST_TIMEOUT_S) -> type[H11Protocol]:
    """The protocol class to give uvicorn (``uvicorn.Config(http=...)``) for a bound of
    ``request_timeout_s`` seconds on receiving a request's head, and then its body."""
    if not request_timeout_s > 0:
        raise ValueError(f"request_timeout_s must be positive, got {request_timeout_s!r}")
    return type(
        "BoundedH11Protocol", (BoundedH11Protocol,), {"request_timeout_s": float(request_timeout_s)}
    )
