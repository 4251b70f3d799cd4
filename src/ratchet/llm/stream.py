"""``create(stream=True)`` in a workflow: the provider's chunks reach the caller as they
arrive, the assembled response is journaled as the step's output, and a replay (the step
completed in an earlier drive) yields chunks rebuilt from that response, without calling
the provider.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from ratchet.errors import LLMError
from ratchet.llm.endpoints import CHAT, MESSAGES, RESPONSES, Endpoint

if TYPE_CHECKING:
    from ratchet.engine.definitions import StepDef
    from ratchet.engine.driver import RunContext
    from ratchet.model import StepState


class DurableStream:
    """What ``await create(..., stream=True)`` returns in a workflow: iterate it (``async
    for``) as the SDK's stream, optionally inside ``async with``."""

    def __init__(self, ctx: RunContext, sd: StepDef, endpoint: Endpoint,
                 kwargs: dict[str, Any], step_id: str, journaled: StepState | None,
                 started: dict[str, Any]) -> None:
        self._ctx, self._sd, self._endpoint = ctx, sd, endpoint
        self._step_id, self._journaled, self._started = step_id, journaled, started
        self._kwargs = dict(kwargs)
        # OpenAI chat reports usage in a last chunk only when asked; it is asked for here,
        # so that the journal has it, and that chunk reaches the caller only if they asked.
        self._hide_usage_chunk = False
        if endpoint is CHAT and not (kwargs.get("stream_options") or {}).get("include_usage"):
            self._kwargs["stream_options"] = {**(kwargs.get("stream_options") or {}),
                                              "include_usage": True}
            self._hide_usage_chunk = True
        self._iterating = False

    def __aiter__(self) -> AsyncIterator[Any]:
        if self._iterating:
            raise LLMError(f"{self._endpoint.name}: a stream can be iterated once")
        self._iterating = True
        return self._chunks()

    async def __aenter__(self) -> DurableStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def _chunks(self) -> AsyncIterator[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        sink = _Sink(queue, self._endpoint)
        task = asyncio.ensure_future(self._ctx.run_step(
            self._sd, (sink,), dict(self._kwargs), self._step_id, self._journaled,
            self._started))
        passed = 0
        try:
            while not (task.done() and queue.empty()):
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                chunk = getter.result()
                passed += 1
                if not (self._hide_usage_chunk and _usage_only(chunk)):
                    yield chunk
            body = task.result()  # the step's outcome: its failure is raised here
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if passed == 0:  # completed in an earlier drive: the journaled response again
            for chunk in replay(self._endpoint, body, usage=not self._hide_usage_chunk):
                yield chunk


class _Sink:
    """Where a streaming step's attempt puts the chunks it receives."""

    def __init__(self, queue: asyncio.Queue[Any], endpoint: Endpoint) -> None:
        self._queue, self._endpoint = queue, endpoint

    def assembler(self) -> Assembler:
        return _ASSEMBLERS[self._endpoint.name]()

    async def put(self, chunk: Any) -> None:
        await self._queue.put(chunk)


def _usage_only(chunk: Any) -> bool:
    return not getattr(chunk, "choices", None) and getattr(chunk, "usage", None) is not None


def _dict(chunk: Any) -> dict[str, Any]:
    data: dict[str, Any] = chunk.to_dict() if hasattr(chunk, "to_dict") else dict(chunk)
    return data


class Assembler:
    """Builds the response body a stream amounts to, chunk by chunk."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, chunk: Any) -> None:
        self.count += 1
        self.take(_dict(chunk))

    def take(self, d: dict[str, Any]) -> None:
        raise NotImplementedError

    def body(self) -> dict[str, Any]:
        raise NotImplementedError


class ChatAssembler(Assembler):
    def __init__(self) -> None:
        super().__init__()
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
            choice = self.choices.setdefault(index, {
                "index": index, "finish_reason": None, "logprobs": None,
                "message": {"role": "assistant", "content": None}})
            message = choice["message"]
            delta = c.get("delta") or {}
            if delta.get("role"):
                message["role"] = delta["role"]
            for key in ("content", "refusal"):
                if delta.get(key):
                    message[key] = (message.get(key) or "") + delta[key]
            for tc in delta.get("tool_calls") or []:
                slot = self.tools.setdefault(index, {}).setdefault(tc.get("index", 0), {
                    "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
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
            choice = self.choices[index]
            calls = self.tools.get(index)
            if calls:
                choice["message"]["tool_calls"] = [calls[i] for i in sorted(calls)]
            choices.append(choice)
        return {**self.head, "object": "chat.completion", "choices": choices,
                "usage": self.usage}


class MessagesAssembler(Assembler):
    def __init__(self) -> None:
        super().__init__()
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, str] = {}

    def take(self, d: dict[str, Any]) -> None:
        kind = d.get("type")
        if kind == "message_start":
            self.message = d["message"]
        elif kind == "content_block_start":
            self.blocks[d["index"]] = block = dict(d["content_block"])
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
                text = self.partial.pop(d["index"])
                self.blocks[d["index"]]["input"] = json.loads(text) if text else {}
        elif kind == "message_delta":
            for key, value in (d.get("delta") or {}).items():
                self.message[key] = value
            usage = dict(self.message.get("usage") or {})
            usage.update({k: v for k, v in (d.get("usage") or {}).items() if v is not None})
            self.message["usage"] = usage

    def body(self) -> dict[str, Any]:
        return {**self.message, "content": [self.blocks[i] for i in sorted(self.blocks)]}


class ResponsesAssembler(Assembler):
    def __init__(self) -> None:
        super().__init__()
        self.response: dict[str, Any] | None = None

    def take(self, d: dict[str, Any]) -> None:
        if d.get("type") in ("response.completed", "response.incomplete", "response.failed"):
            self.response = d["response"]

    def body(self) -> dict[str, Any]:
        if self.response is None:
            raise LLMError("openai.responses.create: the stream ended before the response "
                           "did", provider="openai")
        return self.response


_ASSEMBLERS: dict[str, type[Assembler]] = {
    CHAT.name: ChatAssembler, MESSAGES.name: MessagesAssembler,
    RESPONSES.name: ResponsesAssembler,
}


# -- replay ------------------------------------------------------------------------------


def replay(endpoint: Endpoint, body: dict[str, Any], *, usage: bool) -> Iterator[Any]:
    """The SDK's stream objects for a journaled response, as a stream would have brought it."""
    if endpoint is CHAT:
        yield from _chat_chunks(body, usage)
    elif endpoint is MESSAGES:
        yield from _message_events(body)
    elif endpoint is RESPONSES:
        yield from _response_events(body)


def _chat_chunks(body: dict[str, Any], usage: bool) -> Iterator[Any]:
    from openai.types.chat import ChatCompletionChunk

    head = {k: body[k] for k in ("id", "created", "model", "system_fingerprint", "service_tier")
            if k in body}
    for choice in body.get("choices") or []:
        message = choice.get("message") or {}
        delta = {k: message[k] for k in ("role", "content", "refusal") if message.get(k)}
        calls = message.get("tool_calls")
        if calls:
            delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(calls)]
        yield ChatCompletionChunk.construct(**head, object="chat.completion.chunk", choices=[{
            "index": choice.get("index", 0), "delta": delta,
            "finish_reason": choice.get("finish_reason"), "logprobs": None}])
    if usage and body.get("usage") is not None:
        yield ChatCompletionChunk.construct(**head, object="chat.completion.chunk", choices=[],
                                            usage=body["usage"])


