"""Guards: the thresholds that catch a pathological run, the budgets that stop its spend,
and what to do when one trips.

A workflow declares its :class:`Guards` (``@app.workflow(guards=ratchet.Guards(...))``, or
``guards:`` in a graph file); a run may override any field at start (``app.start(...,
guards={...})``, ``ratchet start --guards``, ``"guards"`` in ``POST /v1/runs``). The
overrides are journaled in the run's ``run_queued`` event, so every drive of the run, on
any worker, applies the same guards. The JSON form uses the field names below; ``null``
switches a threshold or budget off.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ratchet.errors import InvalidInput
from ratchet.model import AnomalyKind, GuardAction
from ratchet.names import quote

# The anomalies a guard journals (``anomaly_detected {kind, ...}``), and the budget kind.
BUDGET = AnomalyKind.BUDGET_EXCEEDED
ANOMALIES = tuple(k for k in AnomalyKind if k != BUDGET)
ACTIONS = tuple(GuardAction)
# A run is judged by what it repeats, not by how long it is: a run that makes the same call
# with the same arguments and gets the same answer ``runaway_repeats`` times in a row is a
# loop nobody will stop otherwise, and fails; a batch loop of distinct steps runs on, up to
# ``max_steps``, the hard cap for what repetition cannot see (it fails too). Everything
# else is journaled and the run goes on, unless a workflow says otherwise.
DEFAULT_ACTIONS: Mapping[str, str] = {
    AnomalyKind.RUNAWAY_LOOP: GuardAction.FAIL,
    AnomalyKind.EXCESSIVE_STEPS: GuardAction.FAIL,
    BUDGET: GuardAction.FAIL,
}

_INTS = (
    "runaway_repeats",
    "max_steps",
    "retry_storm_run",
    "retry_storm_workflow",
    "spike_history",
    "budget_tokens",
    "budget_steps",
)
_FLOATS = (
    "retry_window_s",
    "spike_factor",
    "budget_usd",
    "budget_wall_s",
    "pause_timeout_s",
    "timeout_s",
)
# The limits a person may move for one run (a grant: approving a guard's pause, or retrying
# a dead-lettered run), each to a new value or to null (off).
LIMITS = ("budget_tokens", "budget_usd", "budget_steps", "budget_wall_s", "max_steps", "timeout_s")
# A budget's name in anomaly_detected (``budget``), and the field that holds its limit.
BUDGET_FIELDS: Mapping[str, str] = {
    "tokens": "budget_tokens",
    "usd": "budget_usd",
    "steps": "budget_steps",
    "wall_s": "budget_wall_s",
}


@dataclass(frozen=True, slots=True)
class Guards:
    """A workflow's guards. Each threshold may be ``None`` (off).

    * ``runaway_repeats``: the same step or tool, with the same arguments and the same
      result, this many times in a row is a ``runaway_loop`` (a graph loop that reaches its
      ``max_iterations`` is one too): default 10, and the run fails;
    * ``max_steps``: a run with more steps is ``excessive_steps``: default 10,000, a hard
      cap well above a batch loop's length (a loop over 1,200 items is no anomaly; a loop
      that repeats itself is caught by ``runaway_repeats`` long before);
    * ``retry_storm_run``: more retries than this in one run within ``retry_window_s``, or
      ``retry_storm_workflow``: more than this a minute across all runs of the workflow
      (counted in the database, across workers), is a ``retry_storm``;
    * ``spike_factor`` / ``spike_history``: a run's cost, or one LLM step's tokens, more
      than ``spike_factor`` times the median of the last ``spike_history`` finished runs of
      the workflow (of the same step) is a ``cost_spike`` / ``token_spike``; none is
      declared before that many runs exist;
    * ``budget_tokens``, ``budget_usd``, ``budget_steps``, ``budget_wall_s``: hard limits
      per run, checked before each step and, for tokens and money, before each LLM call
      with its ``max_tokens`` as the worst case, so a call that would cross is never sent.
      Calls in flight count with their worst case (reserved before each is sent), so
      parallel calls together stay within the budget. With the ``fail`` action,
      ``budget_wall_s`` is the run's deadline, as ``timeout_s`` is;
    * ``timeout_s``: the run's deadline, in seconds from its first start: past it the run
      fails with :class:`~ratchet.RunTimeout` (dead-letter reason ``timeout``) wherever it
      is, in a step or parked on a signal, an approval, a sleep or a child run (its
      unfinished children are cancelled). ``@app.workflow(timeout_s=...)`` and
      ``app.start(..., timeout_s=...)`` set it;
    * ``actions``: what each kind does when it trips: ``record`` (journal it and go on),
      ``pause`` (park on an approval "continue?"), ``fail`` (the run fails with the kind as
      its code). Defaults: ``fail`` for ``runaway_loop``, ``excessive_steps`` and
      ``budget_exceeded``, ``record`` for the others;
    * ``pause_timeout_s``: how long a ``pause`` waits for its decision (``None``: for
      ever); past it the guard falls back to ``fail``;
    * ``gate``: ``False`` runs the workflow's confidence gates as passed, journaling
      ``confidence_gate_bypassed`` with ``gate_bypass_by`` and ``gate_bypass_reason``
      (and ``gate_bypass_note``: over the HTTP API ``gate_bypass_by`` is the starting
      token's name, and a name the client gave is kept as this note).
    """

    runaway_repeats: int | None = 10
    max_steps: int | None = 10_000
    retry_storm_run: int | None = 10
    retry_window_s: float = 60.0
    retry_storm_workflow: int | None = 100
    spike_factor: float | None = 5.0
    spike_history: int = 50
    budget_tokens: int | None = None
    budget_usd: float | None = None
    budget_steps: int | None = None
    budget_wall_s: float | None = None
    actions: Mapping[str, str] = field(default_factory=dict)
    pause_timeout_s: float | None = None
    gate: bool = True
    gate_bypass_by: str | None = None
    gate_bypass_reason: str | None = None
    gate_bypass_note: str | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise InvalidInput("invalid guards: " + "; ".join(problems))
        object.__setattr__(self, "actions", dict(self.actions))

    def action(self, kind: str) -> str:
        """What ``kind`` does when it trips."""
        return self.actions.get(kind) or DEFAULT_ACTIONS.get(kind, GuardAction.RECORD)

    def override(self, changes: Mapping[str, Any] | None) -> Guards:
        """These guards with ``changes`` (the JSON form, validated) applied; actions merge."""
        if not changes:
            return self
        checked = check_overrides(changes)
        actions = {**self.actions, **checked.pop("actions", {})}
        return dataclasses.replace(self, **checked, actions=actions)

    @staticmethod
    def from_json(data: Mapping[str, Any] | None, what: str = "guards") -> Guards:
        """Guards from their JSON form (a graph file's ``guards:``)."""
        return DEFAULT.override(check_overrides(data or {}, what))


_FIELDS = frozenset(f.name for f in dataclasses.fields(Guards))


def check_grant(data: Any, what: str = "grant") -> dict[str, Any]:
    """``data`` if it is a valid grant: an object of limits (:data:`LIMITS`) to their new
    values (null: off); else :class:`InvalidInput` naming every problem."""
    if not isinstance(data, Mapping) or not data:
        raise InvalidInput(
            f"invalid {what}: expected an object of limits to new values "
            f"({', '.join(LIMITS)}), got {data!r}"
        )
    unknown = sorted(k for k in data if k not in LIMITS)
    if unknown:
        raise InvalidInput(
            f"invalid {what}: {', '.join(map(repr, unknown))} is not a limit "
            f"a person can grant (limits: {', '.join(LIMITS)})"
        )
    return check_overrides(data, what)


def check_overrides(data: Any, what: str = "guards") -> dict[str, Any]:
    """``data`` if it is a valid JSON form of (some) guard fields, else :class:`InvalidInput`
    naming every problem. Nothing is applied here."""
    if not isinstance(data, Mapping):
        raise InvalidInput(f"invalid {what}: expected an object of guard fields, got {quote(data)}")
    unknown = sorted(set(data) - _FIELDS)
    problems = [f"unknown field {k!r} (known: {', '.join(sorted(_FIELDS))})" for k in unknown]
    if not isinstance(data.get("actions", {}), Mapping):
        problems.append(f"actions must be an object of kind: action, got {quote(data['actions'])}")
    elif not unknown:
        try:
            merged = dataclasses.replace(
                DEFAULT, **{k: v for k, v in data.items() if k != "actions"}
            )
            problems += _problems(merged, data.get("actions", {}))
        except InvalidInput as e:
            problems.append(str(e).removeprefix("invalid guards: "))
    if problems:
        raise InvalidInput(f"invalid {what}: " + "; ".join(problems))
    return {k: (dict(v) if k == "actions" else v) for k, v in data.items()}


def _problems(g: Guards, actions: Any = None) -> list[str]:
    problems = []
    for name in _INTS:
        v = getattr(g, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            problems.append(f"{name} must be an integer >= 1 or null, got {quote(v)}")
    for name in _FLOATS:
        v = getattr(g, name)
        if v is not None and (
            isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0
        ):
            problems.append(f"{name} must be a positive number or null, got {quote(v)}")
    if g.retry_window_s is None:
        problems.append("retry_window_s must be a positive number, got null")
    if g.spike_history is None:
        problems.append("spike_history must be an integer >= 1, got null")
    actions = g.actions if actions is None else actions
    if not isinstance(actions, Mapping):
        problems.append(f"actions must be an object of kind: action, got {quote(actions)}")
    else:
        for kind, action in actions.items():
            if kind not in (*ANOMALIES, BUDGET):
                problems.append(
                    f"actions: unknown kind {kind!r} (known: {', '.join((*ANOMALIES, BUDGET))})"
                )
            elif action not in ACTIONS:
                problems.append(
                    f"actions.{kind} must be one of {', '.join(ACTIONS)}, got {quote(action)}"
                )
    if not isinstance(g.gate, bool):
        problems.append(f"gate must be true or false, got {quote(g.gate)}")
    for name in ("gate_bypass_by", "gate_bypass_reason", "gate_bypass_note"):
        v = getattr(g, name)
        if v is not None and (not isinstance(v, str) or not v or "\x00" in v):
            problems.append(f"{name} must be a non-empty string or null, got {quote(v)}")
    if g.gate is False and g.gate_bypass_by is None:
        problems.append("gate: false needs gate_bypass_by (who switched the gate off)")
    return problems


DEFAULT = Guards()
