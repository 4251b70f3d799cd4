"""Streamed model calls (``create(stream=True)``) in workflows, over real HTTP to the local
provider, on SQLite and PostgreSQL: a replay yields the chunks the first drive got, boundary
for boundary; a stream the workflow stops reading ends its step before the next step starts,
with its usage; the journal keeps a long stream small."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from crash_app import LLM_SECRET
from waiting import wait_for

import ratchet
from ratchet.llm.server import LocalProvider, serve

MODEL = "gpt-4.1-mini"
CHAT_STEP = "1:openai.chat.completions.create"
# 40 words of 15 letters and a space: the local provider streams one word a chunk.
LONG = "".join(f"{chr(97 + i % 26) * 15} " for i in range(40))
pytestmark = pytest.mark.usefixtures("collect_clients")


def clients(base: str) -> tuple[Any, Any]:
    return (
        ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET)),
        ratchet.llm.wrap(anthropic.AsyncAnthropic(base_url=base, api_key=LLM_SECRET)),
    )


def events(app: ratchet.Ratchet, run_id: str) -> list[ratchet.Event]:
    return list(app.events(run_id))


def first_seq(app: ratchet.Ratchet, run_id: str, kind: str, step_id: str) -> int:
    return next(e.seq for e in events(app, run_id) if e.kind == kind and e.step_id == step_id)


def park_then_resume(app: ratchet.Ratchet, run_id: str) -> Any:
    wait_for(lambda: app.get(run_id).status == ratchet.RunStatus.WAITING, what="the park")
    app.signal(run_id, "go")
    return app.result(run_id, timeout_s=30)


def test_a_replayed_stream_yields_the_chunks_of_the_first_drive(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    script = {
        "rules": [
            {
                "match": {"contains": "tools"},
                "reply": {
                    "text": "Looking it up.",
                    "tool_calls": [{"name": "lookup", "arguments": {"city": "Paris", "days": 3}}],
                },
            },
            {"match": {}, "reply": {"text": LONG}},
        ]
    }
    server = LocalProvider(script)
    seen: list[dict[str, list[Any]]] = []
    with serve(server) as base:
        oai, claude = clients(base)
        app = make_app()

        @app.workflow()
        async def streamer() -> dict[str, int]:
            got: dict[str, list[Any]] = {}
            for name, prompt in (("chat", "long"), ("chat_tools", "tools please")):
                stream = await oai.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": prompt}], stream=True
                )
                got[name] = [chunk.to_dict() async for chunk in stream]
            stream = await oai.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "usage"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            got["chat_usage"] = [chunk.to_dict() async for chunk in stream]
            stream = await oai.responses.create(model=MODEL, input="long", stream=True)
            got["responses"] = [event.to_dict() async for event in stream]
            stream = await claude.messages.create(
                model="claude-sonnet-4-6",
                max_tokens=1024,
                stream=True,
                messages=[{"role": "user", "content": "long"}],
            )
            got["messages"] = [event.to_dict() async for event in stream]
            seen.append(got)
            await ratchet.wait_for_signal("go")  # parks: the next drive replays the streams
            return {name: len(chunks) for name, chunks in got.items()}

        app.launch()
        run_id = app.start(streamer)
        counts = park_then_resume(app, run_id)
    first, replayed = seen
    assert replayed == first  # every chunk, boundary for boundary, field for field
    assert counts["chat"] > 40 and counts["responses"] > 40 and counts["messages"] > 40
    assert [c["choices"][0]["delta"].get("content") for c in first["chat"][1:41]] == [
        LONG[i : i + 16] for i in range(0, len(LONG), 16)
    ]
    assert not any(c.get("usage") for c in first["chat"])  # not asked for: not shown
    assert first["chat_usage"][-1]["usage"]["completion_tokens"] > 0
    assert len(server.requests()) == 5  # the replay called no provider


class Enough(Exception):
    """The workflow has read enough."""


@pytest.mark.parametrize("how", ["break", "exception", "aclose", "async_with"])
def test_a_stream_the_workflow_stops_reading_ends_its_step_before_the_next_one(
    make_app: Callable[..., ratchet.Ratchet], how: str
) -> None:
    server = LocalProvider({"rules": [{"match": {}, "reply": {"text": LONG}}]})
    # The provider sends two chunks, then holds the rest back far longer than the test.
    server.fail("stall", after_events=2, delay_s=120)
    doubled: list[int] = []
    with serve(server) as base:
        oai, _ = clients(base)
        app = make_app()

        @app.step()
        async def double(n: int) -> int:
            doubled.append(n)
            return 2 * n

        @app.workflow()
        async def reader() -> list[Any]:
            stream = await oai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "tell me"}], stream=True
            )
            got: list[str] = []
            if how == "break":
                async for chunk in stream:
                    got.append(chunk.choices[0].delta.content or "")
                    if len(got) == 2:
                        break
            elif how == "exception":
                try:
                    async for chunk in stream:
                        got.append(chunk.choices[0].delta.content or "")
                        if len(got) == 2:
                            raise Enough
                except Enough:
                    pass
            elif how == "aclose":
                chunks = aiter(stream)
                got.append((await anext(chunks)).choices[0].delta.content or "")
                got.append((await anext(chunks)).choices[0].delta.content or "")
                await stream.aclose()
            else:
                async with stream:
                    async for chunk in stream:
                        got.append(chunk.choices[0].delta.content or "")
                        if len(got) == 2:
                            break
            twice = await double(len(got))
            await ratchet.wait_for_signal("go")
            return [got, twice]

        app.launch()
        run_id = app.start(reader)
        wait_for(
            lambda: app.get(run_id).status == ratchet.RunStatus.WAITING, timeout=30, what="the park"
        )
        # The stream's step ended before the next step started, with what had arrived.
        done = first_seq(app, run_id, "step_completed", CHAT_STEP)
        assert done < first_seq(app, run_id, "step_started", "2:double")
        [completed] = [
            e for e in events(app, run_id) if e.kind == "step_completed" and e.step_id == CHAT_STEP
        ]
        output, llm = completed.payload["output"], completed.payload["llm"]
        assert output["complete"] is False
        assert output["response"]["choices"][0]["message"]["content"] == LONG[:16]
        # The provider had not reported usage yet: it is estimated, never left out.
        assert llm["usage_estimated"] is True
        assert llm["usage"]["input_tokens"] > 0 and llm["usage"]["output_tokens"] == 4
        assert llm["cost_usd"] > 0
        state = ratchet.model.fold(run_id, app.events(run_id))
        assert state.llm.calls == 1 and state.llm.input_tokens == llm["usage"]["input_tokens"]
        app.signal(run_id, "go")
        out = app.result(run_id, timeout_s=30)  # the re-drive: no NonDeterminismError
    assert out == [["", LONG[:16]], 4]
    assert doubled == [2]  # the later step's output was reused
    assert len(server.requests()) == 1


def test_a_stream_that_breaks_after_chunks_completes_with_them_and_fails_after_them_on_replay(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    server = LocalProvider({"rules": [{"match": {}, "reply": {"text": LONG}}]})
    server.fail("cut", after_events=3)  # three chunks, then the connection is closed
    seen: list[list[Any]] = []
    with serve(server) as base:
        oai, _ = clients(base)
        app = make_app()

        @app.step()
        async def note(n: int) -> int:
            return n

        @app.workflow()
        async def reader() -> list[Any]:
            stream = await oai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "tell me"}], stream=True
            )
            got: list[str] = []
            try:
                async for chunk in stream:
                    got.append(chunk.choices[0].delta.content or "")
            except ratchet.LLMError as e:
                got.append(f"error: {e}")
            seen.append(got)
            await note(len(got))
            await ratchet.wait_for_signal("go")
            return got

        app.launch()
        run_id = app.start(reader)
        out = park_then_resume(app, run_id)
    first, replayed = seen
    assert replayed == first == out
    assert out[:3] == ["", LONG[:16], LONG[16:32]] and out[3].startswith("error: ")
    assert "the stream broke after 3 chunks" in out[3]
    [completed] = [
        e for e in events(app, run_id) if e.kind == "step_completed" and e.step_id == CHAT_STEP
    ]
    assert completed.payload["output"]["complete"] is False
    assert completed.payload["llm"]["usage_estimated"] is True
    assert not [e for e in events(app, run_id) if e.kind in ("step_failed", "step_retrying")]
    assert len(server.requests()) == 1  # not sent again: the workflow had seen its chunks


def test_a_stream_still_held_when_the_workflow_goes_on_is_read_to_its_end_first(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    server = LocalProvider({"rules": [{"match": {}, "reply": {"text": LONG}}]})
    with serve(server) as base:
        oai, _ = clients(base)
        app = make_app()

        @app.step()
        async def note(text: str) -> str:
            return text.upper()

        @app.workflow()
        async def reader() -> list[str]:
            stream = await oai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "tell me"}], stream=True
            )
            chunks = aiter(stream)
            await anext(chunks)
            head = (await anext(chunks)).choices[0].delta.content or ""
            noted = await note(head)  # the stream is still held: read to its end first
            rest = [c.choices[0].delta.content or "" async for c in chunks if c.choices]
            await ratchet.wait_for_signal("go")
            return [head, noted, "".join(rest)]

        app.launch()
        run_id = app.start(reader)
        out = park_then_resume(app, run_id)
    assert out == [LONG[:16], LONG[:16].upper(), LONG[16:]]
    assert first_seq(app, run_id, "step_completed", CHAT_STEP) < first_seq(
        app, run_id, "step_started", "2:note"
    )
    [completed] = [
        e for e in events(app, run_id) if e.kind == "step_completed" and e.step_id == CHAT_STEP
    ]
    assert completed.payload["output"]["complete"] is True
    assert "usage_estimated" not in completed.payload["llm"]
    [billed] = server.requests()
    assert completed.payload["llm"]["usage"]["output_tokens"] == billed["output_tokens"]


def test_a_long_stream_is_journaled_as_its_response_and_the_lengths_of_its_chunks(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    words = 1000
    text = "".join(f"{chr(97 + i % 26) * 15} " for i in range(words))
    server = LocalProvider({"rules": [{"match": {}, "reply": {"text": text}}]})
    with serve(server) as base:
        oai, _ = clients(base)
        app = make_app()

        @app.workflow()
        async def reader() -> int:
            stream = await oai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "tell me"}], stream=True
            )
            return len([chunk async for chunk in stream])

        app.launch()
        run_id = app.start(reader)
        assert app.result(run_id, timeout_s=60) == words + 2  # the role and finish chunks
    [completed] = [
        e for e in events(app, run_id) if e.kind == "step_completed" and e.step_id == CHAT_STEP
    ]
    output = completed.payload["output"]
    response = len(json.dumps(output["response"], separators=(",", ":")))
    boundaries = len(json.dumps(output["chunks"], separators=(",", ":")))
    # A few shapes, the 1,000 text chunks all of one, and a length ("16,") for each.
    assert boundaries < 5 * words, (response, boundaries)
    assert len(output["chunks"]["shapes"]) <= 5
