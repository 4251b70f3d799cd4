"""A streamed model request's events, journaled by its step and given back on every drive.

Outside a workflow a streamed request hands its consumers (``run_stream().stream_text()``,
a ``ProcessEventStream`` handler, ``run_stream_events()``) the model's events as they come:
a part's start, then its deltas. Inside, the request runs in a step, and what leaves the step
is what the journal holds: the step records the events as the model streams them (past the
capability's own ``event_stream_handler``, which sees them live) and returns them beside the
response, so the workflow side replays exactly those, delta for delta, on the first drive and
on every replay. The journal keeps them as the response plus the lengths of their text
pieces (:mod:`ratchet.llm.chunks`), not as one object per delta.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any

from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.messages import AgentStreamEvent, ModelResponseStreamEvent
from pydantic_ai.tools import RunContext

from ratchet.llm import chunks

# The events of the streamed request whose step runs in this context, as they pass.
recording: contextvars.ContextVar[list[ModelResponseStreamEvent] | None] = contextvars.ContextVar(
    "ratchet_pai_recording", default=None
)


def recorder(handler: EventStreamHandler[Any] | None) -> EventStreamHandler[Any] | None:
    """The handler a streamed request's step consumes the live stream with: ``handler``
    (the capability's own), with every event recorded as it passes, and the rest of the
    stream read to its end after ``handler`` returns."""
    recorded = recording.get()
    if recorded is None:
        return handler

    async def record(ctx: RunContext[Any], stream: AsyncIterable[AgentStreamEvent]) -> None:
        async def tap() -> AsyncIterator[AgentStreamEvent]:
            async for event in stream:  # a model request's stream: its model events
                recorded.append(event)  # type: ignore[arg-type]
                yield event

        events = tap()
        if handler is not None:
            await handler(ctx, events)
        async for _ in events:
            pass

    return record


def _texts(d: dict[str, Any]) -> Iterable[tuple[chunks.Path, chunks.Path]]:
    """A part's text comes as its start's content and then its deltas, in order."""
    kind, index = d.get("event_kind"), d.get("index", 0)
    if kind == "part_start":
        yield ("part", "content"), ("parts", index, "content")
        yield ("part", "args"), ("parts", index, "args")
    elif kind == "part_delta":
        yield ("delta", "content_delta"), ("parts", index, "content")
        yield ("delta", "args_delta"), ("parts", index, "args")


def compact(payload: Any) -> Any:
    """A streamed request's step output as the journal keeps it: the response and its
    events against it. Anything else is kept as it is."""
    if not (
        isinstance(payload, dict)
        and isinstance(payload.get("events"), list)
        and isinstance(payload.get("response"), dict)
    ):
        return payload
    response = payload["response"]
    return {"response": response, "chunks": chunks.encode(payload["events"], response, _texts)}


def expand(output: Any) -> Any:
    """What :func:`compact` was given, from the journal's form."""
    if not (isinstance(output, dict) and "chunks" in output and "response" in output):
        return output
    return {
        "response": output["response"],
        "events": list(chunks.decode(output["chunks"], output["response"])),
    }
