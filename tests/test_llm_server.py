"""The local model provider, spoken to by the official OpenAI and Anthropic SDKs over real
HTTP: typed responses with usage, streams, scripted tool calls, idempotent replays, faults,
the request log, a bad script, and the ``ratchet llm-server`` process."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import Message, TextBlock, ToolUseBlock
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseFunctionToolCall
from pydantic import BaseModel
from typer.testing import CliRunner
from uvicorn.protocols.http.h11_impl import H11Protocol
from waiting import wait_for

from ratchet.cli import cli
from ratchet.llm import server
from ratchet.llm.server import LocalProvider, ScriptError, serve
from ratchet.llm.server.answer import Answer
from ratchet.llm.server.idempotency import Claim, IdempotencyStore, Replay, Wait
from ratchet.llm.server.replies import Usage

OPENAI_KEY = "sk-test-OPENAI-SECRET-4f1c"
ANTHROPIC_KEY = "sk-ant-test-ANTHROPIC-SECRET-9b2e"
GPT = "gpt-4.1-mini"
CLAUDE = "claude-haiku-4-5"

WEATHER_SCRIPT = """\
rules:
  - match: {contains: "weather", endpoint: chat}
    reply: {tool_calls: [{name: get_weather, arguments: {city: "Paris"}}]}
  - match: {contains: "weather", endpoint: responses}
    reply: {tool_calls: [{name: get_weather, arguments: {city: "Paris"}}]}
  - match: {contains: "weather", endpoint: messages}
    reply: {text: "Let me look.", tool_calls: [{name: get_weather, arguments: {city: "Paris"}}]}
  - match: {last_role: tool}
    reply: {text: "It is sunny in Paris."}
  - match: {model: "gpt-4.1-nano"}
    reply: {text: "fixed answer", output_tokens: 12, cached_tokens: 3, reasoning_tokens: 5}
    times: 2
