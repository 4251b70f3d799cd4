"""Pydantic AI inside a Ratchet workflow behaves as outside one, on SQLite and PostgreSQL:
the scenarios of Pydantic AI's own durable-execution suites (a dynamic toolset chosen from
deps, an event stream handler's deltas, ``run_stream().stream_text()``, model settings as
given, MCP toolsets over stdio and streamable HTTP), each run in a workflow and checked
against the same agent run outside one, replays included, and an MCP run whose worker is
killed mid-run."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agent_app
import mcp_servers
import pytest
from proc import Harness
from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.capabilities import ProcessEventStream
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.toolsets import DynamicToolset
from waiting import wait_for

import ratchet
from ratchet.integrations.pydantic_ai import RatchetDurability
from ratchet.llm.server import LocalProvider, serve
from ratchet.model import idempotency_key

pytestmark = pytest.mark.usefixtures("collect_clients")


def outside(agent: Agent[Any, Any], *args: Any, **kwargs: Any) -> Any:
    """The agent's run outside any workflow (asyncio.run closes its loop afterwards)."""
    return asyncio.run(agent.run(*args, **kwargs))


def parked_then_replayed(app: ratchet.Ratchet, run_id: str) -> Any:
    """Wait for the run's park on signal ``go``, send it: the next drive replays the run."""
    wait_for(lambda: app.get(run_id).status == ratchet.RunStatus.WAITING, what="the park")
    app.signal(run_id, "go")
    return app.result(run_id, timeout_s=30)


def step_ids(app: ratchet.Ratchet, run_id: str) -> list[str]:
    return [e.step_id or "" for e in app.events(run_id) if e.kind == "step_started"]


# -- a dynamic toolset chosen from deps ----------------------------------------------------


@dataclass
class Deps:
    user: str
    kit: str  # which toolset the agent gets: "weather" or "sums"


def kit_agent(evaluations: list[tuple[int, str, list[str]]]) -> Agent[Deps, str]:
    def pick(ctx: RunContext[Deps]) -> FunctionToolset[Deps]:
        calls: list[str] = []  # what this evaluation's tools were called with
        evaluations.append((ctx.run_step, ctx.deps.kit, calls))
        toolset = FunctionToolset[Deps](id=f"{ctx.deps.kit}_kit")
        if ctx.deps.kit == "weather":

            @toolset.tool_plain
            def get_weather(location: str) -> str:
                """The weather in a location."""
                calls.append(location)
                return f"Weather in {location} for {ctx.deps.user}: sunny."
        else:

            @toolset.tool_plain
            def add(a: int, b: int) -> int:
                """The sum of two numbers."""
                calls.append(f"{a}+{b}")
                return a + b

        return toolset

    return Agent(
        TestModel(),
        name="kits",
        deps_type=Deps,
        toolsets=[DynamicToolset(pick, id="kit")],
        capabilities=[RatchetDurability()],
    )


def test_a_dynamic_toolset_chosen_from_deps_is_evaluated_once_per_run_step(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    plain: list[tuple[int, str, list[str]]] = []
    expected = outside(kit_agent(plain), "Get the weather", deps=Deps("Bob", "weather")).output
    assert expected == '{"get_weather":"Weather in a for Bob: sunny."}'
    # Once per model response; the step's tool call goes to that evaluation's toolset.
    assert plain == [(1, "weather", ["a"]), (2, "weather", [])]

    evaluations: list[tuple[int, str, list[str]]] = []
    agent = kit_agent(evaluations)
    app = make_app()

    @app.workflow()
    async def ask(text: str, user: str, kit: str) -> str:
        output = (await agent.run(text, deps=Deps(user, kit))).output
        await ratchet.wait_for_signal("go")
        return output

    app.launch()
    run_id = app.start(ask, "Get the weather", "Bob", "weather")
    assert parked_then_replayed(app, run_id) == expected
    assert evaluations == plain  # and the replay evaluated nothing again
    sums = app.start(ask, "Add them", "Ann", "sums")
    evaluations.clear()
    assert parked_then_replayed(app, sums) == '{"add":0}'
    assert evaluations == [(1, "sums", ["0+0"]), (2, "sums", [])]
    assert "3:kits__dynamic_toolset__kit.call_tool:add" in step_ids(app, sums)


# -- events and deltas ---------------------------------------------------------------------


def _answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart("Streamed response")])


