"""Model calls that a crash never pays for twice.

``ratchet.llm.wrap(openai.AsyncOpenAI())`` or ``wrap(anthropic.AsyncAnthropic())``: inside a
workflow each model call is a journaled step that sends an ``Idempotency-Key``, records its
usage and cost, and on replay is read back from the journal instead of sent again.
"""

from __future__ import annotations

from ratchet.llm.prices import Price, Usage, cost_usd, price_for, prices, set_prices
from ratchet.llm.wrap import DEFAULT_RETRY, DurableClient, wrap

__all__ = [
    "DEFAULT_RETRY",
    "DurableClient",
    "Price",
    "Usage",
    "cost_usd",
    "price_for",
    "prices",
    "set_prices",
    "wrap",
]
