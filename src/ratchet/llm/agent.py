"""The plain-LLM agent loop: model turns and tool calls, each a journaled step.

``await ratchet.Agent(model="gpt-4.1-mini", instructions=..., tools=[...]).run(text)`` in a
workflow: each model turn is an LLM step (through a wrapped client) and each tool call a
tool step, so a crash mid-loop resumes at the last completed turn, and the model is never
asked a completed turn's question again. The tool calls of one reply run concurrently, each
its own step: their steps are numbered in the order the model asked for them before any of
them starts (a step's position is taken when it is called, not when it runs), so every
replay numbers them the same way, and a replay after a crash takes the calls that finished
from the journal and runs only the others. Their answers go back to the model in the
reply's order.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratchet.errors import InvalidInput, RatchetError, RetryClass, StepFailed
from ratchet.extras import require
from ratchet.llm.tools import ToolDef, tool_of
from ratchet.llm.wrap import DurableClient, wrap


class AgentMaxTurns(RatchetError):
    """The agent reached its max_turns without a final answer."""

    retry_class = RetryClass.NEVER


@dataclass(slots=True)
class AgentResult:
    """How an agent run ended: its final answer, the turns it took, and the conversation."""

    output: str | None
    turns: int
    messages: list[dict[str, Any]] = field(default_factory=list)


class Agent:
    """A model with instructions and tools, run as a loop of durable steps.

    ``client`` is an ``openai.AsyncOpenAI`` or ``anthropic.AsyncAnthropic`` (wrapped here if
    it is not already); without one, the SDK's default client is made on first use (its
    API key and base URL from the SDK's own environment variables), Anthropic's for a
    ``claude`` model, OpenAI's otherwise."""

    def __init__(
        self,
        model: str,
        *,
        instructions: str | None = None,
        tools: Sequence[Any] = (),
        max_turns: int = 10,
        client: Any = None,
        max_tokens: int = 1024,
        name: str = "agent",
    ) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidInput(f"Agent: model must be a model name, got {model!r}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise InvalidInput(f"Agent: max_turns must be an integer >= 1, got {max_turns!r}")
        self.model = model
        self.instructions = instructions
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.name = name
        self.tools: dict[str, tuple[Any, ToolDef]] = {}
        for t in tools:
            td = tool_of(t)
            if td.name in self.tools:
                raise InvalidInput(f"Agent {name}: two tools are named {td.name!r}")
            self.tools[td.name] = (t, td)
        self._client = (
            client if client is None or isinstance(client, DurableClient) else wrap(client)
        )

    @property
    def client(self) -> Any:
        if self._client is None:
            if self.model.startswith("claude"):
                require(f"Agent(model={self.model!r}) without a client", "anthropic")
                import anthropic

                self._client = wrap(anthropic.AsyncAnthropic())
            else:
                require(f"Agent(model={self.model!r}) without a client", "openai")
                import openai

                self._client = wrap(openai.AsyncOpenAI())
        return self._client

    async def run(self, input: str) -> AgentResult:
        """Run the loop on ``input`` until the model answers without calling a tool."""
        if not isinstance(input, str):
            raise InvalidInput(f"Agent.run: input must be a string, got {input!r}")
        if self.client.provider == "anthropic":
            return await self._run_anthropic(input)
        return await self._run_openai(input)

    async def _run_openai(self, text: str) -> AgentResult:
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        messages.append({"role": "user", "content": text})
        tools = [td.openai_tool() for _, td in self.tools.values()]
        for turn in range(1, self.max_turns + 1):
            options: dict[str, Any] = {"tools": tools} if tools else {}
            reply = await self.client.chat.completions.create(
                model=self.model, messages=messages, **options
            )
            message = reply.choices[0].message
            calls = message.tool_calls or []
            said: dict[str, Any] = {"role": "assistant", "content": message.content}
            if calls:
                said["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in calls
                ]
            messages.append(said)
            if not calls:
                return AgentResult(message.content, turn, messages)
            answers = await self._call_tools(
                [(c.function.name, c.function.arguments) for c in calls]
            )
            for c, (content, _) in zip(calls, answers, strict=True):
                messages.append({"role": "tool", "tool_call_id": c.id, "content": content})
        raise self._exhausted()

    async def _run_anthropic(self, text: str) -> AgentResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
        options: dict[str, Any] = {}
        if self.instructions:
            options["system"] = self.instructions
        if self.tools:
            options["tools"] = [td.anthropic_tool() for _, td in self.tools.values()]
        for turn in range(1, self.max_turns + 1):
            reply = await self.client.messages.create(
                model=self.model, max_tokens=self.max_tokens, messages=messages, **options
            )
            blocks = [b.to_dict() for b in reply.content]
            messages.append({"role": "assistant", "content": blocks})
            uses = [b for b in blocks if b.get("type") == "tool_use"]
            if not uses:
                answer = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
                return AgentResult(answer, turn, messages)
            results = []
            answers = await self._call_tools([(u["name"], u.get("input") or {}) for u in uses])
            for use, (content, failed) in zip(uses, answers, strict=True):
                results.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": use["id"],
                        "content": content,
                        "is_error": failed,
                    }
                )
            messages.append({"role": "user", "content": results})
        raise self._exhausted()

    async def _call_tools(self, calls: list[tuple[str, Any]]) -> list[tuple[str, bool]]:
        """The answers of one reply's tool calls, in the reply's order. Every call is made
        (its step's position taken) here, in the reply's order, before any of them runs;
        then they run together."""
        pending: list[tuple[str, bool] | Awaitable[Any]] = []
        try:
            for name, arguments in calls:
                pending.append(self._call_tool(name, arguments))
        except BaseException:
            for p in pending:  # made but never to be awaited: no "never awaited" warning
                if inspect.iscoroutine(p):
                    p.close()
            raise
        if len(pending) == 1:
            return [await _answer(pending[0])]
        return list(await asyncio.gather(*(_answer(p) for p in pending)))

    def _call_tool(self, name: str, arguments: Any) -> tuple[str, bool] | Awaitable[Any]:
        """The tool called with the model's arguments: its result, or an awaitable of it
        (a step in a workflow, its position taken now, or an async tool). A model's mistake
        (an unknown tool, arguments that do not fit) is the answer at once, an error the
        model can act on rather than the end of the run."""
        entry = self.tools.get(name)
        if entry is None:
            return f"error: there is no tool named {name!r}", True
        call, td = entry
        try:
            if isinstance(arguments, str):
                arguments = json.loads(arguments or "{}")
            if not isinstance(arguments, dict):
                raise InvalidInput(f"arguments for tool {name} must be a JSON object")
            kwargs = td.bind(arguments)
        except (ValueError, InvalidInput) as e:
            return f"error: {e}", True
        try:
            result = call(**kwargs)
        except StepFailed as e:  # a plain tool outside a workflow, failing at once
            return f"error: {e.error}", True
        if inspect.isawaitable(result):
            return result
        return _text(result), False

    def _exhausted(self) -> AgentMaxTurns:
        return AgentMaxTurns(
            f"agent {self.name}: no final answer after {self.max_turns} turns "
            f"(max_turns={self.max_turns})"
        )


async def _answer(pending: tuple[str, bool] | Awaitable[Any]) -> tuple[str, bool]:
    """A tool call's answer for the model, and whether it is an error: a tool's failure
    goes back to the model as an error it can act on."""
    if isinstance(pending, tuple):
        return pending
    try:
        result = await pending
    except StepFailed as e:
        return f"error: {e.error}", True
    return _text(result), False


def _text(result: Any) -> str:
    if isinstance(result, str):
        return result
    return json.dumps(result, default=str)
