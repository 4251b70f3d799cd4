"""LLM calls through the official SDKs, wrapped, over real HTTP to the local provider, on
SQLite and PostgreSQL: keys, replay, usage and cost, retry classes, streams, tools, the agent
loop, and crashes that must not bill twice."""

from __future__ import annotations

import asyncio
import importlib
import json
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import psycopg
import pytest
from crash_app import LLM_SECRET
from proc import Harness
from waiting import wait_for

import ratchet
from ratchet.llm.server import LocalProvider, serve
from ratchet.model import idempotency_key

MODEL = "gpt-4.1-mini"
pytestmark = pytest.mark.usefixtures("collect_clients")


def clients(base: str) -> tuple[Any, Any]:
    return (
        ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET)),
        ratchet.llm.wrap(anthropic.AsyncAnthropic(base_url=base, api_key=LLM_SECRET)),
    )


def llm_steps(app: ratchet.Ratchet, run_id: str, kind: str) -> list[ratchet.Event]:
    return [
        e for e in app.events(run_id) if e.kind == kind and e.step_id and ".create" in e.step_id
    ]


def test_each_call_is_a_step_sending_its_key_with_usage_and_cost(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai, claude = clients(base)
    app = make_app()

    @app.workflow()
    async def triage(ticket: str) -> list[str]:
        chat = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": ticket}]
        )
        resp = await oai.responses.create(model=MODEL, input=ticket)
        emb = await oai.embeddings.create(model="text-embedding-3-small", input=ticket)
        msg = await claude.messages.create(
            model="claude-sonnet-4-6", max_tokens=64, messages=[{"role": "user", "content": ticket}]
        )
        return [
            type(chat).__name__,
            chat.choices[0].message.content or "",
            type(resp).__name__,
            resp.output_text,
            type(emb).__name__,
            str(len(emb.data[0].embedding)),
            type(msg).__name__,
            msg.content[0].text,
        ]

    app.launch()
    run_id = app.start(triage, "my printer is on fire")
    out = app.result(run_id, timeout_s=30)
    assert out[0::2] == ["ChatCompletion", "Response", "CreateEmbeddingResponse", "Message"]
    assert "my printer is on fire" in out[1] and "my printer is on fire" in out[7]

    started = llm_steps(app, run_id, "step_started")
    assert [e.step_id for e in started] == [
        "1:openai.chat.completions.create",
        "2:openai.responses.create",
        "3:openai.embeddings.create",
        "4:anthropic.messages.create",
    ]
    keys = [idempotency_key(run_id, e.step_id or "", 1) for e in started]
    assert [e.payload["idempotency_key"] for e in started] == keys
    assert all(e.payload["kind"] == "llm" for e in started)
    # The provider saw each key once, and billed each call once.
    seen = [r["idempotency_key"] for r in server.requests()]
    assert seen == keys
    completed = llm_steps(app, run_id, "step_completed")
    billed = [r for r in server.requests() if r["billed"]]
    assert [e.payload["llm"]["usage"]["output_tokens"] for e in completed] == [
        r["output_tokens"] for r in billed
    ]
    assert [e.payload["llm"]["request_id"] for e in completed] == [r["request_id"] for r in billed]
    chat_meta = completed[0].payload["llm"]
    assert chat_meta["provider"] == "openai" and chat_meta["model"].startswith(MODEL)
    usage = chat_meta["usage"]
    expected = round(
        (usage["input_tokens"] - usage["cached_tokens"]) * 0.4e-6
        + usage["cached_tokens"] * 0.1e-6
        + usage["output_tokens"] * 1.6e-6,
        10,
    )
    assert chat_meta["cost_usd"] == pytest.approx(expected)
    # Run totals: folded from the journal, the same in the list query.
    state = ratchet.model.fold(run_id, app.events(run_id))
    assert state.llm.calls == 4
    assert state.llm.output_tokens == sum(r["output_tokens"] for r in billed)
    assert state.llm.input_tokens == sum(
        e.payload["llm"]["usage"]["input_tokens"] for e in completed
    )
    listed = app.llm_totals([run_id])[run_id]
    assert (listed.calls, listed.tokens, listed.cost_usd) == (
        state.llm.calls,
        state.llm.tokens,
        state.llm.cost_usd,
    )


