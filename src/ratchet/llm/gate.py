"""The confidence gate: a model call whose answer is taken only if a score clears a threshold.

A wrapped call (``create(..., ratchet_gate=ratchet.Gate(...))``) or a graph ai-step
(``data.gate``) declares the threshold and where the score comes from: a field of the
structured answer (``field:confidence``, a dotted path), the provider's ``logprobs`` (the
mean token probability, where the provider returns them), or a ``judge``: a second model
call, itself a journaled LLM step, asked to rate the answer from 0 to 1. The engine journals
``confidence_evaluated {score, threshold, passed, source}``; a score that cannot be read is
``null`` and does not pass. Below the threshold the call follows ``on_below``: ``approval``
(a person decides; approving journals ``confidence_gate_bypassed`` with who and why),
``retry`` (the call again with ``retry_model``, gated the same way, once), ``fail``
(:class:`GateRejected`), or, in a graph, ``branch`` (the node's output carries the verdict
for its edges). A run started with ``guards={"gate": false, "gate_bypass_by": ...}`` skips
its gates, journaling ``confidence_gate_bypassed`` at each.

Every verdict is journaled under the gated step's id; a replay takes it from the journal,
and the judge, the approval and the retry are steps of their own, so nothing is asked twice.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ratchet.engine.approvals import approval
from ratchet.errors import GateRejected, InvalidInput
from ratchet.model import EventKind

if TYPE_CHECKING:
    from ratchet.engine.drive import Drive

ON_BELOW = ("approval", "retry", "fail", "branch")
_FIELD = re.compile(r"field:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
JUDGE_PROMPT = (
    "Rate from 0 to 1 how likely this answer is correct and complete. Reply "
    "with the number only.\n\nRequest:\n{request}\n\nAnswer:\n{answer}"
)


@dataclass(frozen=True, slots=True)
class Gate:
    """A confidence gate (see :mod:`ratchet.llm.gate`): ``threshold`` in [0, 1], ``source``
    ``field:<path>``, ``logprobs`` or ``judge`` (``judge_model``, default the call's own;
    ``judge_prompt`` with ``{request}`` and ``{answer}``), ``on_below`` ``approval``,
    ``retry`` (with ``retry_model``), ``fail`` or ``branch`` (graphs only)."""

    threshold: float
    source: str = "field:confidence"
    on_below: str = "approval"
    retry_model: str | None = None
    judge_model: str | None = None
    judge_prompt: str | None = None

    def __post_init__(self) -> None:
        problems = []
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t <= 1:
            problems.append(f"threshold must be a number from 0 to 1, got {t!r}")
        if not isinstance(self.source, str) or not (
            self.source in ("logprobs", "judge") or _FIELD.fullmatch(self.source)
        ):
            problems.append(f"source must be field:<name>, logprobs or judge, got {self.source!r}")
        if self.on_below not in ON_BELOW:
            problems.append(f"on_below must be one of {', '.join(ON_BELOW)}, got {self.on_below!r}")
        if self.on_below == "retry" and not self.retry_model:
            problems.append("on_below: retry needs retry_model (the model to try instead)")
        if self.judge_prompt is not None and "{answer}" not in self.judge_prompt:
            problems.append("judge_prompt must contain {answer}")
        if problems:
            raise InvalidInput("invalid gate: " + "; ".join(problems))

    @staticmethod
    def from_json(data: Any, what: str = "gate") -> Gate:
        """A gate from its JSON form (a graph ai-step's ``data.gate``)."""
        if not isinstance(data, dict):
            raise InvalidInput(f"invalid {what}: expected an object, got {data!r}")
        known = {"threshold", "source", "on_below", "retry_model", "judge_model", "judge_prompt"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInput(f"invalid {what}: unknown field {', '.join(unknown)}")
        if "threshold" not in data:
            raise InvalidInput(f"invalid {what}: threshold is required")
        return Gate(**data)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the gate decided of one answer."""

    score: float | None
    passed: bool
    body: dict[str, Any]  # the answer taken (the retry's, after a retry)

    def as_json(self, gate: Gate) -> dict[str, Any]:
        return {"score": self.score, "threshold": gate.threshold, "passed": self.passed}


def answer_text(body: dict[str, Any]) -> str:
    """The text of a chat, responses or messages body."""
    if "choices" in body:
        return str(body["choices"][0]["message"].get("content") or "")
    if "content" in body and isinstance(body["content"], list):
        return "".join(b.get("text", "") for b in body["content"] if b.get("type") == "text")
    parts = [
        c.get("text", "")
        for item in body.get("output") or []
        for c in item.get("content") or []
        if c.get("type") == "output_text"
    ]
    return "".join(parts)


def field_score(body: dict[str, Any], path: str) -> float | None:
    """The number at ``path`` in the answer's JSON, if it is one from 0 to 1."""
    try:
        value: Any = json.loads(answer_text(body))
    except ValueError:
        return None
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return _unit(value)


def logprob_score(body: dict[str, Any]) -> float | None:
    """The mean token probability of the answer, from the provider's logprobs."""
    tokens: list[Any] = []
    for choice in body.get("choices") or []:
        tokens += (choice.get("logprobs") or {}).get("content") or []
    for item in body.get("output") or []:
        for c in item.get("content") or []:
            tokens += c.get("logprobs") or []
    values = [
        t["logprob"]
        for t in tokens
        if isinstance(t, dict) and isinstance(t.get("logprob"), int | float)
    ]
    if not values:
        return None
    return math.exp(sum(values) / len(values))


def judge_score(text: str) -> float | None:
    """The first number in the judge's answer, if it is one from 0 to 1."""
    found = _NUMBER.search(text)
    return _unit(float(found.group())) if found else None


def _unit(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if 0 <= value <= 1 else None


# (step id, JSON body) of a model call with these keyword arguments: a journaled LLM step.
Call = Callable[[dict[str, Any]], Awaitable[tuple[str, dict[str, Any]]]]
# The same for the judge, from its model and prompt.
Judge = Callable[[str, str], Awaitable[tuple[str, dict[str, Any]]]]


async def apply(
    ctx: Drive,
    gate: Gate,
    step_id: str,
    body: dict[str, Any],
    kwargs: dict[str, Any],
    retry: Call,
    judge: Judge,
    retried: bool = False,
) -> Verdict:
    """Gate the answer ``body`` of step ``step_id`` (called with ``kwargs``); ``retry``
    calls again (another LLM step), ``judge`` asks the judge (one too)."""
    journal = ctx.state.gates
    g = ctx.guards.g
    if not g.gate:
        if step_id not in journal:
            bypassed: dict[str, Any] = {
                "key": step_id,
                "by": g.gate_bypass_by,
                "reason": g.gate_bypass_reason or "gate disabled at start",
            }
            if g.gate_bypass_note is not None:
                bypassed["note"] = g.gate_bypass_note  # a name the client gave, beside "by"
            ctx.journal(EventKind.CONFIDENCE_GATE_BYPASSED, step_id, None, bypassed)
        return Verdict(None, True, body)
    seen = journal.get(step_id)
    if seen is not None:
        score, passed = seen.get("score"), bool(seen.get("passed"))
    else:
        score = await _score(gate, body, kwargs, judge)
        passed = score is not None and score >= gate.threshold
        ctx.journal(
            EventKind.CONFIDENCE_EVALUATED,
            step_id,
            None,
            {
                "key": step_id,
                "score": score,
                "threshold": gate.threshold,
                "passed": passed,
                "source": gate.source,
            },
        )
    if passed or gate.on_below == "branch":
        return Verdict(score, passed, body)
    if gate.on_below == "retry" and not retried:
        assert gate.retry_model is not None
        again = {**kwargs, "model": gate.retry_model}
        retry_id, retry_body = await retry(again)
        return await apply(ctx, gate, retry_id, retry_body, again, retry, judge, True)
    what = (
        f"step {step_id}: confidence {score if score is not None else 'unknown'} from "
        f"{gate.source} is below the gate's threshold {gate.threshold:g}"
    )
    if gate.on_below == "approval":
        decision = await approval(
            ctx,
            f"gate:{step_id}",
            {
                "question": "take this answer?",
                "step_id": step_id,
                "score": score,
                "threshold": gate.threshold,
                "source": gate.source,
            },
            None,
        )
        if decision.approved:
            key = f"override:{step_id}"
            if key not in journal:
                ctx.journal(
                    EventKind.CONFIDENCE_GATE_BYPASSED,
                    step_id,
                    None,
                    {
                        "key": key,
                        "by": decision.by,
                        "reason": decision.comment or "approved below the threshold",
                    },
                )
            return Verdict(score, False, body)
        raise GateRejected(f"{what}; {decision.by} rejected the answer")
    raise GateRejected(what)


async def _score(
    gate: Gate, body: dict[str, Any], kwargs: dict[str, Any], judge: Judge
) -> float | None:
    if gate.source == "logprobs":
        return logprob_score(body)
    if gate.source == "judge":
        request = json.dumps(
            {k: kwargs[k] for k in ("messages", "input", "system") if k in kwargs},
            ensure_ascii=False,
        )
        prompt = (gate.judge_prompt or JUDGE_PROMPT).format(
            request=request, answer=answer_text(body)
        )
        _, judged = await judge(gate.judge_model or str(kwargs.get("model")), prompt)
        return judge_score(answer_text(judged))
    return field_score(body, gate.source.removeprefix("field:"))
