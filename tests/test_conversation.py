"""A run's model calls as a conversation (:mod:`ratchet.ui.conversation`), from journals
written by hand in the journal's request format and of real agent runs on the local
provider (OpenAI and Anthropic SDKs): each turn shows the messages the turn
before did not, the reply once, tool calls and their results by tool, tokens, cost and
latency, and each attempt that did not simply complete, a crash in the words of the run's
drives; a journal without requests still shows the answers; the page's fragment escapes
whatever a journal holds."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

import ratchet
from ratchet.llm.server import LocalProvider, serve
from ratchet.model import GENESIS_HASH, Event
from ratchet.model.requests import digest, requests_of
from ratchet.ui import conversation
from ratchet.ui.pages import templates

SYSTEM = {"role": "system", "content": "Answer with the tools."}
USER = {"role": "user", "content": "weather in Paris?"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"city": "Paris"}'},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]


class Journal:
    """Events appended as a run would journal them, requests in the content-addressed
    form (each message's body once per run)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.known: set[str] = set()
        self.lists: dict[str, list[Any]] = {}

    def add(
        self,
        what: str,
        step: str | None = None,
        attempt: int | None = None,
        payload: dict[str, Any] | None = None,
        **p: Any,
    ) -> None:
        prev = self.events[-1].hash if self.events else GENESIS_HASH
        seq = len(self.events) + 1
        body = (payload or {}) | p
        self.events.append(Event.chain("r", seq, what, step, attempt, body, float(seq), prev))

    def request(self, step: str, messages: list[Any], **params: Any) -> dict[str, Any]:
        source, keep = None, 0
        if self.lists:  # the conversation goes on from the request before it
            source, sent = next(reversed(self.lists.items()))
            while keep < min(len(sent), len(messages)) and sent[keep] == messages[keep]:
                keep += 1
            source = source if keep else None
        digests = [digest(m) for m in messages]
        bodies = {d: m for d, m in zip(digests, messages, strict=True) if d not in self.known}
        self.known.update(digests)
        self.lists[step] = messages
        return {
            "messages": {"from": source, "keep": keep, "add": digests[keep:]},
            "bodies": bodies,
            "params": params,
        }

    def call(
        self,
        step: str,
        messages: list[Any] | None,
        output: Any,
        attempt: int = 1,
        tokens: tuple[int, int] = (10, 5),
        **params: Any,
    ) -> None:
        started: dict[str, Any] = {"kind": "llm", "provider": "openai", "model": "gpt-4.1-mini"}
        if messages is not None:
            started["request"] = self.request(step, messages, **params)
        self.add("step_started", step, attempt, started)
        meta = {
            "provider": "openai",
            "model": "gpt-4.1-mini",
            "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]},
            "cost_usd": 0.000012,
            "latency_ms": 240.5,
        }
        self.add("step_completed", step, attempt, output=output, llm=meta)

    def turns(self, whole: str | None = None) -> list[conversation.Turn]:
        return conversation.turns(self.events, requests_of(self.events), whole=whole)


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message}]}


def drive(worker: str, n: int, reason: str = "claim") -> dict[str, Any]:
    return {"worker_id": worker, "epoch": n, "drive": n, "reason": reason}


def agent_journal() -> Journal:
    j = Journal()
    j.add("run_started", **drive("a", 1))
    j.call("1:openai.chat.completions.create", [SYSTEM, USER], completion(CALL), tools=TOOLS)
    j.add("step_started", "2:lookup", 1, kind="tool")
    j.add("step_completed", "2:lookup", 1, output={"sky": "sunny"})
    answer = {"role": "assistant", "content": "It is sunny in Paris."}
    j.call("3:openai.chat.completions.create", [SYSTEM, USER, CALL, RESULT], completion(answer))
    return j


def test_an_agent_reads_as_turns_each_message_once_and_the_tool_result_named() -> None:
    first, second = agent_journal().turns()
    assert (first.number, first.step_id, first.journaled) == (
        1,
        "1:openai.chat.completions.create",
        True,
    )
    assert [(m.role, m.text) for m in first.messages] == [
        ("system", "Answer with the tools."),
        ("user", "weather in Paris?"),
    ]
    assert first.tools == ["lookup"] and first.skipped == 0
    assert first.reply is not None and first.reply.role == "assistant"
    [call] = first.reply.calls
    assert (call.id, call.name, call.arguments) == ("call_1", "lookup", '{\n  "city": "Paris"\n}')
    assert (first.input_tokens, first.output_tokens, first.cost_usd, first.latency_ms) == (
        10,
        5,
        0.000012,
        240.5,
    )
    assert not first.attempts_shown  # one attempt, completed: nothing to tell
    # Turn 2 shows only what is new: the tool's result (the reply it echoes back is turn
    # 1's, shown there), named by the call it answers.
    assert second.skipped == 3 and second.continues == first.step_id
    [result] = second.messages
    assert (result.role, result.tool, result.answers, result.text) == (
        "tool",
        "lookup",
        "call_1",
        '{"sky": "sunny"}',
    )
    assert second.reply is not None and second.reply.text == "It is sunny in Paris."