"""
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


@dataclass
class Local:
    provider: LocalProvider
    base: str
    openai: openai.OpenAI
    anthropic: anthropic.Anthropic
    log_path: Path | None


@contextmanager
def local(
    script: str | Path | dict[str, Any] | None = None, log_path: Path | None = None
) -> Iterator[Local]:
    provider = LocalProvider(script, log_path)
    with (
        serve(provider) as base,
        openai.OpenAI(base_url=f"{base}/v1", api_key=OPENAI_KEY, max_retries=0) as oc,
        anthropic.Anthropic(base_url=base, api_key=ANTHROPIC_KEY, max_retries=0) as ac,
    ):
        yield Local(provider, base, oc, ac, log_path)


@pytest.fixture
def llm(tmp_path: Path) -> Iterator[Local]:
    script = tmp_path / "script.yaml"
    script.write_text(WEATHER_SCRIPT)
    with local(script, tmp_path / "requests.jsonl") as served:
        yield served


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def post_json(url: str, body: Any) -> tuple[int, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# -- each endpoint parses into the SDK's typed object, with usage -------------------------


def test_chat_completion_is_a_typed_echo_with_usage(llm: Local) -> None:
    raw = llm.openai.chat.completions.with_raw_response.create(
        model=GPT,
        messages=[{"role": "system", "content": "Be brief."}, *user("hello there, how are you")],
    )
    completion = raw.parse()
    assert isinstance(completion, ChatCompletion)
    assert completion.id.startswith("chatcmpl-") and completion.model == GPT
    assert raw.headers["x-request-id"].startswith("req_")
    [choice] = completion.choices
    assert choice.message.content == "echo: hello there, how are you"
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    usage = completion.usage
    assert usage is not None
    assert usage.prompt_tokens == tokens("Be brief.hello there, how are you")
    assert usage.completion_tokens == tokens("echo: hello there, how are you")
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None and usage.completion_tokens_details
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details.reasoning_tokens == 0
    stats = llm.provider.stats()
    assert stats["billed_calls"] == 1 and stats["received"] == 1 and stats["requests"] == 1
    assert stats["billed_input_tokens"] == usage.prompt_tokens
    assert stats["billed_output_tokens"] == usage.completion_tokens
    [entry] = llm.provider.requests()
    assert entry["request_id"] == raw.headers["x-request-id"]
    assert entry["endpoint"] == "chat" and entry["status"] == 200 and entry["billed"] is True


def test_calls_on_a_kept_alive_connection_wait_for_no_delayed_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With Nagle's algorithm on the server's connections, each response (headers, then
    # body) waited for the client's delayed ACK: 40 ms or more a call. The listening
    # socket names its protocol so that asyncio turns Nagle off on every connection it
    # accepts: one kept-alive connection serves every call, with TCP_NODELAY set.
    accepted: list[int] = []  # TCP_NODELAY of each connection the server accepted
    made = H11Protocol.connection_made

    def recording(self: H11Protocol, transport: asyncio.Transport) -> None:
        sock = transport.get_extra_info("socket")
        accepted.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        made(self, transport)

    monkeypatch.setattr(H11Protocol, "connection_made", recording)
    script = tmp_path / "script.yaml"
    script.write_text(WEATHER_SCRIPT)
    with local(script, tmp_path / "requests.jsonl") as llm:
        for i in range(20):
            llm.openai.chat.completions.create(model=GPT, messages=user(f"ping {i}"))
        assert llm.provider.stats()["requests"] == 20
    assert len(accepted) == 1, f"{len(accepted)} connections for 20 calls"
    assert accepted[0] != 0, "Nagle's algorithm is on for the server's connection"


def test_responses_is_a_typed_response_with_usage(llm: Local) -> None:
    response = llm.openai.responses.create(
        model=GPT, input="summarise this", instructions="You are terse."
    )
    assert isinstance(response, Response)
    assert response.id.startswith("resp_") and response.status == "completed"
    assert response.output_text == "echo: summarise this"
    assert response.output[0].type == "message"
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens == tokens("You are terse.summarise this")
    assert usage.output_tokens == tokens("echo: summarise this")
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_embeddings_are_deterministic_unit_vectors(llm: Local) -> None:
    first = llm.openai.embeddings.create(model="text-embedding-3-small", input=["cat", "dog"])
    assert isinstance(first, CreateEmbeddingResponse)
    assert [d.index for d in first.data] == [0, 1]
    assert len(first.data[0].embedding) == 1536
    assert first.usage.prompt_tokens == 2 and first.usage.total_tokens == 2
    # The SDK asked for base64 by default; the float form carries the same numbers.
    floats = llm.openai.embeddings.create(
        model="text-embedding-3-small", input="cat", encoding_format="float", dimensions=1536
    )
    assert floats.data[0].embedding == first.data[0].embedding
    assert first.data[0].embedding != first.data[1].embedding
    assert math.isclose(sum(x * x for x in first.data[0].embedding), 1.0, rel_tol=1e-4)
    small = llm.openai.embeddings.create(model="text-embedding-3-small", input="cat", dimensions=8)
    assert len(small.data[0].embedding) == 8
    assert llm.provider.stats()["billed_calls"] == 3


def test_messages_is_a_typed_message_with_usage(llm: Local) -> None:
    raw = llm.anthropic.messages.with_raw_response.create(
        model=CLAUDE, max_tokens=100, system="Be kind.", messages=user("hi claude")
    )
    message = raw.parse()
    assert isinstance(message, Message)
    assert message.id.startswith("msg_") and raw.headers["request-id"].startswith("req_")
    [block] = message.content
    assert isinstance(block, TextBlock) and block.text == "echo: hi claude"
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == tokens("Be kind.hi claude")
    assert message.usage.output_tokens == tokens("echo: hi claude")
    assert message.usage.cache_read_input_tokens == 0
    assert message.usage.cache_creation_input_tokens == 0


# -- streams assemble to the same text ------------------------------------------------------


def test_chat_stream_assembles_to_the_same_text_and_usage(llm: Local) -> None:
    prompt = user("tell me a story about a ratchet that only turns one way")
    whole = llm.openai.chat.completions.create(model=GPT, messages=prompt)
    chunks = list(
        llm.openai.chat.completions.create(
            model=GPT, messages=prompt, stream=True, stream_options={"include_usage": True}
        )
    )
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert len(chunks) > 4  # really streamed in pieces
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    with llm.openai.chat.completions.stream(model=GPT, messages=prompt) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == whole.choices[0].message.content


def test_responses_stream_assembles_to_the_same_text_and_usage(llm: Local) -> None:
    prompt = "tell me a story about a ratchet that only turns one way"
    whole = llm.openai.responses.create(model=GPT, input=prompt)
    events = list(llm.openai.responses.create(model=GPT, input=prompt, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 2 and "".join(deltas) == whole.output_text
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == whole.output_text
    assert completed.response.usage == whole.usage
    with llm.openai.responses.stream(model=GPT, input=prompt) as stream:
        final = stream.get_final_response()
    assert final.output_text == whole.output_text


def test_messages_stream_assembles_to_the_same_text_and_usage(llm: Local) -> None:
    prompt = user("tell me a story about a ratchet that only turns one way")
    whole = llm.anthropic.messages.create(model=CLAUDE, max_tokens=100, messages=prompt)
    with llm.anthropic.messages.stream(model=CLAUDE, max_tokens=100, messages=prompt) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 2
    assert "".join(pieces) == final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage == whole.usage
    events = [
        e.type
        for e in llm.anthropic.messages.create(
            model=CLAUDE, max_tokens=100, messages=prompt, stream=True
        )
    ]
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    assert {"content_block_start", "content_block_delta", "content_block_stop"} <= set(events)


# -- scripted replies ---------------------------------------------------------------------


def test_chat_tool_call_then_tool_result_as_scripted(llm: Local) -> None:
    asked = user("What is the weather in Paris?")
    first = llm.openai.chat.completions.create(model=GPT, messages=asked, tools=[WEATHER_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert first.usage is not None
    assert first.usage.prompt_tokens == tokens(
        "What is the weather in Paris?"
        + json.dumps([WEATHER_TOOL], separators=(",", ":"), sort_keys=True)
    )
    assert first.usage.completion_tokens == tokens("get_weather" + '{"city":"Paris"}')
    # The user's message still says "weather", but the conversation now ends with the
    # tool's result: the tool rule answers, not the weather rule again.
    history: Any = [
        *asked,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"weather": "sunny"}'},
    ]
    second = llm.openai.chat.completions.create(model=GPT, tools=[WEATHER_TOOL], messages=history)
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].finish_reason == "stop"
    streamed = list(
        llm.openai.chat.completions.create(
            model=GPT, messages=asked, tools=[WEATHER_TOOL], stream=True
        )
    )
    arguments = "".join(
        tc.function.arguments or ""
        for c in streamed
        if c.choices
        for tc in c.choices[0].delta.tool_calls or ()
        if tc.function
    )
    assert json.loads(arguments) == {"city": "Paris"}


def test_responses_function_call_as_scripted(llm: Local) -> None:
    tool: Any = {
        "type": "function",
        "name": "get_weather",
        "parameters": WEATHER_TOOL["function"]["parameters"],
    }
    first = llm.openai.responses.create(model=GPT, input="weather in Paris?", tools=[tool])
    [call] = first.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    second = llm.openai.responses.create(
        model=GPT,
        tools=[tool],
        input=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
    )
    assert second.output_text == "It is sunny in Paris."
    with llm.openai.responses.stream(model=GPT, input="weather in Paris?", tools=[tool]) as stream:
        final = stream.get_final_response()
    [streamed] = final.output
    assert isinstance(streamed, ResponseFunctionToolCall)
    assert json.loads(streamed.arguments) == {"city": "Paris"}


def test_messages_tool_use_as_scripted(llm: Local) -> None:
    asked = user("weather in Paris?")
    first = llm.anthropic.messages.create(model=CLAUDE, max_tokens=100, messages=asked)
    assert first.stop_reason == "tool_use"
    text, use = first.content
    assert isinstance(text, TextBlock) and text.text == "Let me look."
    assert isinstance(use, ToolUseBlock)
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    with llm.anthropic.messages.stream(model=CLAUDE, max_tokens=100, messages=asked) as stream:
        streamed = stream.get_final_message()
    assert isinstance(streamed.content[1], ToolUseBlock)
    assert streamed.content[1].input == {"city": "Paris"}
    history: Any = [
        *asked,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "the weather is sunny"}
            ],
        },
    ]
    second = llm.anthropic.messages.create(model=CLAUDE, max_tokens=100, messages=history)
    assert second.content[0].text == "It is sunny in Paris."  # type: ignore[union-attr]
    assert second.stop_reason == "end_turn"


def test_model_rule_sets_usage_and_is_used_its_times_only(llm: Local) -> None:
    prompt = user("hi there, how is it going?")
    answers = [
        llm.openai.chat.completions.create(model="gpt-4.1-nano", messages=prompt) for _ in range(3)
    ]
    assert [a.choices[0].message.content for a in answers] == [
        "fixed answer",
        "fixed answer",
        "echo: hi there, how is it going?",
    ]
    usage = answers[0].usage
    assert usage is not None and usage.completion_tokens == 12
    assert usage.prompt_tokens == tokens("hi there, how is it going?")
    assert usage.prompt_tokens_details and usage.prompt_tokens_details.cached_tokens == 3
    assert usage.completion_tokens_details
    assert usage.completion_tokens_details.reasoning_tokens == 5
    llm.provider.reset()  # a reset makes the rule whole again
    again = llm.openai.chat.completions.create(model="gpt-4.1-nano", messages=prompt)
    assert again.choices[0].message.content == "fixed answer"


class City(BaseModel):
    name: str
    population: int
    districts: list[str]


def test_structured_output_fits_the_requested_schema(llm: Local) -> None:
    chat = llm.openai.chat.completions.parse(
        model=GPT, messages=user("a city"), response_format=City
    )
    assert chat.choices[0].message.parsed == City(
        name="echo: a city", population=0, districts=["echo: a city"]
    )
    response = llm.openai.responses.parse(model=GPT, input="a city", text_format=City)
    assert response.output_parsed == chat.choices[0].message.parsed


# -- idempotency --------------------------------------------------------------------------


def test_same_key_twice_is_billed_once_and_replays_the_same_answer(llm: Local) -> None:
    key = {"Idempotency-Key": "step-key-1"}
    first = llm.openai.chat.completions.with_raw_response.create(
        model=GPT, messages=user("once"), extra_headers=key
    )
    second = llm.openai.chat.completions.with_raw_response.create(
        model=GPT, messages=user("once"), extra_headers=key
    )
    assert first.headers.get("idempotent-replayed") is None
    assert second.headers["idempotent-replayed"] == "true"
    assert second.parse().id == first.parse().id
    assert second.parse().usage == first.parse().usage
    stats = llm.provider.stats()
    assert stats["billed_calls"] == 1 and stats["replayed"] == 1 and stats["requests"] == 2
    billed, replayed = llm.provider.requests()
    assert (billed["billed"], billed["replayed"]) == (True, False)
    assert (replayed["billed"], replayed["replayed"]) == (False, True)
    assert replayed["idempotency_key"] == "step-key-1"
    # Streams replay the same events; Anthropic keeps keys the same way.
    streams = [
        [
            c.model_dump()
            for c in llm.openai.chat.completions.create(
                model=GPT,
                messages=user("stream once"),
                stream=True,
                extra_headers={"Idempotency-Key": "step-key-2"},
            )
        ]
        for _ in range(2)
    ]
    assert streams[0] == streams[1]
    messages = [
        llm.anthropic.messages.create(
            model=CLAUDE,
            max_tokens=10,
            messages=user("x"),
            extra_headers={"Idempotency-Key": "step-key-3"},
        )
        for _ in range(2)
    ]
    assert messages[0].id == messages[1].id
    assert llm.provider.stats()["billed_calls"] == 3


def test_same_key_with_another_body_is_refused_naming_the_key(llm: Local) -> None:
    key = {"Idempotency-Key": "step-key-9"}
    llm.openai.chat.completions.create(model=GPT, messages=user("one"), extra_headers=key)
    with pytest.raises(openai.UnprocessableEntityError, match="step-key-9"):
        llm.openai.chat.completions.create(model=GPT, messages=user("two"), extra_headers=key)
    with pytest.raises(anthropic.UnprocessableEntityError, match="step-key-9"):
        llm.anthropic.messages.create(
            model=CLAUDE, max_tokens=10, messages=user("one"), extra_headers=key
        )
    stats = llm.provider.stats()
    assert stats["billed_calls"] == 1 and stats["refused"] == 2


def test_concurrent_duplicates_are_billed_once(llm: Local) -> None:
    # The first to arrive is slow, so the others come while it is being answered.
    llm.provider.fail("slow", delay_s=0.5)
    ids: list[str] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            ids.append(
                llm.openai.chat.completions.create(
                    model=GPT, messages=user("dup"), extra_headers={"Idempotency-Key": "k"}
                ).id
            )
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(ids) == 4 and len(set(ids)) == 1
    stats = llm.provider.stats()
    assert stats["billed_calls"] == 1 and stats["replayed"] == 3


async def test_a_duplicate_in_flight_waits_for_the_stored_answer() -> None:
    store = IdempotencyStore()
    claim = store.begin("k", "print")
    assert isinstance(claim, Claim)
    waiting = store.begin("k", "print")
    assert isinstance(waiting, Wait) and not waiting.done.done()
    answer = Answer(usage=Usage(1, 1), body={"id": "x"})
    store.store(claim, answer)
    await asyncio.wait_for(waiting.done, 5)
    assert store.begin("k", "print") == Replay(answer)
    # A claim released without an answer lets the next request claim the key.
    other = store.begin("k2", "print")
    assert isinstance(other, Claim)
    behind = store.begin("k2", "print")
    assert isinstance(behind, Wait)
    store.release(other)
    assert behind.done.done() and isinstance(store.begin("k2", "print"), Claim)


# -- faults ---------------------------------------------------------------------------------


def test_rate_limit_carries_retry_after_and_is_not_billed(llm: Local) -> None:
    llm.provider.fail("429", retry_after=7)
    with pytest.raises(openai.RateLimitError) as caught:
        llm.openai.chat.completions.create(
            model=GPT, messages=user("hi"), extra_headers={"Idempotency-Key": "rl"}
        )
    assert caught.value.response.headers["retry-after"] == "7"
    # Nothing was stored under the key: the retry is answered and billed.
    retried = llm.openai.chat.completions.with_raw_response.create(
        model=GPT, messages=user("hi"), extra_headers={"Idempotency-Key": "rl"}
    )
    assert retried.headers.get("idempotent-replayed") is None
    llm.provider.fail(429, endpoint="messages")
    llm.openai.chat.completions.create(model=GPT, messages=user("not for chat"))
    with pytest.raises(anthropic.RateLimitError):
        llm.anthropic.messages.create(model=CLAUDE, max_tokens=10, messages=user("hi"))
    stats = llm.provider.stats()
    assert stats["faults"] == 2 and stats["billed_calls"] == 2
    assert [e["fault"] for e in llm.provider.requests()] == ["429", None, None, "429"]


def test_server_errors_for_as_many_times_as_queued(llm: Local) -> None:
    llm.provider.fail("500", times=2)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            llm.openai.responses.create(model=GPT, input="hi")
    assert llm.openai.responses.create(model=GPT, input="hi").output_text == "echo: hi"
    # The SDK's own retries get through, waiting what retry-after says.
    with_retries = llm.openai.with_options(max_retries=2)
    llm.provider.fail("500", times=2, retry_after=0.01)
    assert with_retries.responses.create(model=GPT, input="hi").output_text == "echo: hi"
    assert llm.provider.stats()["billed_calls"] == 2


def test_a_dropped_answer_is_billed_once_and_stored(llm: Local) -> None:
    llm.provider.fail("drop")
    with pytest.raises(openai.APIConnectionError):
        llm.openai.chat.completions.create(
            model=GPT, messages=user("lost"), extra_headers={"Idempotency-Key": "drop-1"}
        )
    stats = llm.provider.stats()
    assert stats["billed_calls"] == 1 and stats["faults"] == 1
    [entry] = llm.provider.requests()
    assert entry["fault"] == "drop" and entry["billed"] is True and entry["status"] is None
    again = llm.openai.chat.completions.with_raw_response.create(
        model=GPT, messages=user("lost"), extra_headers={"Idempotency-Key": "drop-1"}
    )
    assert again.headers["idempotent-replayed"] == "true"
    assert again.parse().usage is not None
    assert again.parse().usage.prompt_tokens == entry["input_tokens"]  # type: ignore[union-attr]
    assert llm.provider.stats()["billed_calls"] == 1
    llm.provider.fail("drop", endpoint="messages")
    with pytest.raises(anthropic.APIConnectionError):
        llm.anthropic.messages.create(model=CLAUDE, max_tokens=10, messages=user("lost"))


CLIENT = textwrap.dedent("""
    import sys, openai
    client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-x", max_retries=0)
    reply = client.chat.completions.create(model="gpt-4.1-mini", messages=[
        {"role": "user", "content": "in flight"}], extra_headers={"Idempotency-Key": "dies"})
    print("answered", reply.id, flush=True)