def test_completed_calls_are_read_back_on_replay_never_sent_again(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai, claude = clients(base)
    app = make_app()

    @app.workflow()
    async def talk() -> list[str]:
        first = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "one"}]
        )
        second = await claude.messages.create(
            model="claude-sonnet-4-6", max_tokens=32, messages=[{"role": "user", "content": "two"}]
        )
        await ratchet.wait_for_signal("go")  # parks: the next drive replays both calls
        third = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "three"}]
        )
        return [
            first.choices[0].message.content or "",
            second.content[0].text,
            third.choices[0].message.content or "",
        ]

    app.launch()
    run_id = app.start(talk)
    wait_for(lambda: app.get(run_id).status == ratchet.RunStatus.WAITING, what="the park")
    assert len(server.requests()) == 2
    app.signal(run_id, "go")
    out = app.result(run_id, timeout_s=30)
    assert ["one" in out[0], "two" in out[1], "three" in out[2]] == [True, True, True]
    assert len(server.requests()) == 3 and server.stats()["billed_calls"] == 3
    drives = [e for e in app.events(run_id) if e.kind in ("run_started", "run_resumed")]
    assert len(drives) == 2


def test_a_rate_limit_is_retried_as_a_new_attempt_with_a_new_key(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai, _ = clients(base)
    app = make_app()

    @app.workflow()
    async def once() -> str:
        reply = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        return reply.choices[0].message.content or ""

    server.fail("429", times=1, retry_after=0.3)
    app.launch()
    run_id = app.start(once)
    assert "hi" in app.result(run_id, timeout_s=30)
    step = "1:openai.chat.completions.create"
    started = [e for e in app.events(run_id) if e.kind == "step_started"]
    assert [e.attempt for e in started] == [1, 2]
    assert [e.payload["idempotency_key"] for e in started] == [
        idempotency_key(run_id, step, 1),
        idempotency_key(run_id, step, 2),
    ]
    [retrying] = [e for e in app.events(run_id) if e.kind == "step_retrying"]
    assert "429" in retrying.payload["error"] and retrying.payload["delay_s"] >= 0.3
    assert [r["status"] for r in server.requests()] == [429, 200]
    assert server.stats()["billed_calls"] == 1


def test_a_refused_request_fails_the_step_with_the_providers_message(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai, _ = clients(base)
    app = make_app()

    @app.workflow()
    async def bad() -> str:
        reply = await oai.chat.completions.create(model=MODEL, messages=[])
        return reply.choices[0].message.content or ""

    app.launch()
    run_id = app.start(bad)
    with pytest.raises(ratchet.RunFailed, match="400"):
        app.result(run_id, timeout_s=30)
    [failed] = [e for e in app.events(run_id) if e.kind == "step_failed"]
    assert failed.attempt == 1 and failed.payload["error_type"] == "LLMRequestError"
    assert "400" in failed.payload["error"]
    assert len(server.requests()) == 1  # not retried


def test_a_stream_passes_chunks_through_and_replays_the_journaled_response(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai, claude = clients(base)
    app = make_app()
    seen: list[list[str]] = []

    @app.workflow()
    async def streamer() -> list[str]:
        parts: list[str] = []
        stream = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "stream me"}], stream=True
        )
        async for chunk in stream:
            parts.append(chunk.choices[0].delta.content or "")
        text: list[str] = []
        events = await claude.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=64,
            stream=True,
            messages=[{"role": "user", "content": "and me"}],
        )
        async for event in events:
            if event.type == "content_block_delta":
                text.append(event.delta.text)
        seen.append(["".join(parts), "".join(text)])
        await ratchet.wait_for_signal("go")
        return ["".join(parts), "".join(text)]

    app.launch()
    run_id = app.start(streamer)
    wait_for(lambda: app.get(run_id).status == ratchet.RunStatus.WAITING, what="the park")
    app.signal(run_id, "go")
    out = app.result(run_id, timeout_s=30)
    assert "stream me" in out[0] and "and me" in out[1]
    assert seen == [out, out]  # the replay saw the same text, rebuilt from the journal
    assert server.stats()["billed_calls"] == 2 and len(server.requests()) == 2
    completed = llm_steps(app, run_id, "step_completed")
    # The response the chunks assemble into, and what it takes to cut it into them again.
    output = completed[0].payload["output"]
    assert output["response"]["choices"][0]["message"]["content"] == out[0]
    assert output["complete"] is True and output["chunks"]["runs"]
    assert completed[0].payload["llm"]["usage"]["output_tokens"] > 0
    assert completed[1].payload["llm"]["usage"]["output_tokens"] > 0


