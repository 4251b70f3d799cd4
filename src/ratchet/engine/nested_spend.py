"""Model calls made inside a step (an agent's tool, a step that calls a wrapped client):
the run's budgets hold for them as for the workflow's own calls.

Such a call is not a step of its own (step bodies run at least once, and a step inside a
step has no place in the journal), so it reserves and counts in memory, on the drive:
before it is sent, its worst case is checked against the run's token and USD budgets
together with what the journal holds (spend, and the reservations of the workflow's calls
in flight) and with the other calls inside steps of this drive, in flight or answered but
not yet journaled (:meth:`RunGuards.nested_call`). A call over a budget is not sent: under
``fail`` (and ``pause``, which cannot ask a person from inside a step) the step ends with
:class:`GuardTripped` and the run fails as at a step boundary; under ``record`` the anomaly
is journaled once and the call goes on.

What the calls spent is journaled with the step's end (``llm`` of its ``step_completed``,
``step_failed`` or ``step_retrying``: the calls' usage and cost summed, with ``calls`` and
``nested``), in the commit the step makes anyway, so run totals, later budget checks and
replays read it from the journal. A step whose worker dies before its end loses that record
(its body runs again). A call whose outcome is unknown (the connection dropped after it was
sent) keeps its reservation until its step ends.

Cost when no step calls a model: a dictionary lookup per step end.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratchet.engine.drive import Drive

_USAGE = (
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


@dataclass(slots=True)
class _Ledger:
    """One drive's calls inside steps: reserved (by handle: step, tokens, USD) and answered
    but not yet journaled (by step: their llm metas)."""

    held: dict[object, tuple[str, int, float]] = field(default_factory=dict)
    done: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def totals(self) -> tuple[int, float]:
        tokens = sum(t for _, t, _ in self.held.values())
        usd = sum(u for _, _, u in self.held.values())
        for metas in self.done.values():
            for meta in metas:
                usage = meta.get("usage") or {}
                tokens += int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
                cost = meta.get("cost_usd")
                usd += cost if isinstance(cost, int | float) else 0.0
        return tokens, usd


# Keyed by the drive itself: a ledger lives as long as its drive.
_LEDGERS: weakref.WeakKeyDictionary[object, _Ledger] = weakref.WeakKeyDictionary()


def reserve(ctx: Drive, step_id: str, worst: tuple[int, float | None] | None) -> object | None:
    """Check a call inside step ``step_id`` against the run's budgets and hold its worst
    case (``worst``: tokens, USD or None); a handle for :func:`answered`. Raises
    :class:`GuardTripped` when the call must not be sent. No budget: nothing is held."""
    if worst is None:
        return None
    ledger = _LEDGERS.get(ctx)
    if ledger is None:
        ledger = _LEDGERS[ctx] = _Ledger()
    tokens, usd = worst
    held_tokens, held_usd = ledger.totals()
    ctx.guards.nested_call(step_id, tokens, usd, held_tokens, held_usd)
    handle = object()
    ledger.held[handle] = (step_id, tokens, usd or 0.0)
    return handle


def needs_check(ctx: Drive) -> bool:
    """Whether the run has a token or USD budget (a call's worst case is worth working out)."""
    g = ctx.guards.g
    return g.budget_tokens is not None or g.budget_usd is not None


def answered(ctx: object, step_id: str, handle: object | None, meta: dict[str, Any] | None) -> None:
    """The call was answered (``meta``: its usage and cost) or failed with the provider's
    answer (None): its reservation ends, its spend waits for the step's end."""
    ledger = _LEDGERS.get(ctx)
    if ledger is None:
        ledger = _LEDGERS[ctx] = _Ledger()
    if handle is not None:
        ledger.held.pop(handle, None)
    if meta is not None:
        ledger.done.setdefault(step_id, []).append(meta)


def step_ended(ctx: object, step_id: str) -> dict[str, Any] | None:
    """The step's attempt ends: its calls' spend summed (the ``llm`` of its end event), or
    None; what they held is let go."""
    ledger = _LEDGERS.get(ctx)
    if ledger is None:
        return None
    if ledger.held:
        for handle in [h for h, (s, _, _) in ledger.held.items() if s == step_id]:
            del ledger.held[handle]
    metas = ledger.done.pop(step_id, None)
    return summed(metas) if metas else None


def with_nested_spend(ctx: object, step_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` (a step's ``step_failed`` or ``step_retrying``) with the spend of the
    model calls made inside the attempt, if any, as its ``llm``."""
    nested = step_ended(ctx, step_id)
    if nested is not None:
        payload["llm"] = nested
    return payload


def summed(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """The llm meta of several calls: usage and cost summed, ``calls`` how many, and
    ``unpriced_calls`` those whose model has no price (not in ``cost_usd``)."""
    usage = dict.fromkeys(_USAGE, 0)
    cost, unpriced = 0.0, 0
    for meta in metas:
        for k, v in (meta.get("usage") or {}).items():
            usage[k] = usage.get(k, 0) + int(v or 0)
        c = meta.get("cost_usd")
        if isinstance(c, int | float):
            cost += c
        else:
            unpriced += 1
    models = {m.get("model") for m in metas}
    providers = {m.get("provider") for m in metas}
    out: dict[str, Any] = {
        "provider": providers.pop() if len(providers) == 1 else None,
        "model": models.pop() if len(models) == 1 else None,
        "usage": usage,
        "cost_usd": round(cost, 10) if unpriced < len(metas) else None,
        "calls": len(metas),
        "nested": True,
    }
    if unpriced:
        out["unpriced_calls"] = unpriced
    return out