async def _three_chunks(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    for text in ("Stream", "ed ", "response"):
        yield text


def described(event: AgentStreamEvent) -> tuple[Any, ...]:
    """An event as the test compares it: its type, part index and text."""
    if isinstance(event, PartStartEvent | PartEndEvent):
        return (type(event).__name__, event.index, getattr(event.part, "content", None))
    if isinstance(event, PartDeltaEvent):
        return (type(event).__name__, event.index, getattr(event.delta, "content_delta", None))
    return (type(event).__name__,)


def test_a_process_event_stream_handler_gets_the_deltas_it_gets_outside(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    seen: list[tuple[Any, ...]] = []

    async def collect(ctx: RunContext[Any], stream: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in stream:
            seen.append(described(event))

    agent = Agent(
        FunctionModel(_answer, stream_function=_three_chunks),
        name="events",
        capabilities=[ProcessEventStream(collect), RatchetDurability()],
    )
    assert outside(agent, "Hello").output == "Streamed response"
    expected, seen[:] = list(seen), []
    deltas = [e[2] for e in expected if e[0] == "PartDeltaEvent"]
    assert deltas == ["ed ", "response"]
    app = make_app()

    @app.workflow()
    async def ask(text: str) -> str:
        output = (await agent.run(text)).output
        await ratchet.wait_for_signal("go")
        return output

    app.launch()
    run_id = app.start(ask, "Hello")
    assert parked_then_replayed(app, run_id) == "Streamed response"
    # The handler is workflow code: the first drive and the replay each saw the events.
    assert seen == expected + expected
    [done] = [
        e
        for e in app.events(run_id)
        if e.kind == "step_completed" and e.step_id == "1:events__model.request_stream"
    ]
    assert done.payload["output"]["chunks"]["runs"]  # journaled by the step


def test_run_stream_text_and_events_give_the_deltas_they_give_outside(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    agent = Agent(
        TestModel(custom_output_text="hello world"),
        name="texts",
        capabilities=[RatchetDurability()],
    )

    async def streams() -> list[Any]:
        async with agent.run_stream("Hello") as run:
            deltas = [t async for t in run.stream_text(delta=True, debounce_by=None)]
        async with agent.run_stream("Hello") as run:
            texts = [t async for t in run.stream_text(debounce_by=None)]
            output = await run.get_output()
        async with agent.run_stream_events("Hello") as events:
            streamed = [
                described(e) async for e in events if isinstance(e, PartStartEvent | PartDeltaEvent)
            ]
        return [deltas, texts, output, streamed]

    expected = asyncio.run(streams())
    assert expected[:3] == [["hello ", "world"], ["hello ", "hello world"], "hello world"]
    seen: list[list[Any]] = []
    app = make_app()

    @app.workflow()
    async def ask() -> list[Any]:
        got = await streams()
        seen.append(got)
        await ratchet.wait_for_signal("go")
        return got

    app.launch()
    run_id = app.start(ask)
    assert parked_then_replayed(app, run_id) == [
        expected[0],
        expected[1],
        expected[2],
        [list(e) for e in expected[3]],
    ]
    assert seen == [expected, expected]  # the first drive and the replay alike


# -- model settings ------------------------------------------------------------------------


class CustomModelSettings(ModelSettings, total=False):
    custom_setting: str


def _settings(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart(str(info.model_settings))])


def test_the_model_sees_its_settings_as_given_and_the_key_goes_with_the_http_request(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    given = CustomModelSettings(max_tokens=123, custom_setting="custom_value")
    agent = Agent(
        FunctionModel(_settings, settings=given),
        name="settings",
        capabilities=[RatchetDurability()],
    )
    expected = outside(agent, "Give me those settings").output
    assert expected == "{'max_tokens': 123, 'custom_setting': 'custom_value'}"
    server = LocalProvider()
    with serve(server) as base:
        import openai
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="local", max_retries=0)
        http_agent = Agent(
            OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client)),
            name="over_http",
            capabilities=[RatchetDurability()],
        )
        app = make_app()

        @app.step()
        async def plain(text: str) -> str:  # inside a step the agent is plain: no key
            return str((await http_agent.run(text)).output)

        @app.workflow()
        async def ask(text: str) -> list[str]:
            shown = (await agent.run(text)).output
            echoed = (await http_agent.run(text, model_settings={"max_tokens": 50})).output
            return [shown, echoed, await plain("plain")]

        app.launch()
        run_id = app.start(ask, "Give me those settings")
        shown, echoed, _ = app.result(run_id, timeout_s=30)
    assert shown == expected and "Give me those settings" in echoed
    step = "2:over_http__model.request"
    assert [r["idempotency_key"] for r in server.requests()] == [
        idempotency_key(run_id, step, 1),
        None,
    ]


# -- MCP toolsets --------------------------------------------------------------------------


def _forecast_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = [
        p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)
    ]
    if not returns:
        asked = next(
            p.content
            for m in messages
            for p in getattr(m, "parts", ())
            if isinstance(p, UserPromptPart)
        )
        return ModelResponse(parts=[ToolCallPart("forecast", {"city": str(asked)})])
    return ModelResponse(parts=[TextPart(f"Tomorrow: {returns[-1].content}.")])


