"""The reply to a prompt: the script's first matching rule, else the echo of the last user
message, with usage counted the same way every time.

Usage: input tokens are ``ceil(chars / 4)`` of the prompt (at least 1), output tokens the
same of the reply text and tool calls (name plus arguments JSON), plus the rule's
reasoning tokens; a rule may set the counts outright.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from ratchet.llm.server.json_sample import sample
from ratchet.llm.server.prompt import Prompt, tokens
from ratchet.llm.server.script import ReplySpec, Rule


@dataclass(frozen=True)
class ToolCall:
    """A tool call in a reply; ``arguments`` is JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Usage:
    """Tokens of one answer. ``input_tokens`` includes ``cached_tokens`` and
    ``output_tokens`` includes ``reasoning_tokens``, as OpenAI counts them."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class Reply:
    """What the model says: text (None for tool calls alone), tool calls, usage."""

    text: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: Usage


class RuleBook:
    """The script's rules in order, with what is left of each one's ``times``."""

    def __init__(self, rules: list[Rule]) -> None:
        self._rules = rules
        self._lock = threading.Lock()
        self._left: list[int | None] = []
        self.reset()

    def reset(self) -> None:
        """Every rule may be used its full ``times`` again."""
        with self._lock:
            self._left = [rule.times for rule in self._rules]

    def pick(self, prompt: Prompt) -> ReplySpec | None:
        """The reply of the first rule that matches and is not used up (and use it once)."""
        with self._lock:
            for i, rule in enumerate(self._rules):
                if self._left[i] == 0 or not matches(rule, prompt):
                    continue
                left = self._left[i]
                if left is not None:
                    self._left[i] = left - 1
                return rule.reply
        return None


def matches(rule: Rule, prompt: Prompt) -> bool:
    """Whether every condition of the rule's match holds for the prompt."""
    m = rule.match
    if m.endpoint != "any" and m.endpoint != prompt.endpoint:
        return False
    if m.model is not None and m.model != prompt.model:
        return False
    if m.last_role is not None and m.last_role != prompt.last_role:
        return False
    if m.contains is not None:
        if m.last_role == "tool":
            return m.contains in prompt.tool_result_text
        return prompt.last_role == "user" and m.contains in prompt.last_user_text
    return True


def compose(prompt: Prompt, spec: ReplySpec | None) -> Reply:
    """The reply for ``prompt``: as ``spec`` says, else the default one."""
    spec = spec or ReplySpec()
    calls = tuple(
        ToolCall(c.name, json.dumps(c.arguments, ensure_ascii=False, separators=(",", ":")))
        for c in spec.tool_calls or ()
    )
    text: str | None
    if spec.text is not None:
        text = spec.text
    elif spec.json_value is not None:
        text = json.dumps(spec.json_value, ensure_ascii=False)
    elif calls:
        text = None
    else:
        text = default_text(prompt)
    reply_chars = len(text or "") + sum(len(c.name) + len(c.arguments) for c in calls)
    input_tokens = spec.input_tokens or tokens(prompt.chars)
    output_tokens = spec.output_tokens or tokens(reply_chars) + spec.reasoning_tokens
    usage = Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_tokens=min(spec.cached_tokens, input_tokens),
        reasoning_tokens=spec.reasoning_tokens,
    )
    return Reply(text=text, tool_calls=calls, usage=usage)


def default_text(prompt: Prompt) -> str:
    """The echo of the last user message, or a JSON value when JSON is asked for."""
    echo = f"echo: {prompt.last_user_text}"
    if prompt.json_schema is not None:
        return json.dumps(sample(prompt.json_schema, echo), ensure_ascii=False)
    if prompt.json_object:
        return json.dumps({"reply": echo}, ensure_ascii=False)
    return echo
