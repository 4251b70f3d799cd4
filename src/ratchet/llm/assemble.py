"""What a provider's stream amounts to, per endpoint: the response body its chunks assemble
into (also from part of a stream), where their text pieces go in that body, and the SDK's
own objects rebuilt from journaled chunks.
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from ratchet.errors import LLMError
from ratchet.llm.chunks import Path
from ratchet.llm.endpoints import CHAT, MESSAGES, RESPONSES, Endpoint


class Assembler:
    """Builds the response body a stream amounts to, chunk by chunk."""

    #: Fields that count the chunks (kept by position in the journal, see llm.chunks).
    counters: tuple[Path, ...] = ()

    def take(self, d: dict[str, Any]) -> None:
        raise NotImplementedError

    def body(self) -> dict[str, Any]:
        """The response so far: the whole one once the stream has ended."""
        raise NotImplementedError

    @property
    def usage_final(self) -> bool:
        """Whether the provider has reported the call's whole usage yet."""
        raise NotImplementedError

    @staticmethod
    def texts(d: dict[str, Any]) -> Iterable[tuple[Path, Path]]:
        """The text pieces of chunk ``d`` and the body texts they continue."""
        raise NotImplementedError


class ChatAssembler(Assembler):
    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.usage: Any = None
        self.choices: dict[int, dict[str, Any]] = {}
        self.tools: dict[int, dict[int, dict[str, Any]]] = {}

    def take(self, d: dict[str, Any]) -> None:
        for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if d.get(key) is not None:
                self.head[key] = d[key]
        if d.get("usage") is not None:
            self.usage = d["usage"]
        for c in d.get("choices") or []:
            index = c.get("index", 0)
            choice = self.choices.setdefault(
                index,
                {
                    "index": index,
                    "finish_reason": None,
                    "logprobs": None,
                    "message": {"role": "assistant", "content": None},
                },
            )
            message = choice["message"]
            delta = c.get("delta") or {}
            if delta.get("role"):
                message["role"] = delta["role"]
            for key in ("content", "refusal"):
                if delta.get(key):
                    message[key] = (message.get(key) or "") + delta[key]
            for tc in delta.get("tool_calls") or []:
                slot = self.tools.setdefault(index, {}).setdefault(
                    tc.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if c.get("finish_reason"):
                choice["finish_reason"] = c["finish_reason"]

    def body(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self.choices):
            choice = copy.deepcopy(self.choices[index])
            calls = self.tools.get(index)
            if calls:
                choice["message"]["tool_calls"] = [copy.deepcopy(calls[i]) for i in sorted(calls)]
            choices.append(choice)
        return {**self.head, "object": "chat.completion", "choices": choices, "usage": self.usage}

    @property
    def usage_final(self) -> bool:
        return self.usage is not None

    @staticmethod
    def texts(d: dict[str, Any]) -> Iterable[tuple[Path, Path]]:
        for at, c in enumerate(d.get("choices") or []):
            index, delta = c.get("index", 0), c.get("delta") or {}
            for key in ("content", "refusal"):
                yield ("choices", at, "delta", key), ("choices", index, "message", key)
            for t, tc in enumerate(delta.get("tool_calls") or []):
                for key in ("name", "arguments"):
                    yield (
                        ("choices", at, "delta", "tool_calls", t, "function", key),
                        (
                            "choices",
                            index,
                            "message",
                            "tool_calls",
                            tc.get("index", 0),
                            "function",
                            key,
                        ),
                    )


class MessagesAssembler(Assembler):
    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, str] = {}
        self.ended = False

    def take(self, d: dict[str, Any]) -> None:
        kind = d.get("type")
        if kind == "message_start":
            self.message = copy.deepcopy(d["message"])
        elif kind == "content_block_start":
            self.blocks[d["index"]] = block = copy.deepcopy(d["content_block"])
            if block.get("type") in ("tool_use", "server_tool_use"):
                self.partial[d["index"]] = ""
        elif kind == "content_block_delta":
            block, delta = self.blocks[d["index"]], d["delta"]
            dt = delta.get("type")
            if dt == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif dt == "input_json_delta":
                self.partial[d["index"]] += delta.get("partial_json", "")
            elif dt == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif dt == "signature_delta":
                block["signature"] = delta["signature"]
            elif dt == "citations_delta":
                block.setdefault("citations", []).append(delta["citation"])
        elif kind == "content_block_stop":
            if d["index"] in self.partial:
                self.blocks[d["index"]]["input"] = _json_or_empty(self.partial.pop(d["index"]))
        elif kind == "message_delta":
            self.ended = True
            for key, value in (d.get("delta") or {}).items():
                self.message[key] = value
            usage = dict(self.message.get("usage") or {})
            usage.update({k: v for k, v in (d.get("usage") or {}).items() if v is not None})
            self.message["usage"] = usage

    def body(self) -> dict[str, Any]:
        blocks = []
        for index in sorted(self.blocks):
            block = copy.deepcopy(self.blocks[index])
            if index in self.partial:  # a tool call cut off mid-arguments
                block["input"] = _json_or_empty(self.partial[index])
            blocks.append(block)
        return {**self.message, "content": blocks}

    @property
    def usage_final(self) -> bool:
        return self.ended

    @staticmethod
    def texts(d: dict[str, Any]) -> Iterable[tuple[Path, Path]]:
        kind, index = d.get("type"), d.get("index", 0)
        if kind == "content_block_start":
            for key in ("text", "thinking"):
                yield ("content_block", key), ("content", index, key)
        elif kind == "content_block_delta":
            for key in ("text", "thinking"):
                yield ("delta", key), ("content", index, key)