@pytest.fixture
def mcp_toolset(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    """The MCP server's toolset over stdio or streamable HTTP, and its calls log."""
    calls = tmp_path / "calls.jsonl"
    if request.param == "stdio":
        yield mcp_servers.stdio_toolset(calls), calls
        return
    with mcp_servers.http_server(calls) as url:
        yield mcp_servers.http_toolset(url), calls


@pytest.mark.parametrize("mcp_toolset", ["stdio", "http"], indirect=True)
def test_mcp_tool_calls_are_durable_tool_steps(
    make_app: Callable[..., ratchet.Ratchet], mcp_toolset: tuple[Any, Path]
) -> None:
    toolset, calls = mcp_toolset
    agent = Agent(
        FunctionModel(_forecast_then_answer),
        name="mcp",
        toolsets=[toolset],
        capabilities=[RatchetDurability()],
    )
    expected = outside(agent, "Paris").output
    assert expected == "Tomorrow: rain in Paris."
    assert [c["tool"] for c in mcp_servers.calls_made(calls)] == ["forecast"]
    app = make_app()

    @app.workflow()
    async def ask(city: str) -> str:
        output = (await agent.run(city)).output
        await ratchet.wait_for_signal("go")
        return output

    app.launch()
    run_id = app.start(ask, "Rome")
    assert parked_then_replayed(app, run_id) == "Tomorrow: rain in Rome."
    # Called once by the run: its replay read the tool's answer from the journal.
    assert [c["arguments"] for c in mcp_servers.calls_made(calls)] == [
        {"city": "Paris"},
        {"city": "Rome"},
    ]
    started = [e for e in app.events(run_id) if e.kind == "step_started"]
    assert [(e.step_id, e.payload.get("kind")) for e in started] == [
        ("1:mcp__mcp_server__tools.get_tools", None),
        ("2:mcp__model.request", "llm"),
        ("3:mcp__mcp_server__tools.call_tool", "tool"),
        ("4:mcp__model.request", "llm"),
    ]
    [called] = [e for e in app.events(run_id) if e.kind == "tool_called"]
    assert called.payload == {"name": "forecast", "arguments": {"city": "Rome"}, "risk": "low"}


@pytest.fixture
def h(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, app=agent_app)
    try:
        yield harness
    finally:
        harness.close()


@pytest.mark.crash
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_worker_killed_after_an_mcp_tool_call_resumes_without_calling_it_again(
    h: Harness, tmp_path: Path, transport: str
) -> None:
    calls, gate = tmp_path / "mcp-calls.jsonl", tmp_path / "mcp-gate"
    server = LocalProvider(script=agent_app.MCP_SCRIPT)
    with (
        serve(server) as base,
        mcp_servers.http_server(calls, gate) if transport == "http" else _nothing() as url,
    ):
        env = {
            "CRASH_LLM_URL": base,
            **({"CRASH_MCP_URL": url} if url else {"CRASH_MCP_STDIO": f"{calls}|{gate}"}),
        }
        run_id = h.app.start("pai_mcp", "weather in Paris tomorrow?")
        a = h.spawn("a", worker_id="w-mcp", env_extra=env)
        wait_for(lambda: mcp_servers.calls_made(calls), timeout=30, what="the MCP call")
        server.fail("slow", times=1, delay_s=5.0)  # the model request after it is held...
        gate.touch()
        wait_for(
            lambda: server.stats()["received"] >= 2, timeout=30, what="the second model request"
        )
        a.kill()  # ...and its worker killed while the provider answers it
        assert a.popen.returncode == -signal.SIGKILL
        b = h.spawn("b", worker_id="w-mcp", env_extra=env)
        out = h.app.result(run_id, timeout_s=60)
        b.terminate()
    assert out == "Rain in Paris tomorrow."
    # The MCP server got the call once; the re-drive read its answer from the journal.
    assert [c["tool"] for c in mcp_servers.calls_made(calls)] == ["forecast"]
    tool_step = f"3:{agent_app.MCP_TOOL_STEP}"
    completed = [
        e for e in h.app.events(run_id) if e.kind == "step_completed" and e.step_id == tool_step
    ]
    assert len(completed) == 1
    assert server.stats()["billed_calls"] == 2


@pytest.mark.crash
def test_a_worker_killed_after_a_streamed_request_replays_its_events_delta_for_delta(
    h: Harness, tmp_path: Path
) -> None:
    seen = tmp_path / "events.jsonl"
    # Arguments long enough to come in several deltas.
    server = LocalProvider(
        script={
            "rules": [
                {
                    "match": {"last_role": "user"},
                    "reply": {
                        "tool_calls": [
                            {
                                "name": "lookup",
                                "arguments": {"city": "Paris, Île-de-France, France"},
                            }
                        ]
                    },
                },
                {"match": {"last_role": "tool"}, "reply": {"text": "It is sunny in Paris."}},
            ]
        }
    )
    with serve(server) as base:
        env = {"CRASH_LLM_URL": base, "CRASH_EVENTS": str(seen)}
        run_id = h.app.start("pai_stream", "weather in Paris?")
        a = h.spawn("a", worker_id="w-stream", env_extra=env)
        h.wait_invoked(f"2:{agent_app.STREAM_TOOL_STEP}")  # request 1 streamed, its tool held
        a.kill()
        assert a.popen.returncode == -signal.SIGKILL
        h.open_gate("lookup")
        b = h.spawn("b", worker_id="w-stream", env_extra=env)
        out = h.app.result(run_id, timeout_s=60)
        b.terminate()
    assert out == "It is sunny in Paris."
    lines = [json.loads(line) for line in seen.read_text().splitlines()]
    first = [line["event"] for line in lines if line["pid"] == a.pid]
    again = [line["event"] for line in lines if line["pid"] == b.pid]
    # The request the killed worker streamed, given back from the journal, delta for delta.
    assert len([e for e in first if e[0] == "delta"]) > 1
    assert again[: len(first)] == first
    assert len(again) > len(first)  # then the second request's own events
    assert server.stats()["billed_calls"] == 2  # request 1 was not sent again


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