def test_one_steps_turn_alone_has_every_message_it_was_sent() -> None:
    [turn] = agent_journal().turns(whole="3:openai.chat.completions.create")
    assert [m.role for m in turn.messages] == ["system", "user", "assistant", "tool"]
    assert turn.skipped == 0 and turn.continues is None
    assert turn.messages[2].calls[0].name == "lookup"


def test_retries_and_a_crash_are_told_inline() -> None:
    j = Journal()
    step = "1:openai.chat.completions.create"
    j.add("run_started", **drive("a", 1))
    started = {"kind": "llm", "request": j.request(step, [USER])}
    j.add("step_started", step, 1, started)
    j.add("step_retrying", step, 1, error="429 Too Many Requests", error_type="LLMError")
    j.add("step_started", step, 2, started)
    # Worker a dies mid-call; b takes the run over and sends attempt 2 again.
    j.add("run_resumed", **drive("b", 2, "takeover"))
    j.add("step_started", step, 2, started)
    j.add("step_completed", step, 2, output=completion({"role": "assistant", "content": "hi"}))
    [turn] = j.turns()
    assert turn.attempts_shown
    assert [(a.attempt, a.outcome, a.error) for a in turn.attempts] == [
        (1, "retrying", "429 Too Many Requests"),
        (2, "interrupted", None),
        (2, "completed", None),
    ]
    note = turn.attempts[1].note or ""
    assert note.startswith("drive 1 by a: worker killed, taken over by b after")
    assert turn.reply is not None and turn.reply.text == "hi"


def test_a_call_the_run_was_cancelled_under_was_cut_short() -> None:
    j = Journal()
    step = "1:openai.chat.completions.create"
    j.add("run_started", **drive("a", 1))
    j.add("step_started", step, 1, kind="llm", request=j.request(step, [USER]))
    j.add("run_cancelled", by="ana", error="cancelled")
    [turn] = j.turns()
    assert turn.status == "interrupted" and turn.reply is None
    [attempt] = turn.attempts
    assert (attempt.outcome, attempt.note) == ("interrupted", "drive 1 by a: cancelled by ana")


def test_a_drift_found_on_replay_is_told_on_its_turn() -> None:
    j = agent_journal()
    said = "step '1:openai.chat.completions.create': the model request differs ..."
    j.add("request_drifted", "1:openai.chat.completions.create", None, message=said)
    first, second = j.turns()
    assert first.drifts == [said] and second.drifts == []
    assert "Replayed with a changed request" in render([first])


def test_a_failed_call_has_no_reply_and_says_why() -> None:
    j = Journal()
    step = "1:anthropic.messages.create"
    j.add("run_started", **drive("a", 1))
    j.add("step_started", step, 1, kind="llm", request=j.request(step, [USER]))
    j.add("step_failed", step, 1, error="400 Bad Request: max_tokens", error_type="LLMError")
    [turn] = j.turns()
    assert turn.status == "failed" and turn.reply is None
    assert [(a.outcome, a.error) for a in turn.attempts] == [
        ("failed", "400 Bad Request: max_tokens")
    ]


def test_anthropic_blocks_the_system_param_and_tool_results_read_as_roles() -> None:
    j = Journal()
    use = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"city": "Paris"}},
        ],
    }
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
    }
    body = {"type": "message", "role": "assistant", "content": use["content"]}
    j.call("1:anthropic.messages.create", [USER], body, system="Be brief.", max_tokens=256)
    final = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Sunny."}],
    }
    j.call("3:anthropic.messages.create", [USER, use, result], final, system="Be brief.")
    first, second = j.turns()
    assert [(m.role, m.text) for m in first.messages] == [
        ("system", "Be brief."),
        ("user", "weather in Paris?"),
    ]
    assert first.params == {"max_tokens": 256}
    assert first.reply is not None and first.reply.text == "Let me look."
    assert [c.name for c in first.reply.calls] == ["lookup"]
    [shown] = second.messages  # the assistant's tool_use is turn 1's reply
    assert (shown.role, shown.tool, shown.text) == ("tool", "lookup", "sunny")


def test_a_journal_without_requests_still_shows_the_answers() -> None:
    j = Journal()
    j.add("run_started", **drive("a", 1))
    j.call(
        "1:openai.chat.completions.create",
        None,
        completion({"role": "assistant", "content": "old"}),
    )
    [turn] = j.turns()
    assert not turn.journaled and turn.messages == []
    assert turn.reply is not None and turn.reply.text == "old"
    html = render([turn])
    assert "The request was not journaled" in html and ">old<" in html


def render(turns: list[conversation.Turn], **extra: Any) -> str:
    template = templates.env.get_template("_conversation.html")
    context = {"turns": turns, "total": len(turns), "more": None, "clip": 4000, "whole": False}
    return template.render(context | extra)


def test_the_fragment_escapes_what_a_journal_holds() -> None:
    j = Journal()
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    j.add("run_started", **drive("a", 1))
    call = {
        "role": "assistant",
        "content": evil,
        "tool_calls": [
            {"id": '"><b>', "type": "function", "function": {"name": "<i>x</i>", "arguments": evil}}
        ],
    }
    j.call(
        "1:openai.chat.completions.create", [{"role": "user", "content": evil}], completion(call)
    )
    html = render(j.turns())
    assert "<script>" not in html and "<img" not in html and "<i>x</i>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'data-step="1:openai.chat.completions.create"' in html


