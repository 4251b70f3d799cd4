"""The model calls a worker makes for an isolated run's steps: with its own client and
credentials (a sandbox's headers never stand in for them) and the attempt's key, after the
run's budgets are checked against the call's worst case and the calls in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ratchet.engine.guards import BUDGET
from ratchet.engine.guards.run import RunGuards
from ratchet.errors import LLMError, LLMRequestError, LLMTimeout
from ratchet.model import LLMTotals

# Headers a sandbox's call may not set: the worker's client sends its own credentials and
# the attempt's key.
WORKER_HEADERS = frozenset(
    {
        "authorization",
        "api-key",
        "x-api-key",
        "idempotency-key",
        "openai-organization",
        "openai-project",
    }
)


@dataclass(slots=True)
class InFlight:
    """A model call the host makes for a step's attempt."""

    tokens: int
    usd: float


async def send(call: Any, kwargs: dict[str, Any], key: str) -> Any:
    """The provider's answer to one call, or the error a step's retry policy reads: an
    LLM error as the SDK's own would be, a timeout, or the request's fault."""
    try:
        if call.step.timeout_s is None:
            return await call.send(dict(kwargs), key)
        async with asyncio.timeout(call.step.timeout_s):
            return await call.send(dict(kwargs), key)
    except LLMError:
        raise
    except TimeoutError as e:
        raise LLMTimeout(
            f"{call.endpoint.name} ran past its timeout of {call.step.timeout_s:g}s",
            provider=call.endpoint.provider,
        ) from e
    except Exception as e:  # the SDK refused the arguments: the request's fault
        raise LLMRequestError(
            f"{call.endpoint.name}: {type(e).__name__}: {e}", provider=call.endpoint.provider
        ) from e


def own_credentials(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments without headers that would stand in for the worker's own."""
    headers = kwargs.get("extra_headers")
    if not isinstance(headers, dict):
        return kwargs
    return {
        **kwargs,
        "extra_headers": {k: v for k, v in headers.items() if str(k).lower() not in WORKER_HEADERS},
    }


async def check_budgets(
    guards: RunGuards,
    spent: LLMTotals,
    flying: Collection[InFlight],
    step_id: str,
    tokens: int,
    usd: float | None,
) -> None:
    """The token and money budgets against what the run has spent, what its calls in
    flight may still spend, and this call's worst case: a call that could cross one is
    never sent (its guard trips first)."""
    g = guards.g
    flying_tokens = sum(c.tokens for c in flying)
    flying_usd = sum(c.usd for c in flying)
    if g.budget_tokens is not None and (spent.tokens + flying_tokens + tokens > g.budget_tokens):
        await guards.trip(
            BUDGET,
            f"{BUDGET}:tokens",
            step_id,
            {
                "budget": "tokens",
                "used": spent.tokens + flying_tokens,
                "limit": g.budget_tokens,
                "worst_case": tokens,
            },
        )
    if (
        g.budget_usd is not None
        and usd is not None
        and (spent.cost_usd + flying_usd + usd > g.budget_usd)
    ):
        await guards.trip(
            BUDGET,
            f"{BUDGET}:usd",
            step_id,
            {
                "budget": "usd",
                "used": round(spent.cost_usd + flying_usd, 6),
                "limit": g.budget_usd,
                "worst_case": round(usd, 6),
            },
        )