def _json_or_empty(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


class ResponsesAssembler(Assembler):
    counters = (("sequence_number",),)

    def __init__(self) -> None:
        self.response: dict[str, Any] | None = None
        self.started: dict[str, Any] = {}
        self.items: dict[int, dict[str, Any]] = {}

    def take(self, d: dict[str, Any]) -> None:
        kind = d.get("type")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self.response = d["response"]
        elif kind in ("response.created", "response.in_progress"):
            self.started = d["response"]
        elif kind in ("response.output_item.added", "response.output_item.done"):
            self.items[d["output_index"]] = copy.deepcopy(d["item"])
        elif kind == "response.content_part.added":
            item = self.items.setdefault(d["output_index"], {})
            parts = item.setdefault("content", [])
            while len(parts) <= d["content_index"]:
                parts.append({})
            parts[d["content_index"]] = copy.deepcopy(d["part"])
        elif kind == "response.output_text.delta":
            item = self.items.setdefault(d["output_index"], {"type": "message", "content": []})
            parts = item.setdefault("content", [])
            while len(parts) <= d["content_index"]:
                parts.append({"type": "output_text", "text": "", "annotations": []})
            part = parts[d["content_index"]]
            part["text"] = part.get("text", "") + d.get("delta", "")
        elif kind == "response.function_call_arguments.delta":
            item = self.items.setdefault(d["output_index"], {"type": "function_call"})
            item["arguments"] = item.get("arguments", "") + d.get("delta", "")

    def body(self) -> dict[str, Any]:
        if self.response is not None:
            return self.response
        if not self.started and not self.items:
            raise LLMError(
                "openai.responses.create: the stream ended before the response did",
                provider="openai",
            )
        # Cut off before it completed: the response as far as it came.
        return {
            **self.started,
            "status": "incomplete",
            "output": [copy.deepcopy(self.items[i]) for i in sorted(self.items)],
        }

    @property
    def usage_final(self) -> bool:
        return self.response is not None

    @staticmethod
    def texts(d: dict[str, Any]) -> Iterable[tuple[Path, Path]]:
        kind = d.get("type")
        if kind == "response.output_text.delta":
            yield (
                ("delta",),
                ("output", d.get("output_index", 0), "content", d.get("content_index", 0), "text"),
            )
        elif kind == "response.function_call_arguments.delta":
            yield ("delta",), ("output", d.get("output_index", 0), "arguments")


ASSEMBLERS: dict[str, type[Assembler]] = {
    CHAT.name: ChatAssembler,
    MESSAGES.name: MessagesAssembler,
    RESPONSES.name: ResponsesAssembler,
}


# -- the SDK's objects ---------------------------------------------------------------------


def sdk_chunk(endpoint: Endpoint, d: dict[str, Any]) -> Any:
    """The SDK's stream object for a journaled chunk, built the way the SDK builds the ones
    it reads off the wire (leniently: a field it does not know survives)."""
    if endpoint is MESSAGES:
        models = importlib.import_module("anthropic._models")
        event = importlib.import_module("anthropic.types").RawMessageStreamEvent
        return models.construct_type(type_=event, value=d)
    models = importlib.import_module("openai._models")
    if endpoint is RESPONSES:
        kind = importlib.import_module("openai.types.responses").ResponseStreamEvent
    else:
        kind = importlib.import_module("openai.types.chat").ChatCompletionChunk
    return models.construct_type(type_=kind, value=d)


def canonical(endpoint: Endpoint, body: dict[str, Any], *, usage: bool) -> Iterator[Any]:
    """Chunks for a response journaled without its chunks (by an earlier Ratchet): one
    chunk for each choice, block or part, as a stream could have brought it."""
    if endpoint is CHAT:
        yield from _chat_chunks(body, usage)
    elif endpoint is MESSAGES:
        yield from _message_events(body)
    elif endpoint is RESPONSES:
        yield from _response_events(body)


def _chat_chunks(body: dict[str, Any], usage: bool) -> Iterator[Any]:
    from openai.types.chat import ChatCompletionChunk

    head = {
        k: body[k]
        for k in ("id", "created", "model", "system_fingerprint", "service_tier")
        if k in body
    }
    for choice in body.get("choices") or []:
        message = choice.get("message") or {}
        delta = {k: message[k] for k in ("role", "content", "refusal") if message.get(k)}
        calls = message.get("tool_calls")
        if calls:
            delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(calls)]
        yield ChatCompletionChunk.construct(
            **head,
            object="chat.completion.chunk",
            choices=[
                {
                    "index": choice.get("index", 0),
                    "delta": delta,
                    "finish_reason": choice.get("finish_reason"),
                    "logprobs": None,
                }
            ],
        )
    if usage and body.get("usage") is not None:
        yield ChatCompletionChunk.construct(
            **head, object="chat.completion.chunk", choices=[], usage=body["usage"]
        )