def test_outside_a_workflow_the_wrapped_client_is_the_plain_sdk(
    provider: tuple[LocalProvider, str],
) -> None:
    import asyncio

    server, base = provider
    oai, _ = clients(base)

    async def plain() -> Any:
        async with oai.unwrapped:  # the caller's own loop: the caller closes the client
            return await oai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "plain"}]
            )

    reply = asyncio.run(plain())
    assert "plain" in (reply.choices[0].message.content or "")
    assert server.requests()[0]["idempotency_key"] is None


def test_wrapping_a_sync_client_is_refused_naming_its_async_twin() -> None:
    with pytest.raises(ratchet.InvalidInput, match=r"wrap openai\.AsyncOpenAI"):
        ratchet.llm.wrap(openai.OpenAI(api_key="x"))
    with pytest.raises(ratchet.InvalidInput, match=r"wrap anthropic\.AsyncAnthropic"):
        ratchet.llm.wrap(anthropic.Anthropic(api_key="x"))
    with pytest.raises(ratchet.InvalidInput, match="not an openai or anthropic client"):
        ratchet.llm.wrap(object())


def test_prices_dated_names_unknown_models_and_overrides(tmp_path: Path) -> None:
    from ratchet.llm import Usage, cost_usd, set_prices

    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert cost_usd("gpt-4.1-mini", usage) == pytest.approx(2.0)
    assert cost_usd("gpt-4.1-mini-2025-04-14", usage) == pytest.approx(2.0)
    assert cost_usd("claude-sonnet-4-5-20250929", usage) == pytest.approx(18.0)
    assert cost_usd("my-own-model", usage) is None
    path = tmp_path / "prices.yaml"
    path.write_text("my-own-model: {input: 1.0, output: 2.0}\n")
    set_prices(path)
    try:
        assert cost_usd("my-own-model", usage) == pytest.approx(3.0)
        with pytest.raises(ratchet.ConfigError, match="'bad'.*input"):
            set_prices({"bad": {"input": -1, "output": 1}})
    finally:
        set_prices({}, replace=False)
        # back to the package's table (ratchet.llm.prices, the attribute, is the function)
        vars(importlib.import_module("ratchet.llm.prices"))["_table"] = None


# -- tools and the agent loop --------------------------------------------------------------