def _message_events(body: dict[str, Any]) -> Iterator[Any]:
    types = importlib.import_module("anthropic.types")
    usage = dict(body.get("usage") or {})
    start = {**body, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**usage, "output_tokens": 0}}
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
        yield types.RawContentBlockStartEvent.construct(type="content_block_start", index=index,
                                                        content_block=empty)
        if delta is not None:
            yield types.RawContentBlockDeltaEvent.construct(type="content_block_delta",
                                                            index=index, delta=delta)
        yield types.RawContentBlockStopEvent.construct(type="content_block_stop", index=index)
    yield types.RawMessageDeltaEvent.construct(
        type="message_delta", usage={"output_tokens": usage.get("output_tokens", 0)},
        delta={"stop_reason": body.get("stop_reason"),
               "stop_sequence": body.get("stop_sequence")})
    yield types.RawMessageStopEvent.construct(type="message_stop")


def _response_events(body: dict[str, Any]) -> Iterator[Any]:
    from openai._models import construct_type
    from openai.types.responses import ResponseStreamEvent

    seq = iter(range(1_000_000))

    def event(**d: Any) -> Any:
        return construct_type(type_=ResponseStreamEvent, value={**d, "sequence_number": next(seq)})

    yield event(type="response.created",
                response={**body, "status": "in_progress", "output": []})
    for index, item in enumerate(body.get("output") or []):
        yield event(type="response.output_item.added", output_index=index,
                    item={**item, "content": []} if item.get("type") == "message" else item)
        for part_index, part in enumerate(item.get("content") or []):
            if part.get("type") == "output_text":
                yield event(type="response.output_text.delta", item_id=item.get("id"),
                            output_index=index, content_index=part_index,
                            delta=part.get("text", ""), logprobs=[])
                yield event(type="response.output_text.done", item_id=item.get("id"),
                            output_index=index, content_index=part_index,
                            text=part.get("text", ""), logprobs=[])
        yield event(type="response.output_item.done", output_index=index, item=item)
    yield event(type="response.completed", response=body)
