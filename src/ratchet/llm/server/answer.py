"""An answer as it goes on the wire, and what every endpoint builds it from: ids, SSE
events, the split of a reply into stream deltas.

An :class:`Answer` is complete before the first byte is sent, so an idempotent replay sends
exactly what the first request got (the same body, or the same events).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ratchet.llm.server.replies import Usage

# A stream delta carries a few words, as a model's tokens would.
_PIECE_CHARS = 16
_WORD = re.compile(r"\s*\S+\s*|\s+")


@dataclass(frozen=True)
class Answer:
    """A stored answer: a JSON ``body``, or the SSE ``events`` of a stream, and its usage."""

    usage: Usage
    body: dict[str, Any] | None = None
    events: tuple[bytes, ...] | None = None


@dataclass
class Outcome:
    """What to send back: an answer (status 200) or an error body, and whether to drop the
    connection instead of sending anything."""

    status: int
    request_id: str
    answer: Answer | None = None
    error: str | None = None
    error_param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False
    # A stream that pauses: (events sent first, seconds before the rest).
    stall: tuple[int, float] | None = None
    # A stream whose connection is closed after this many events.
    cut_after: int | None = None


def new_id(prefix: str) -> str:
    """A fresh id in the provider's style, e.g. ``chatcmpl-…`` or ``msg_…``."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event: an optional ``event:`` line and one ``data:`` line."""
    payload = (
        data
        if isinstance(data, str)
        else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    )
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def text_pieces(text: str) -> list[str]:
    """``text`` cut into stream deltas of whole words, about 16 characters each; joined
    they give ``text`` back exactly."""
    pieces: list[str] = []
    current = ""
    for word in _WORD.findall(text):
        current += word
        if len(current) >= _PIECE_CHARS:
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    return pieces


def json_pieces(arguments: str) -> list[str]:
    """Tool-call arguments (JSON text) cut into deltas, as a model streams them."""
    return [arguments[i : i + _PIECE_CHARS] for i in range(0, len(arguments), _PIECE_CHARS)]