def test_tools_have_a_schema_an_event_and_their_own_keys(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.tool(risk="high", timeout_s=30, idempotency_key=lambda c: f"{c.run_id}:{c.step_id}")
    async def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund part of an order."""
        return {"refunded": amount_cents, "key": ratchet.current_step().idempotency_key}

    schema = refund.tool.schema()
    assert schema["required"] == ["order_id", "amount_cents"]
    assert schema["properties"]["amount_cents"]["type"] == "integer"
    with pytest.raises(ratchet.InvalidInput, match="risk must be one of"):
        app.tool(risk="extreme")(refund)

    @app.workflow()
    async def wf() -> dict[str, Any]:
        return await refund("o-1", 250)  # type: ignore[no-any-return]

    app.launch()
    run_id = app.start(wf)
    out = app.result(run_id, timeout_s=30)
    assert out["key"] == f"{run_id}:1:refund"
    kinds = [(e.kind, e.step_id) for e in app.events(run_id)][2:5]
    assert kinds == [
        ("tool_called", "1:refund"),
        ("step_started", "1:refund"),
        ("step_completed", "1:refund"),
    ]
    called = app.events(run_id)[2].payload
    assert called == {
        "name": "refund",
        "arguments": {"order_id": "o-1", "amount_cents": 250},
        "risk": "high",
    }


AGENT_SCRIPT = {
    "rules": [
        {
            "match": {"last_role": "user"},
            "reply": {"tool_calls": [{"name": "lookup", "arguments": {"city": "Paris"}}]},
        },
        {"match": {"last_role": "tool"}, "reply": {"text": "It is sunny in Paris."}},
    ]
}


@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_the_agent_loop_calls_tools_as_steps(
    make_app: Callable[..., ratchet.Ratchet], which: str
) -> None:
    server = LocalProvider(script=AGENT_SCRIPT)
    with serve(server) as base:
        oai, claude = clients(base)
        app = make_app()

        @app.tool
        async def lookup(city: str) -> dict[str, str]:
            """The weather in a city."""
            return {"city": city, "sky": "sunny"}

        @app.workflow()
        async def ask(text: str) -> list[Any]:
            agent = ratchet.Agent(
                model=MODEL if which == "openai" else "claude-sonnet-4-6",
                instructions="Use the tools.",
                tools=[lookup],
                client=oai if which == "openai" else claude,
            )
            result = await agent.run(text)
            return [result.output, result.turns]

        app.launch()
        run_id = app.start(ask, "weather in Paris?")
        assert app.result(run_id, timeout_s=30) == ["It is sunny in Paris.", 2]
    steps = [e.step_id for e in app.events(run_id) if e.kind == "step_completed"]
    name = "openai.chat.completions.create" if which == "openai" else "anthropic.messages.create"
    assert steps == [f"1:{name}", "2:lookup", f"3:{name}"]
    [called] = [e for e in app.events(run_id) if e.kind == "tool_called"]
    assert called.payload["arguments"] == {"city": "Paris"}


TWO_CALLS = {
    "rules": [
        {
            "match": {"last_role": "user"},
            "reply": {
                "tool_calls": [
                    {"name": "ping", "arguments": {"n": 1}},
                    {"name": "pong", "arguments": {"n": 2}},
                ]
            },
        },
        {"match": {"last_role": "tool"}, "reply": {"text": "both answered"}},
    ]
}


@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_the_tool_calls_of_one_reply_run_together_each_its_own_step(
    make_app: Callable[..., ratchet.Ratchet], which: str
) -> None:
    # Each tool waits until the other has started: run one after the other, the first
    # would wait for ever (its 10 s bound fails it, and the answers say so).
    started = {"ping": asyncio.Event(), "pong": asyncio.Event()}

    async def meet(me: str, other: str, n: int) -> str:
        started[me].set()
        await asyncio.wait_for(started[other].wait(), 10)
        return f"{me} {n}"

    with serve(LocalProvider(script=TWO_CALLS)) as base:
        oai, claude = clients(base)
        app = make_app()

        @app.tool
        async def ping(n: int) -> str:
            """Ping."""
            return await meet("ping", "pong", n)

        @app.tool
        async def pong(n: int) -> str:
            """Pong."""
            return await meet("pong", "ping", n)

        @app.workflow()
        async def ask(text: str) -> list[Any]:
            agent = ratchet.Agent(
                model=MODEL if which == "openai" else "claude-sonnet-4-6",
                tools=[ping, pong],
                client=oai if which == "openai" else claude,
            )
            result = await agent.run(text)
            answers: list[Any] = []
            for m in result.messages[2:-1]:  # the tools' answers, as the model got them
                if m["role"] == "tool":
                    answers.append(m["content"])
                else:
                    answers += [b["content"] for b in m["content"] if b["type"] == "tool_result"]
            return [result.output, answers]

        app.launch()
        run_id = app.start(ask, "go")
        assert app.result(run_id, timeout_s=30) == ["both answered", ["ping 1", "pong 2"]]
    name = "openai.chat.completions.create" if which == "openai" else "anthropic.messages.create"
    events = app.events(run_id)
    # Numbered in the reply's order, and started in it, before either finished.
    assert [e.step_id for e in events if e.kind == "step_started"] == [
        f"1:{name}",
        "2:ping",
        "3:pong",
        f"4:{name}",
    ]
    assert [e.step_id for e in events if e.kind == "tool_called"] == ["2:ping", "3:pong"]
    kinds = [(e.kind, e.step_id) for e in events if e.step_id in ("2:ping", "3:pong")]
    assert kinds.index(("step_started", "3:pong")) < kinds.index(("step_completed", "2:ping"))


def test_the_agent_fails_clearly_past_max_turns(make_app: Callable[..., ratchet.Ratchet]) -> None:
    loop = {
        "rules": [
            {
                "match": {},
                "reply": {"tool_calls": [{"name": "lookup", "arguments": {"city": "Paris"}}]},
            }
        ]
    }
    with serve(LocalProvider(script=loop)) as base:
        oai, _ = clients(base)
        app = make_app()

        @app.tool
        async def lookup(city: str) -> str:
            """The weather in a city."""
            return "sunny"

        @app.workflow()
        async def ask() -> Any:
            return (
                await ratchet.Agent(model=MODEL, tools=[lookup], client=oai, max_turns=3).run("go")
            ).output

        app.launch()
        run_id = app.start(ask)
        with pytest.raises(ratchet.RunFailed, match=r"no final answer after 3 turns"):
            app.result(run_id, timeout_s=30)


# -- crashes -------------------------------------------------------------------------------


@pytest.mark.crash
def test_a_crash_while_the_provider_answers_is_billed_once(h: Harness) -> None:
    server = LocalProvider()
    with serve(server) as base:
        run_id = h.app.start("asker", n=3)
        server.fail("slow", times=1, delay_s=2.0, endpoint="chat")  # the first call
        env = {"CRASH_LLM_URL": base}
        a = h.spawn("a", worker_id="w-llm", env_extra=env)
        wait_for(lambda: server.stats()["received"] >= 1, what="the first request")
        a.kill()
        assert a.popen.returncode == -signal.SIGKILL
        b = h.spawn("b", worker_id="w-llm", env_extra=env)  # reclaims at once
        out = h.app.result(run_id, timeout_s=30)
        b.terminate()
    assert out == ["echo: question 1", "echo: question 2", "echo: question 3"]
    key = idempotency_key(run_id, "1:openai.chat.completions.create", 1)
    first = [r for r in server.requests() if r["idempotency_key"] == key]
    # Sent twice (the crash and the re-drive), under one key: billed once.
    assert len(first) == 2 and [r["billed"] for r in first].count(True) == 1
    assert server.stats()["billed_calls"] == 3
    started = [
        e
        for e in h.app.events(run_id)
        if e.step_id and e.kind == "step_started" and e.step_id.startswith("1:")
    ]
    assert [(e.attempt, e.payload["idempotency_key"]) for e in started] == [(1, key), (1, key)]


@pytest.mark.crash
def test_the_agent_killed_in_turn_two_resumes_at_turn_two(h: Harness) -> None:
    server = LocalProvider(script=AGENT_SCRIPT)
    with serve(server) as base:
        run_id = h.app.start("agent_run", "weather in Paris?")
        env = {"CRASH_LLM_URL": base}
        a = h.spawn("a", worker_id="w-agent", env_extra=env)
        h.wait_invoked("2:lookup")  # turn 1 answered, its tool running
        server.fail("slow", times=1, delay_s=3.0)  # turn 2 is held...
        h.open_gate("lookup")
        wait_for(lambda: server.stats()["received"] >= 2, what="turn 2")
        a.kill()  # ...and its worker killed while the provider answers it
        b = h.spawn("b", worker_id="w-agent", env_extra=env)
        out = h.app.result(run_id, timeout_s=60)
        b.terminate()
    assert out == ["It is sunny in Paris.", 2]
    keys = [r["idempotency_key"] for r in server.requests()]
    turn2 = idempotency_key(run_id, "3:openai.chat.completions.create", 1)
    # Turn 1 once; turn 2 sent again after the crash under its key, and billed once.
    assert keys == [idempotency_key(run_id, "1:openai.chat.completions.create", 1), turn2, turn2]
    assert server.stats()["billed_calls"] == 2
    assert h.calls() == {"2:lookup": 1}


PAIR_SCRIPT = {
    "rules": [
        {
            "match": {"last_role": "user"},
            "reply": {
                "tool_calls": [
                    {"name": "lookup", "arguments": {"city": "Paris"}},
                    {"name": "forecast", "arguments": {"city": "Paris"}},
                ]
            },
        },
        {"match": {"last_role": "tool"}, "reply": {"text": "Sunny, then rain."}},
    ]
}


@pytest.mark.crash
def test_the_agent_killed_between_its_parallel_tools_runs_only_the_unfinished_one(
    h: Harness,
) -> None:
    with serve(LocalProvider(script=PAIR_SCRIPT)) as base:
        run_id = h.app.start("agent_pair", "weather in Paris?")
        env = {"CRASH_LLM_URL": base}
        a = h.spawn("a", worker_id="w-pair", env_extra=env)
        # Both tools of the reply are running at once, in one worker.
        h.wait_invoked("2:lookup")
        h.wait_invoked("3:forecast")
        h.open_gate("lookup")
        wait_for(
            lambda: any(
                e.kind == "step_completed" and e.step_id == "2:lookup" for e in h.app.events(run_id)
            ),
            what="lookup completed",
        )
        a.kill()  # forecast still waiting on its gate
        h.open_gate("forecast")
        b = h.spawn("b", worker_id="w-pair", env_extra=env)
        out = h.app.result(run_id, timeout_s=60)
        b.terminate()
    assert out == [
        "Sunny, then rain.",
        ['{"city": "Paris", "sky": "sunny"}', '{"city": "Paris", "tomorrow": "rain"}'],
    ]
    # The finished call came from the journal; only the one in flight ran again, under
    # the same step id.
    assert h.calls() == {"2:lookup": 1, "3:forecast": 2}
    completed = [e.step_id for e in h.app.events(run_id) if e.kind == "step_completed"]
    assert completed == [
        "1:openai.chat.completions.create",
        "2:lookup",
        "3:forecast",
        "4:openai.chat.completions.create",
    ]


def test_no_secret_reaches_the_journal(
    db_url: str, provider: tuple[LocalProvider, str], make_app: Callable[..., ratchet.Ratchet]
) -> None:
    _, base = provider
    oai, claude = clients(base)
    app = make_app()

    @app.workflow()
    async def wf() -> str:
        await oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        await claude.messages.create(
            model="claude-sonnet-4-6", max_tokens=8, messages=[{"role": "user", "content": "y"}]
        )
        return "ok"

    app.launch()
    run_id = app.start(wf)
    assert app.result(run_id, timeout_s=30) == "ok"
    if db_url.startswith("sqlite"):
        path = db_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT kind, payload FROM journal_events").fetchall()
    else:
        with psycopg.connect(db_url) as pg:
            rows = pg.execute("SELECT kind, payload::text FROM journal_events").fetchall()
    text = json.dumps(rows)
    assert "step_completed" in text and LLM_SECRET not in text
    assert "authorization" not in text.lower() and "x-api-key" not in text.lower()


def test_the_example_agent_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    example = Path(__file__).resolve().parent.parent / "examples" / "agent.py"
    out = subprocess.run(
        [sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "It is sunny in Paris."
    assert any("tool_called" in line and "2:weather" in line for line in lines)
