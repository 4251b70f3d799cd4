"""The most a model call may spend, known before it is sent: what the budgets
(:class:`ratchet.Guards`) check, so a call that would cross one is never made.

Its output is bounded by its ``max_tokens`` (``max_completion_tokens``,
``max_output_tokens``); a call without one is taken to write :data:`UNBOUNDED_OUTPUT`
tokens. Its prompt is estimated at :data:`CHARS_PER_TOKEN` characters of its JSON a token:
an estimate, not a tokenizer, which is why the output's bound carries the weight.
"""

from __future__ import annotations

from typing import Any

from ratchet.llm.prices import Usage, cost_usd
from ratchet.model import dumps

UNBOUNDED_OUTPUT = 4096
CHARS_PER_TOKEN = 4
_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_PROMPT = ("messages", "input", "system", "instructions", "tools", "prompt")


def worst_case(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, float | None]:
    """(tokens, USD or None for an unpriced model) the call may spend at most."""
    limit = next((kwargs[k] for k in _LIMITS if isinstance(kwargs.get(k), int)), UNBOUNDED_OUTPUT)
    try:
        prompt = dumps({k: kwargs[k] for k in _PROMPT if k in kwargs})
    except (TypeError, ValueError):
        prompt = str({k: kwargs[k] for k in _PROMPT if k in kwargs})
    prompt_tokens = -(-len(prompt) // CHARS_PER_TOKEN)
    usage = Usage(input_tokens=prompt_tokens, output_tokens=limit)
    return prompt_tokens + limit, cost_usd(kwargs.get("model"), usage)
