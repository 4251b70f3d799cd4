"""The diff page's rows: two runs step by step, as :class:`ratchet.model.diff.RunDiff`
tells them, with each side's output (a model call's answer as text, its body as JSON),
tokens, cost and duration put in words for a table. What a journal holds is only ever
data here; the template escapes it."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from ratchet.model import answer_text
from ratchet.model.diff import RunDiff, StepDiff, StepSide

LABELS = {"same": "same", "changed": "changed", "only_a": "only in A", "only_b": "only in B"}


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def _cost(usd: float | None) -> str:
    return "–" if usd is None else f"${usd:.6f}"


def _ms(ms: float | None) -> str:
    if ms is None:
        return "–"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _side(side: StepSide | None) -> dict[str, Any] | None:
    if side is None:
        return None
    # A model's response body reads as its answer; any other output as its JSON.
    answer = answer_text(side.output) if isinstance(side.output, dict) else None
    tokens = (side.input_tokens or 0) + (side.output_tokens or 0)
    return {
        "status": side.status,
        "error": side.error,
        "answer": answer,
        "output": _json(side.output),
        "tokens": (
            f"{tokens:,} tokens ({side.input_tokens or 0:,} in, {side.output_tokens or 0:,} out)"
            if tokens
            else "no tokens"
        ),
        "cost": _cost(side.cost_usd),
        "duration": _ms(side.duration_ms),
    }


def _row(step: StepDiff) -> dict[str, Any]:
    a, b = _side(step.a), _side(step.b)
    label = LABELS.get(step.status, step.status)
    # Two model responses differ in their ids and timestamps whatever they answered: say
    # when the answers themselves are the same.
    if (
        step.status == "changed"
        and a is not None
        and b is not None
        and a["answer"] is not None
        and (a["status"], a["answer"]) == (b["status"], b["answer"])
    ):
        label = "changed, same answer"
    return {"step_id": step.step_id, "status": step.status, "label": label, "a": a, "b": b}


def _total(sides: list[StepSide]) -> dict[str, str]:
    costs = [s.cost_usd for s in sides if s.cost_usd is not None]
    tokens = sum((s.input_tokens or 0) + (s.output_tokens or 0) for s in sides)
    took = sum(s.duration_ms or 0 for s in sides)
    return {
        "tokens": f"{tokens:,}",
        "cost": _cost(sum(costs)) if costs else "–",
        "duration": _ms(took),
    }


def view(diff: RunDiff, fork_point: str | None = None) -> dict[str, Any]:
    """The page's rows, the count of each kind of row, and each run's totals;
    ``fork_point``, the step where one run was forked from the other, is marked."""
    counts = Counter[str](s.status for s in diff.steps)
    rows = [_row(s) for s in diff.steps]
    for row in rows:
        row["fork_point"] = row["step_id"] == fork_point
    return {
        "rows": rows,
        "counts": {label: counts[status] for status, label in LABELS.items()},
        "total_a": _total([s.a for s in diff.steps if s.a is not None]),
        "total_b": _total([s.b for s in diff.steps if s.b is not None]),
    }
