"""Pydantic AI agents on Ratchet (``RatchetDurability``), on SQLite and PostgreSQL: with
Pydantic AI's own test models (steps and their kinds, replay without the model, tools once,
plain behaviour outside a workflow, error classes, streaming) and with the local provider
through ``OpenAIChatModel`` (keys, usage and cost), and a worker killed mid-run."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import agent_app
import openai
import pytest
from proc import Harness
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import (
    ModelConnectionError,
    ModelHTTPError,
    ModelRequestTimeout,
    ModelTimeoutError,
    UnexpectedModelBehavior,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import RequestUsage
from waiting import wait_for

import ratchet
from ratchet.errors import LLMError, LLMRequestError, LLMTimeout, RatchetError
from ratchet.integrations.pydantic_ai import RatchetDurability, as_ratchet_error
from ratchet.llm.server import LocalProvider, serve
from ratchet.model import idempotency_key

MODEL_STEP = "weather__model.request"
TOOL_STEP = "weather__function_toolset__<agent>.call_tool:lookup"
pytestmark = pytest.mark.usefixtures("collect_clients")


class Scripted:
    """A FunctionModel's function: calls the ``lookup`` tool first, then answers with what
    it returned; counts its calls and can fail the next ones."""

    def __init__(self) -> None:
        self.calls = 0
        self.errors: list[Exception] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        returns = [
            p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)
        ]
        if not returns:
            return ModelResponse(
                parts=[ToolCallPart("lookup", {"city": "Paris"})],
                usage=RequestUsage(input_tokens=10, output_tokens=3),
                model_name="gpt-4.1-mini",
            )
        return ModelResponse(
            parts=[TextPart(f"It is {returns[-1].content}.")],
            usage=RequestUsage(input_tokens=20, output_tokens=5),
            model_name="gpt-4.1-mini",
        )


def weather_agent(model: Any, tool_calls: list[str], **options: Any) -> Agent[None, str]:
    agent = Agent(model, name="weather", capabilities=[RatchetDurability(**options)])

    @agent.tool_plain
    def lookup(city: str) -> str:
        """The weather in a city."""
        tool_calls.append(city)
        return f"sunny in {city}"

    return agent


def local_model(base: str) -> OpenAIChatModel:
    """gpt-4.1-mini through the OpenAI SDK, served by the local provider at ``base``."""
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="local", max_retries=0)
    return OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client))


def events(app: ratchet.Ratchet, run_id: str, kind: str) -> list[ratchet.Event]:
    return [e for e in app.events(run_id) if e.kind == kind]


def test_model_requests_and_tool_calls_are_journaled_steps(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    model, tools = Scripted(), list[str]()
    agent = weather_agent(FunctionModel(model, model_name="gpt-4.1-mini"), tools)
    app = make_app()

    @app.workflow()
    async def ask(text: str) -> str:
        return (await agent.run(text)).output

    app.launch()
    run_id = app.start(ask, "weather in Paris?")
    assert app.result(run_id, timeout_s=30) == "It is sunny in Paris."
    started = events(app, run_id, "step_started")
    assert [(e.step_id, e.payload["kind"]) for e in started] == [
        (f"1:{MODEL_STEP}", "llm"),
        (f"2:{TOOL_STEP}", "tool"),
        (f"3:{MODEL_STEP}", "llm"),
    ]
    [called] = events(app, run_id, "tool_called")
    assert called.step_id == f"2:{TOOL_STEP}"
    assert called.payload == {"name": "lookup", "arguments": {"city": "Paris"}, "risk": "low"}
    completed = events(app, run_id, "step_completed")
    first = completed[0].payload
    # The response as Pydantic AI's own adapter dumps it, and the usage beside it.
    assert first["output"]["parts"][0]["tool_name"] == "lookup"
    assert first["llm"]["usage"]["input_tokens"] == 10
    assert first["llm"]["model"] == "gpt-4.1-mini"
    assert first["llm"]["cost_usd"] == pytest.approx(10 * 0.4e-6 + 3 * 1.6e-6)
    assert completed[1].payload["output"] == {"kind": "tool_return", "result": "sunny in Paris"}
    assert model.calls == 2 and tools == ["Paris"]
    state = ratchet.model.fold(run_id, app.events(run_id))
    assert state.llm.calls == 2 and state.llm.output_tokens == 8


def test_a_replay_rebuilds_responses_from_the_journal_without_the_model(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    model, tools = Scripted(), list[str]()
    agent = weather_agent(FunctionModel(model, model_name="gpt-4.1-mini"), tools)
    app = make_app()

    @app.workflow()
    async def ask(text: str) -> list[Any]:
        result = await agent.run(text)
        await ratchet.wait_for_signal("go")  # parks: the next drive replays the agent run
        return [result.output, result.run_id, len(result.all_messages())]

    app.launch()
    run_id = app.start(ask, "weather in Paris?")
    wait_for(lambda: app.get(run_id).status == ratchet.RunStatus.WAITING, what="the park")
    assert model.calls == 2 and tools == ["Paris"]
    app.signal(run_id, "go")
    output, agent_run_id, messages = app.result(run_id, timeout_s=30)
    assert output == "It is sunny in Paris." and messages == 4
    assert model.calls == 2 and tools == ["Paris"]  # nothing ran again
    assert agent_run_id == f"{run_id}:agent:1"  # the same id on every drive
    drives = [e for e in app.events(run_id) if e.kind in ("run_started", "run_resumed")]
    assert len(drives) == 2


def test_outside_a_workflow_and_inside_a_step_the_agent_is_plain(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    model, tools = Scripted(), list[str]()
    agent = weather_agent(FunctionModel(model, model_name="gpt-4.1-mini"), tools)
    plain_model, plain_tools = Scripted(), list[str]()
    plain = Agent(FunctionModel(plain_model, model_name="gpt-4.1-mini"), name="weather")
    plain.tool_plain(lambda city: plain_tools.append(city) or f"sunny in {city}", name="lookup")

    # asyncio.run closes its loop; run_sync would leave one behind for the test session.
    durable_run = asyncio.run(agent.run("weather?"))
    plain_run = asyncio.run(plain.run("weather?"))
    assert durable_run.output == plain_run.output == "It is sunny in Paris."
    assert [type(m).__name__ for m in durable_run.all_messages()] == [
        type(m).__name__ for m in plain_run.all_messages()
    ]
    assert model.calls == plain_model.calls == 2 and tools == plain_tools == ["Paris"]

    app = make_app()

    @app.step()
    async def inside(text: str) -> str:
        return (await agent.run(text)).output

    @app.workflow()
    async def wf(text: str) -> str:
        return await inside(text)

    app.launch()
    run_id = app.start(wf, "weather?")
    assert app.result(run_id, timeout_s=30) == "It is sunny in Paris."
    assert [e.step_id for e in events(app, run_id, "step_started")] == ["1:inside"]


def test_model_errors_take_ratchets_retry_classes(make_app: Callable[..., ratchet.Ratchet]) -> None:
    model, tools = Scripted(), list[str]()
    agent = weather_agent(
        FunctionModel(model, model_name="gpt-4.1-mini"),
        tools,
        model_retry=ratchet.Retry(max_attempts=3, backoff_ms=10, retry_on=["llm", "timeout"]),
    )
    app = make_app()

    @app.workflow()
    async def ask(text: str) -> str:
        return (await agent.run(text)).output

    model.errors = [
        ModelHTTPError(429, "gpt-4.1-mini", {"error": "slow down"}),
        ModelConnectionError("gpt-4.1-mini", "connection reset"),
    ]
    app.launch()
    run_id = app.start(ask, "weather?")
    assert app.result(run_id, timeout_s=30) == "It is sunny in Paris."
    first = [e for e in events(app, run_id, "step_started") if e.step_id == f"1:{MODEL_STEP}"]
    assert [e.attempt for e in first] == [1, 2, 3]
    # A new key after the provider answered (429); the same key after a lost connection,
    # which leaves open whether the request got there.
    keys = [e.payload["idempotency_key"] for e in first]
    assert keys[0] != keys[1] and keys[1] == keys[2], keys
    retrying = events(app, run_id, "step_retrying")
    assert [
        "429" in retrying[0].payload["error"],
        "connection reset" in retrying[1].payload["error"],
    ] == [True, True]

    model.errors = [ModelHTTPError(400, "gpt-4.1-mini", {"error": "bad request"})]
    calls = model.calls
    run_id = app.start(ask, "weather?")
    with pytest.raises(ratchet.RunFailed, match="400"):
        app.result(run_id, timeout_s=30)
    [failed] = events(app, run_id, "step_failed")
    assert failed.payload["error_type"] == "LLMRequestError" and failed.attempt == 1
    assert model.calls == calls + 1  # not retried


def test_model_error_mapping() -> None:
    def mapped(e: Exception) -> tuple[str, str]:
        out = as_ratchet_error(e)
        return type(out).__name__, getattr(out, "retry_class", "any")

    assert mapped(ModelHTTPError(429, "m")) == ("LLMError", "llm")
    assert mapped(ModelHTTPError(503, "m")) == ("LLMError", "llm")
    assert mapped(ModelHTTPError(408, "m")) == ("LLMError", "llm")
    assert mapped(ModelHTTPError(401, "m")) == ("LLMRequestError", "never")
    assert mapped(ModelHTTPError(404, "m")) == ("LLMRequestError", "never")
    assert mapped(ModelConnectionError("m", "reset")) == ("LLMError", "llm")
    lost, refused = (
        as_ratchet_error(ModelConnectionError("m", "reset")),
        as_ratchet_error(ModelHTTPError(503, "m")),
    )
    assert isinstance(lost, RatchetError) and lost.outcome_unknown
    assert isinstance(refused, RatchetError) and not refused.outcome_unknown
    assert mapped(ModelTimeoutError("m", "timed out")) == ("LLMTimeout", "timeout")
    assert mapped(ModelRequestTimeout("m", 5.0)) == ("LLMTimeout", "timeout")
    other = UnexpectedModelBehavior("odd")
    assert as_ratchet_error(other) is other
    error = as_ratchet_error(ModelHTTPError(429, "m", {"error": "x"}))
    assert isinstance(error, LLMError) and not isinstance(error, LLMRequestError | LLMTimeout)
    assert error.status_code == 429


def test_tools_take_their_options_from_metadata_and_model_retry_goes_to_the_model(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    attempts: list[int] = []
    agent = Agent(
        TestModel(call_tools=["charge", "check"]), name="shop", capabilities=[RatchetDurability()]
    )

    @agent.tool_plain(
        metadata={"ratchet": {"risk": "high", "retry": {"maxAttempts": 2, "backoffMs": 10}}}
    )
    def charge(amount: int) -> str:
        """Charge the card."""
        attempts.append(ratchet.current_step().attempt)
        if len(attempts) == 1:
            raise RuntimeError("card network down")
        return "charged"

    checked: list[int] = []

    @agent.tool_plain
    def check(amount: int) -> str:
        """Check the card; asks the model again the first time."""
        checked.append(amount)
        if len(checked) == 1:
            raise ModelRetry("try again")
        return "ok"

    app = make_app()

    @app.workflow()
    async def buy() -> str:
        return (await agent.run("buy")).output

    app.launch()
    run_id = app.start(buy)
    app.result(run_id, timeout_s=30)
    assert attempts == [1, 2]
    calls = [e.payload for e in events(app, run_id, "tool_called")]
    assert calls[0]["name"] == "charge" and calls[0]["risk"] == "high"
    # A ModelRetry is the tool's answer (journaled, back to the model), not a failure.
    check_done = [
        e
        for e in events(app, run_id, "step_completed")
        if e.step_id and "call_tool:check" in e.step_id
    ]
    assert check_done[0].payload["output"]["kind"] == "model_retry"
    assert len(check_done) == 2 and not events(app, run_id, "step_failed")


def test_a_bad_option_is_refused_where_the_capability_is_made() -> None:
    with pytest.raises(ratchet.InvalidInput, match="model_timeout_s"):
        RatchetDurability(model_timeout_s=0)
    with pytest.raises(ratchet.InvalidInput, match="retry"):
        RatchetDurability(tool_retry={"maxAttempts": 0})


def test_an_event_stream_handler_sees_model_events_live_and_replays_do_not_stream(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    streamed: list[int] = []

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        streamed.append(len(messages))
        if len(messages) == 1:
            yield {0: DeltaToolCall(name="lookup", json_args='{"city": "Paris"}')}
        else:
            for word in ("It ", "is ", "sunny."):
                yield word

    seen: list[str] = []

    async def handler(ctx: Any, events_: Any) -> None:
        async for event in events_:
            if isinstance(event, PartDeltaEvent):
                seen.append(type(event.delta).__name__)

    tools: list[str] = []
    agent = weather_agent(
        FunctionModel(stream_function=stream), tools, event_stream_handler=handler
    )
    app = make_app()

    @app.workflow()
    async def ask(text: str) -> str:
        output = (await agent.run(text)).output
        await ratchet.wait_for_signal("go")
        return output

    app.launch()
    run_id = app.start(ask, "weather?")
    wait_for(lambda: app.get(run_id).status == ratchet.RunStatus.WAITING, what="the park")
    assert streamed == [1, 3] and "TextPartDelta" in seen
    count = len(seen)
    app.signal(run_id, "go")
    assert app.result(run_id, timeout_s=30) == "It is sunny."
    assert streamed == [1, 3] and tools == ["Paris"]
    assert len(seen) == count  # model events came live once; the replay sent none again
    started = [(e.step_id, e.payload.get("kind")) for e in events(app, run_id, "step_started")]
    # The tool's events reach the handler from steps of their own, so a replay does not
    # deliver them again either.
    assert started == [
        ("1:weather__model.request_stream", "llm"),
        ("2:weather__event_stream_handler", None),
        (f"3:{TOOL_STEP}", "tool"),
        ("4:weather__event_stream_handler", None),
        ("5:weather__model.request_stream", "llm"),
    ]


def test_a_run_timeout_counts_from_a_journaled_start(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    model, tools = Scripted(), list[str]()
    agent = weather_agent(FunctionModel(model, model_name="gpt-4.1-mini"), tools)
    app = make_app()

    @app.workflow()
    async def ask(text: str) -> str:
        return (await agent.run(text, timeout=60)).output

    app.launch()
    run_id = app.start(ask, "weather?")
    assert app.result(run_id, timeout_s=30) == "It is sunny in Paris."
    ids = [e.step_id for e in events(app, run_id, "step_completed")]
    assert ids[0] == "1:weather__run_start_time"


# -- over HTTP, through the local provider -------------------------------------------------


def test_the_openai_model_sends_the_step_key_and_journals_usage_and_cost(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    server = LocalProvider(script=agent_app.SCRIPT)
    with serve(server) as base:
        tools: list[str] = []
        agent = weather_agent(local_model(base), tools)
        app = make_app()

        @app.workflow()
        async def ask(text: str) -> str:
            return (await agent.run(text)).output

        app.launch()
        run_id = app.start(ask, "weather in Paris?")
        assert app.result(run_id, timeout_s=30) == "It is sunny in Paris."
        keys = [idempotency_key(run_id, f"{n}:{MODEL_STEP}", 1) for n in (1, 3)]
        assert [r["idempotency_key"] for r in server.requests()] == keys
        assert server.stats()["billed_calls"] == 2 and tools == ["Paris"]
        completed = [e for e in events(app, run_id, "step_completed") if e.payload.get("llm")]
        billed = [r for r in server.requests() if r["billed"]]
        meta = [e.payload["llm"] for e in completed]
        assert [m["usage"]["output_tokens"] for m in meta] == [r["output_tokens"] for r in billed]
        assert [m["usage"]["input_tokens"] for m in meta] == [r["input_tokens"] for r in billed]
        assert meta[0]["provider"] == "openai" and meta[0]["model"].startswith("gpt-4.1-mini")
        usage = meta[0]["usage"]
        assert meta[0]["cost_usd"] == pytest.approx(
            usage["input_tokens"] * 0.4e-6 + usage["output_tokens"] * 1.6e-6
        )
        assert meta[0]["request_id"]  # the provider's response id


# -- a worker killed mid-run ---------------------------------------------------------------


@pytest.fixture
def h(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, app=agent_app)
    try:
        yield harness
    finally:
        harness.close()


@pytest.mark.crash
def test_a_worker_killed_during_the_second_model_request_resumes_without_resending_the_first(
    h: Harness,
) -> None:
    server = LocalProvider(script=agent_app.SCRIPT)
    with serve(server) as base:
        run_id = h.app.start("pai_weather", "weather in Paris?")
        env = {"CRASH_LLM_URL": base}
        a = h.spawn("a", worker_id="w-pai", env_extra=env)
        tool_step = f"2:{agent_app.TOOL_STEP}"
        h.wait_invoked(tool_step)  # request 1 answered, its tool running
        server.fail("slow", times=1, delay_s=5.0)  # request 2 is held...
        h.open_gate("lookup")
        wait_for(lambda: server.stats()["received"] >= 2, what="the second request")
        a.kill()  # ...and its worker killed while the provider answers it
        assert a.popen.returncode == -signal.SIGKILL
        b = h.spawn("b", worker_id="w-pai", env_extra=env)
        out = h.app.result(run_id, timeout_s=60)
        b.terminate()
    assert out == "It is sunny in Paris."
    first = idempotency_key(run_id, f"1:{agent_app.MODEL_STEP}", 1)
    second = idempotency_key(run_id, f"3:{agent_app.MODEL_STEP}", 1)
    # Request 1 once; request 2 sent again after the crash under its key, and billed once.
    assert [r["idempotency_key"] for r in server.requests()] == [first, second, second]
    assert server.stats()["billed_calls"] == 2
    assert h.calls() == {tool_step: 1}
    resumed = [
        e
        for e in h.app.events(run_id)
        if e.kind == "step_started" and e.step_id == f"3:{agent_app.MODEL_STEP}"
    ]
    assert [(e.attempt, e.payload.get("resumed", False)) for e in resumed] == [
        (1, False),
        (1, True),
    ]


def test_run_stream_works_in_a_workflow_and_run_toolsets_are_refused(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.toolsets import FunctionToolset

    tools: list[str] = []
    agent = weather_agent(TestModel(custom_output_text="It is sunny in Paris."), tools)
    app = make_app()

    @app.workflow()
    async def streamed(text: str) -> str:
        async with agent.run_stream(text) as run:
            return "".join([t async for t in run.stream_text(delta=True)])

    @app.workflow()
    async def extra_tools(text: str) -> str:
        try:
            await agent.run(text, toolsets=[FunctionToolset(id="more")])
        except UserError as e:
            return str(e)
        return "ran"

    app.launch()
    run_id = app.start(streamed, "weather?")
    assert app.result(run_id, timeout_s=30) == "It is sunny in Paris."
    assert [e.step_id for e in events(app, run_id, "step_started")] == [
        "1:weather__model.request_stream",
        f"2:{TOOL_STEP}",
        "3:weather__model.request_stream",
    ]
    assert len(tools) == 1
    refused = app.result(app.start(extra_tools, "weather?"), timeout_s=30)
    assert "Ratchet" in refused and "toolset" in refused.lower()


# -- guards ------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [{"budget_tokens": 400}, {"budget_usd": 0.0001}])
def test_a_model_request_that_would_cross_a_budget_is_never_sent(
    make_app: Callable[..., ratchet.Ratchet], budget: dict[str, Any]
) -> None:
    server = LocalProvider(script=agent_app.SCRIPT)
    with serve(server) as base:
        tools: list[str] = []
        agent = weather_agent(local_model(base), tools)
        app = make_app()

        # max_tokens=500 is the worst case: 500 tokens, 0.0008 USD for gpt-4.1-mini.
        @app.workflow(guards=ratchet.Guards(**budget))
        async def ask(text: str) -> str:
            return (await agent.run(text, model_settings={"max_tokens": 500})).output

        app.launch()
        run_id = app.start(ask, "weather in Paris?")
        wait_for(lambda: app.get(run_id).status == "failed", what="the run failed")
        assert server.requests() == [] and tools == []
        [anomaly] = events(app, run_id, "anomaly_detected")
        assert anomaly.step_id == f"1:{MODEL_STEP}"
        name = next(iter(budget))
        assert anomaly.payload["budget"] == name.removeprefix("budget_")
        assert anomaly.payload["worst_case"] > budget[name]
        assert events(app, run_id, "step_started") == []
        assert app.get(run_id).error is not None and "would be crossed" in (
            app.get(run_id).error or ""
        )


@pytest.mark.parametrize(("cities", "loops"), [(["Paris", "Rome"], 0), (["Paris", "Paris"], 1)])
def test_the_runaway_loop_guard_sees_a_tools_arguments(
    make_app: Callable[..., ratchet.Ratchet], cities: list[str], loops: int
) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", ())):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("forecast", {"city": c}) for c in cities])

    agent = Agent(FunctionModel(model), name="weather", capabilities=[RatchetDurability()])

    @agent.tool_plain
    def forecast(city: str) -> str:
        """The same answer for every city."""
        return "sunny"

    app = make_app()

    # record: the run answers after its anomaly (the default action is fail).
    @app.workflow(guards=ratchet.Guards(runaway_repeats=2, actions={"runaway_loop": "record"}))
    async def ask(text: str) -> str:
        return (await agent.run(text)).output

    app.launch()
    run_id = app.start(ask, "weather?")
    assert app.result(run_id, timeout_s=30) == "done"
    assert len(events(app, run_id, "tool_called")) == 2
    found = [e.payload for e in events(app, run_id, "anomaly_detected")]
    assert [a["kind"] for a in found] == ["runaway_loop"] * loops
