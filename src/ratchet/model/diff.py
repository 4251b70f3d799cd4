"""Two runs side by side, step by step: what :meth:`ratchet.Ratchet.diff` returns.

Steps are matched by step id (``"3:summarize"``, the ordinal and the name), so a fork
and its source line up on the steps they share. A step is ``same`` when both runs hold
it with the same status and output, ``changed`` when the outputs differ or one of them
failed, ``only_a`` / ``only_b`` when one run never reached it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ratchet.model.fold import RunState, StepState, split_step_id
from ratchet.model.states import StepStatus

__all__ = ["RunDiff", "StepDiff", "StepSide", "diff_states"]

DiffStatus = Literal["same", "changed", "only_a", "only_b"]


@dataclass(frozen=True, slots=True)
class StepSide:
    """One run's side of a step: where it stands, its output (None until it completed),
    the tokens and cost of its model calls (None for a step that made none), and how
    long it took (None while it has not finished)."""

    status: str
    output: Any
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    duration_ms: float | None
    error: str | None = None  # a failed step's error

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "output": self.output,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
            "duration_ms": self.duration_ms,
            "error": self.error,
        }

    @staticmethod
    def of(step: StepState) -> StepSide:
        meta = step.llm or {}
        usage = meta.get("usage") or {}
        called = bool(meta)
        cost = meta.get("cost_usd")
        duration = None
        if step.status.finished and step.finished_at is not None:
            began = step.started_at if step.started_at is not None else step.first_started_at
            if began is not None:
                duration = round(max(step.finished_at - began, 0.0) * 1000, 3)
        return StepSide(
            status=str(step.status),
            output=step.output if step.status == StepStatus.COMPLETED else None,
            input_tokens=int(usage.get("input_tokens") or 0) if called else None,
            output_tokens=int(usage.get("output_tokens") or 0) if called else None,
            cost_usd=float(cost) if isinstance(cost, int | float) else None,
            duration_ms=duration,
            error=step.error if step.status == StepStatus.FAILED else None,
        )


@dataclass(frozen=True, slots=True)
class StepDiff:
    """One step id, as each run holds it."""

    step_id: str
    status: DiffStatus
    a: StepSide | None
    b: StepSide | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "status": self.status,
            "a": None if self.a is None else self.a.as_dict(),
            "b": None if self.b is None else self.b.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class RunDiff:
    """Runs ``a`` and ``b``, step by step, in step order."""

    a: str
    b: str
    steps: list[StepDiff]

    def as_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "steps": [s.as_dict() for s in self.steps]}

    @property
    def changed(self) -> list[StepDiff]:
        """The steps that are not the same in both runs."""
        return [s for s in self.steps if s.status != "same"]


def _compare(a: StepSide, b: StepSide) -> DiffStatus:
    failed = str(StepStatus.FAILED)
    if failed in (a.status, b.status) and (a.status, a.error) != (b.status, b.error):
        return "changed"
    if a.status != b.status or a.output != b.output:
        return "changed"
    return "same"


def _order(step_id: str) -> tuple[int, str]:
    try:
        return split_step_id(step_id)
    except ValueError:  # not "N:name": after the numbered ones, by name
        return (2**62, step_id)


def diff_states(a: RunState, b: RunState) -> RunDiff:
    """The step-by-step diff of two folded journals."""
    ids = sorted(set(a.steps) | set(b.steps), key=_order)
    steps: list[StepDiff] = []
    for sid in ids:
        sa = StepSide.of(a.steps[sid]) if sid in a.steps else None
        sb = StepSide.of(b.steps[sid]) if sid in b.steps else None
        if sa is None:
            status: DiffStatus = "only_b"
        elif sb is None:
            status = "only_a"
        else:
            status = _compare(sa, sb)
        steps.append(StepDiff(sid, status, sa, sb))
    return RunDiff(a.run_id, b.run_id, steps)