def _message_events(body: dict[str, Any]) -> Iterator[Any]:
    types = importlib.import_module("anthropic.types")
    usage = dict(body.get("usage") or {})
    start = {
        **body,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    yield types.RawMessageStartEvent.construct(type="message_start", message=start)
    for index, block in enumerate(body.get("content") or []):
        kind = block.get("type")
        empty = copy.deepcopy(block)
        delta: dict[str, Any] | None = None
        if kind == "text":
            empty["text"], delta = "", {"type": "text_delta", "text": block.get("text", "")}
        elif kind in ("tool_use", "server_tool_use"):
            empty["input"] = {}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.get("input"))}
        elif kind == "thinking":
            empty["thinking"] = ""
            delta = {"type": "thinking_delta", "thinking": block.get("thinking", "")}
        yield types.RawContentBlockStartEvent.construct(
            type="content_block_start", index=index, content_block=empty
        )
        if delta is not None:
            yield types.RawContentBlockDeltaEvent.construct(
                type="content_block_delta", index=index, delta=delta
            )
        yield types.RawContentBlockStopEvent.construct(type="content_block_stop", index=index)
    yield types.RawMessageDeltaEvent.construct(
        type="message_delta",
        usage={"output_tokens": usage.get("output_tokens", 0)},
        delta={"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")},
    )
    yield types.RawMessageStopEvent.construct(type="message_stop")


def _response_events(body: dict[str, Any]) -> Iterator[Any]:
    from openai._models import construct_type
    from openai.types.responses import ResponseStreamEvent

    seq = iter(range(1_000_000))

    def event(**d: Any) -> Any:
        return construct_type(type_=ResponseStreamEvent, value={**d, "sequence_number": next(seq)})

    yield event(type="response.created", response={**body, "status": "in_progress", "output": []})
    for index, item in enumerate(body.get("output") or []):
        yield event(
            type="response.output_item.added",
            output_index=index,
            item={**item, "content": []} if item.get("type") == "message" else item,
        )
        for part_index, part in enumerate(item.get("content") or []):
            if part.get("type") == "output_text":
                yield event(
                    type="response.output_text.delta",
                    item_id=item.get("id"),
                    output_index=index,
                    content_index=part_index,
                    delta=part.get("text", ""),
                    logprobs=[],
                )
                yield event(
                    type="response.output_text.done",
                    item_id=item.get("id"),
                    output_index=index,
                    content_index=part_index,
                    text=part.get("text", ""),
                    logprobs=[],
                )
        yield event(type="response.output_item.done", output_index=index, item=item)
    yield event(type="response.completed", response=body)