def test_a_long_message_is_clipped_and_a_200_turn_conversation_paged() -> None:
    j = Journal()
    j.add("run_started", **drive("a", 1))
    messages: list[Any] = []
    for i in range(1, 201):
        messages = [*messages, {"role": "user", "content": f"q{i}" + "x" * (5000 if i == 1 else 0)}]
        reply = {"role": "assistant", "content": f"a{i}"}
        j.call(f"{i}:openai.chat.completions.create", messages, completion(reply))
        messages = [*messages, reply]
    turns = j.turns()
    assert len(turns) == 200
    # Each turn shows its one new question (the reply before it was shown as a reply).
    assert all(len(t.messages) == 1 for t in turns)
    assert [t.messages[0].text for t in turns[1:4]] == ["q2", "q3", "q4"]
    html = render(turns[:50], total=200, more=50)
    assert "1,002 more characters in the raw JSON" in html
    assert 'data-after="50"' in html and "More turns (150 more)" in html
    assert html.count("<article") == 50
    assert len(html) < 100_000  # a page of 200 turns ships a quarter of them, each once


def test_a_pydantic_ai_model_response_reads_as_the_reply() -> None:
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart

    response = ModelResponse(parts=[TextPart("Looking."), ToolCallPart("lookup", {"c": 1}, "t1")])
    [dumped] = ModelMessagesTypeAdapter.dump_python([response], mode="json")
    got = conversation.reply({"response": dumped})
    assert got is not None and got.text == "Looking."
    assert [(c.id, c.name, c.arguments) for c in got.calls] == [("t1", "lookup", '{\n  "c": 1\n}')]


@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_a_real_agent_run_on_the_local_provider_reads_as_its_conversation(
    make_app: Callable[..., ratchet.Ratchet], which: str
) -> None:
    script = {
        "rules": [
            {
                "match": {"last_role": "user"},
                "reply": {"tool_calls": [{"name": "lookup", "arguments": {"city": "Paris"}}]},
            },
            {"match": {"last_role": "tool"}, "reply": {"text": "It is sunny in Paris."}},
        ]
    }
    with serve(LocalProvider(script=script)) as base:
        client = (
            ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-local"))
            if which == "openai"
            else ratchet.llm.wrap(anthropic.AsyncAnthropic(base_url=base, api_key="sk-local"))
        )
        app = make_app()

        @app.tool
        async def lookup(city: str) -> dict[str, str]:
            """The weather in a city."""
            return {"city": city, "sky": "sunny"}

        @app.workflow()
        async def ask(text: str) -> str | None:
            agent = ratchet.Agent(
                model="gpt-4.1-mini" if which == "openai" else "claude-sonnet-4-6",
                instructions="Use the tools.",
                tools=[lookup],
                client=client,
            )
            return (await agent.run(text)).output

        app.launch()
        run_id = app.start(ask, "weather in Paris?")
        assert app.result(run_id, timeout_s=30) == "It is sunny in Paris."
    events = app.events(run_id)
    first, second = conversation.turns(events, requests_of(events))
    assert [(m.role, m.text) for m in first.messages] == [
        ("system", "Use the tools."),
        ("user", "weather in Paris?"),
    ]
    assert first.tools == ["lookup"] and first.provider == which
    assert first.reply is not None and [c.name for c in first.reply.calls] == ["lookup"]
    assert first.input_tokens and first.output_tokens and first.latency_ms is not None
    [result] = second.messages  # the call echoed back is turn 1's reply, not shown again
    assert (result.role, result.tool) == ("tool", "lookup")
    assert json.loads(result.text) == {"city": "Paris", "sky": "sunny"}
    assert second.reply is not None and second.reply.text == "It is sunny in Paris."


def test_a_pydantic_ai_run_journals_no_request_and_still_reads_as_its_answers(
    make_app: Callable[..., ratchet.Ratchet], collect_clients: None
) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from ratchet.integrations.pydantic_ai import RatchetDurability

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("lookup", {"city": "Paris"}, "t1")])
        return ModelResponse(parts=[TextPart("It is sunny in Paris.")])

    agent = Agent(FunctionModel(model), name="weather", capabilities=[RatchetDurability()])

    @agent.tool_plain
    def lookup(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    app = make_app()

    @app.workflow()
    async def ask(text: str) -> str:
        return (await agent.run(text)).output

    app.launch()
    run_id = app.start(ask, "weather in Paris?")
    assert app.result(run_id, timeout_s=30) == "It is sunny in Paris."
    events = app.events(run_id)
    first, second = conversation.turns(events, requests_of(events))
    assert not first.journaled and not second.journaled
    assert first.reply is not None and [c.name for c in first.reply.calls] == ["lookup"]
    assert second.reply is not None and second.reply.text == "It is sunny in Paris."
    html = render([first, second])
    assert html.count("The request was not journaled") == 2
    assert "It is sunny in Paris." in html