""")


def test_a_client_killed_in_flight_leaves_its_call_billed_once_and_stored(llm: Local) -> None:
    llm.provider.fail("slow", delay_s=2)
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, f"{llm.base}/v1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: llm.provider.stats()["received"] == 1, what="the call to arrive")
    finally:
        client.kill()
        out = client.communicate(timeout=10)[0]
    assert b"answered" not in out  # it died before the answer came
    wait_for(lambda: llm.provider.stats()["billed_calls"] == 1, what="the call to be billed")
    retry = llm.openai.chat.completions.with_raw_response.create(
        model=GPT, messages=user("in flight"), extra_headers={"Idempotency-Key": "dies"}
    )
    assert retry.headers["idempotent-replayed"] == "true"
    assert llm.provider.stats()["billed_calls"] == 1


def test_faults_from_the_script_and_the_control_endpoint() -> None:
    script = {"faults": [{"kind": 429, "endpoint": "chat"}]}
    with local(script) as served:
        with pytest.raises(openai.RateLimitError):
            served.openai.chat.completions.create(model=GPT, messages=user("hi"))
        status, body = post_json(
            f"{served.base}/_ratchet/faults", {"kind": "500", "times": 2, "endpoint": "responses"}
        )
        assert status == 200 and body["pending"][0]["times"] == 2
        with pytest.raises(openai.InternalServerError):
            served.openai.responses.create(model=GPT, input="hi")
        status, body = post_json(f"{served.base}/_ratchet/faults", {"kind": "teapot"})
        assert status == 400 and "kind" in body["error"]["message"]
        status, body = post_json(f"{served.base}/_ratchet/faults", {"kind": "slow"})
        assert status == 400 and "delay_s" in body["error"]["message"]
        assert get_json(f"{served.base}/_ratchet/stats") == served.provider.stats()
        assert get_json(f"{served.base}/_ratchet/requests") == served.provider.requests()
        assert get_json(f"{served.base}/_ratchet/health") == {"status": "ok"}
        assert post_json(f"{served.base}/_ratchet/reset", {})[0] == 200
        assert served.provider.stats()["requests"] == 0
        # The reset queued the script's fault again.
        with pytest.raises(openai.RateLimitError):
            served.openai.chat.completions.create(model=GPT, messages=user("hi"))
    with pytest.raises(ScriptError, match="retry_after is for 429 and 500"):
        served.provider.fail("drop", retry_after=1)


# -- bad input, the log, secrets -------------------------------------------------------------


def test_a_bad_request_is_refused_naming_the_field(llm: Local) -> None:
    with pytest.raises(openai.BadRequestError, match="'messages' is required"):
        llm.openai.chat.completions.create(model=GPT, messages=[])
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        llm.anthropic.messages.create(model=CLAUDE, messages=user("x"), max_tokens=0)
    with pytest.raises(openai.NotFoundError, match="/v1"):
        llm.openai.with_options(base_url=llm.base).chat.completions.create(
            model=GPT, messages=user("x")
        )
    stats = llm.provider.stats()
    assert stats["refused"] == 3 and stats["billed_calls"] == 0


def test_api_keys_are_never_logged_or_stored(llm: Local) -> None:
    llm.openai.chat.completions.create(
        model=GPT, messages=user("a"), extra_headers={"Idempotency-Key": "s1"}
    )
    llm.anthropic.messages.create(model=CLAUDE, max_tokens=10, messages=user("b"))
    llm.provider.fail("429")
    with pytest.raises(openai.RateLimitError):
        llm.openai.embeddings.create(model="text-embedding-3-small", input="c")
    assert llm.log_path is not None
    log_path = llm.log_path
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert lines == llm.provider.requests() and len(lines) == 3
    assert set(lines[0]) == {
        "at",
        "path",
        "endpoint",
        "model",
        "idempotency_key",
        "status",
        "billed",
        "replayed",
        "input_tokens",
        "output_tokens",
        "fault",
        "request_id",
    }
    everything = log_path.read_text() + json.dumps(get_json(f"{llm.base}/_ratchet/requests"))
    for secret in (OPENAI_KEY, ANTHROPIC_KEY, "SECRET", "Bearer"):
        assert secret not in everything
    assert "s1" in everything  # the log does hold what it should


BAD_SCRIPTS = [
    (
        {"rules": [{"match": {"endpoint": "chats"}, "reply": {"text": "x"}}]},
        "rules.0.match.endpoint",
    ),
    ({"rules": [{"match": {"contains": "x"}}]}, "rules.0.reply: Field required"),
    ({"rules": [{"reply": {"text": "x", "json": {"a": 1}}}]}, "either text or json"),
    ({"rules": [{"reply": {"txt": "x"}}]}, "rules.0.reply.txt: unknown field"),
    ({"rules": [{"reply": {"text": "x"}, "times": 0}]}, "rules.0.times"),
    ({"faults": [{"kind": "slow"}]}, "needs delay_s"),
    ({"rule": []}, "rule: unknown field"),
]


@pytest.mark.parametrize(("script", "problem"), BAD_SCRIPTS)
def test_a_bad_script_is_refused_naming_the_problem(script: dict[str, Any], problem: str) -> None:
    with pytest.raises(ScriptError, match="invalid script") as caught:
        LocalProvider(script)
    assert problem in str(caught.value)


def test_a_bad_script_file_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules: [\n")
    with pytest.raises(ScriptError, match="broken.yaml.*not valid YAML"):
        LocalProvider(broken)
    with pytest.raises(ScriptError, match="not found"):
        LocalProvider(tmp_path / "missing.yaml")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ScriptError, match="expected a mapping"):
        LocalProvider(listed)


# -- the CLI verb -------------------------------------------------------------------------


def test_cli_serves_an_sdk_call_and_stops_on_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(WEATHER_SCRIPT)
    out, log = tmp_path / "out.txt", tmp_path / "requests.jsonl"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ratchet.cli",
                "llm-server",
                "--port",
                "0",
                "--script",
                str(script),
                "--log",
                str(log),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        line = wait_for(
            lambda: next(
                (
                    ln
                    for ln in out.read_text().splitlines()
                    if ln.startswith("llm-server listening on ")
                ),
                None,
            ),
            what="the ready line",
        )
        base = line.removeprefix("llm-server listening on ")
        assert base.startswith("http://127.0.0.1:") and not base.endswith(":0")
        with openai.OpenAI(base_url=f"{base}/v1", api_key=OPENAI_KEY, max_retries=0) as client:
            reply = client.chat.completions.create(model=GPT, messages=user("weather?"))
        assert reply.choices[0].finish_reason == "tool_calls"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.read_text().splitlines() == [line]
    [entry] = [json.loads(x) for x in log.read_text().splitlines()]
    assert entry["billed"] is True and OPENAI_KEY not in log.read_text()


def test_cli_refuses_a_bad_script_with_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text("rules:\n  - match: {endpoint: chats}\n    reply: {text: x}\n")
    result = CliRunner().invoke(cli, ["llm-server", "--port", "0", "--script", str(script)])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("error: invalid script file") and "rules.0.match.endpoint" in line


def test_cli_refuses_a_port_in_use_with_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["llm-server", "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: ")


def test_the_public_names_are_pinned() -> None:
    assert set(server.__all__) == {"LocalProvider", "ScriptError", "run_until_signalled", "serve"}
    for name in server.__all__:
        assert (getattr(server, name).__doc__ or "").strip(), name
