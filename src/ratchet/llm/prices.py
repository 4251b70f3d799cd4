"""What a model call costs, from a price table (USD per million tokens).

The table ships with the package (``prices.json``) and can be overridden, per model, from a
JSON or YAML file named by ``RATCHET_LLM_PRICES`` or with :func:`set_prices`. A model found in
neither has no price: its calls cost ``None`` (``null`` in the journal), never a guess. A
dated model name (``gpt-4.1-mini-2025-04-14``, ``claude-sonnet-4-5-20250929``) is priced as
its undated alias.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ratchet.errors import ConfigError

ENV = "RATCHET_LLM_PRICES"
_DATED = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


class Price(BaseModel):
    """One model's prices, USD per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)


@dataclass(frozen=True, slots=True)
class Usage:
    """A call's tokens, the same way for every provider: ``input_tokens`` is the whole
    prompt (cached and cache-written tokens included), ``output_tokens`` the whole answer
    (reasoning included)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    def as_json(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }


_table: dict[str, Price] | None = None


def _parse(data: Any, source: str) -> dict[str, Price]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"price table {source}: expected a mapping of model name to prices")
    table = {}
    for model, entry in data.items():
        if str(model).startswith("_"):
            continue  # a comment
        try:
            table[str(model)] = Price.model_validate(entry)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConfigError(
                f"price table {source}: model {model!r}: {first['msg']}"
                f"{f' at {where}' if where else ''}"
            ) from None
    return table


def _read(path: Path) -> dict[str, Price]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"price table {path}: cannot read it: {e.strerror}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ValueError as e:  # json.JSONDecodeError and yaml.YAMLError's parse errors
        raise ConfigError(
            f"price table {path}: not valid {path.suffix[1:] or 'JSON'}: {e}"
        ) from None
    return _parse(data, str(path))


def prices() -> dict[str, Price]:
    """The price table in force: the package's, overridden by ``RATCHET_LLM_PRICES``."""
    global _table
    if _table is None:
        text = resources.files("ratchet.llm").joinpath("prices.json").read_text()
        table = _parse(json.loads(text), "prices.json")
        override = os.environ.get(ENV)
        if override:
            table.update(_read(Path(override)))
        _table = table
    return _table


def set_prices(table: Mapping[str, Any] | str | Path, *, replace: bool = False) -> None:
    """Override prices for some models (a mapping, or a JSON/YAML file), or with
    ``replace=True`` use only these. Costs are computed when a call's step completes, in the
    worker's process: set prices there."""
    global _table
    parsed = _read(Path(table)) if isinstance(table, str | Path) else _parse(table, "given")
    _table = parsed if replace else {**prices(), **parsed}


def price_for(model: str | None) -> Price | None:
    if not model:
        return None
    table = prices()
    found = table.get(model)
    if found is None:
        found = table.get(_DATED.sub("", model))
    return found


def cost_usd(model: str | None, usage: Usage) -> float | None:
    """What ``usage`` of ``model`` costs, or None for a model without a price."""
    price = price_for(model)
    if price is None:
        return None
    cached = usage.cached_tokens
    written = usage.cache_write_tokens
    fresh = max(0, usage.input_tokens - cached - written)
    total = (
        fresh * price.input
        + cached * (price.cached_input if price.cached_input is not None else price.input)
        + written * (price.cache_write if price.cache_write is not None else price.input)
        + usage.output_tokens * price.output
    )
    return round(total / 1_000_000, 10)
