"""The provider calls Ratchet makes durable, and what it knows of each: its step name, where
the SDK keeps it, the typed object its body becomes, and where the body says its usage.

Response bodies are journaled as the provider sent them; a replay rebuilds the SDK's own
typed object from the body with the SDK's ``construct`` (lenient, as the SDK itself parses),
so a field the SDK does not know yet survives the round trip.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ratchet.llm.prices import Usage


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _details(usage: dict[str, Any], key: str, field: str) -> int:
    details = usage.get(key)
    return _int(details.get(field)) if isinstance(details, dict) else 0


def _chat_usage(body: dict[str, Any]) -> Usage:
    u = body.get("usage") or {}
    return Usage(
        input_tokens=_int(u.get("prompt_tokens")),
        output_tokens=_int(u.get("completion_tokens")),
        cached_tokens=_details(u, "prompt_tokens_details", "cached_tokens"),
        reasoning_tokens=_details(u, "completion_tokens_details", "reasoning_tokens"),
    )


def _responses_usage(body: dict[str, Any]) -> Usage:
    u = body.get("usage") or {}
    return Usage(
        input_tokens=_int(u.get("input_tokens")),
        output_tokens=_int(u.get("output_tokens")),
        cached_tokens=_details(u, "input_tokens_details", "cached_tokens"),
        reasoning_tokens=_details(u, "output_tokens_details", "reasoning_tokens"),
    )


def _embeddings_usage(body: dict[str, Any]) -> Usage:
    u = body.get("usage") or {}
    return Usage(input_tokens=_int(u.get("prompt_tokens")))


def _messages_usage(body: dict[str, Any]) -> Usage:
    # Anthropic counts cache reads and writes apart from input_tokens; Usage.input_tokens is
    # the whole prompt.
    u = body.get("usage") or {}
    read, written = (
        _int(u.get("cache_read_input_tokens")),
        _int(u.get("cache_creation_input_tokens")),
    )
    return Usage(
        input_tokens=_int(u.get("input_tokens")) + read + written,
        output_tokens=_int(u.get("output_tokens")),
        cached_tokens=read,
        cache_write_tokens=written,
    )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One durable SDK method."""

    name: str  # the step's name in the journal
    provider: str  # "openai" | "anthropic"
    path: tuple[str, ...]  # the resource on the client: ("chat", "completions")
    response: str  # "module:Class" of the SDK's typed response
    usage: Callable[[dict[str, Any]], Usage]
    streams: bool = True

    def response_type(self) -> Any:
        module, _, cls = self.response.partition(":")
        return getattr(importlib.import_module(module), cls)

    def revive(self, body: Any) -> Any:
        """The SDK's typed object from a journaled body."""
        return self.response_type().construct(**body)

    def resource(self, client: Any) -> Any:
        for attr in self.path:
            client = getattr(client, attr)
        return client


CHAT = Endpoint(
    "openai.chat.completions.create",
    "openai",
    ("chat", "completions"),
    "openai.types.chat:ChatCompletion",
    _chat_usage,
)
RESPONSES = Endpoint(
    "openai.responses.create",
    "openai",
    ("responses",),
    "openai.types.responses:Response",
    _responses_usage,
)
EMBEDDINGS = Endpoint(
    "openai.embeddings.create",
    "openai",
    ("embeddings",),
    "openai.types:CreateEmbeddingResponse",
    _embeddings_usage,
    streams=False,
)
MESSAGES = Endpoint(
    "anthropic.messages.create",
    "anthropic",
    ("messages",),
    "anthropic.types:Message",
    _messages_usage,
)

BY_PROVIDER: dict[str, tuple[Endpoint, ...]] = {
    "openai": (CHAT, RESPONSES, EMBEDDINGS),
    "anthropic": (MESSAGES,),
}
