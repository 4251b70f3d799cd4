"""What the guards measure a run against: the workflow's history of finished runs (for the
spike guards), the text of a step's call (the runaway-loop streak's key), and the words an
anomaly is told with."""

from __future__ import annotations

import json.encoder
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ratchet.engine.guards.policy import BUDGET
from ratchet.model import dumps

if TYPE_CHECKING:
    from ratchet.store.base import Store


class History:
    """The last finished runs of a workflow: each run's cost, and each LLM step's tokens."""

    def __init__(self, rows: list[tuple[str, str | None, dict[str, Any] | None]]) -> None:
        costs: dict[str, float] = {}
        self.step_tokens: dict[str, list[int]] = {}
        for run_id, step_id, llm in rows:
            costs.setdefault(run_id, 0.0)
            if llm is None or step_id is None:
                continue
            cost = llm.get("cost_usd")
            if isinstance(cost, int | float):
                costs[run_id] += cost
            usage = llm.get("usage") or {}
            tokens = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
            self.step_tokens.setdefault(step_id, []).append(tokens)
        self.run_costs = list(costs.values())


# Per store (an app's database), by (workflow, runs): when it expires, and the history.
HISTORIES: weakref.WeakKeyDictionary[Store, dict[tuple[str, int], tuple[float, History]]] = (
    weakref.WeakKeyDictionary()
)


def describe(payload: Mapping[str, Any]) -> str:
    """An anomaly's payload in words, for its error and its approval."""
    kind = payload["kind"]
    if kind == BUDGET:
        held = payload.get("in_flight")
        worst = payload.get("worst_case")
        extra = f" + {held} held by calls in flight" if held else ""
        extra += f" + {worst} for the next call" if worst is not None else ""
        return (
            f"the run's {payload['budget']} budget of {payload['limit']} would be "
            f"crossed ({payload['used']} used{extra})"
        )
    if kind == "excessive_steps":
        return f"{payload['steps']} steps, more than max_steps {payload['max_steps']}"
    if kind == "runaway_loop" and "repeats" in payload:
        return (
            f"step {payload['step']} ran {payload['repeats']} times in a row with the "
            "same arguments and the same result"
        )
    if kind == "runaway_loop":
        return f"loop {payload['loop']} reached its max_iterations ({payload['max_iterations']})"
    if kind == "retry_storm":
        return (
            f"{payload['retries']} retries in {payload['window_s']:g}s in this "
            f"{payload['scope']}, more than {payload['limit']}"
        )
    if kind == "token_spike":
        return (
            f"{payload['tokens']} tokens, more than {payload['factor']:g}x the median "
            f"{payload['median']:g} of the last {payload['runs']} runs"
        )
    return (
        f"cost {payload['cost_usd']} USD, more than {payload['factor']:g}x the median "
        f"{payload['median']:g} of the last {payload['runs']} runs"
    )


_encode_str = json.encoder.encode_basestring  # what dumps writes a str as


def call_text(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``dumps([args, kwargs])``, the streak's key for a call. Most steps take plain
    strings and integers: their canonical text is written out directly, which every
    replayed step would otherwise pay a full encoding for."""
    if all(type(a) is int or type(a) is str for a in args) and all(
        type(v) is int or type(v) is str for v in kwargs.values()
    ):
        listed = ",".join([str(a) if type(a) is int else _encode_str(a) for a in args])
        named = ",".join(
            [
                f"{_encode_str(k)}:{v if type(v) is int else _encode_str(v)}"
                for k, v in sorted(kwargs.items())
            ]
        )
        return f"[[{listed}],{{{named}}}]"
    return dumps([args, kwargs])
