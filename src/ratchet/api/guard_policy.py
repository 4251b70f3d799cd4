"""What a start's guard overrides may do with a token's scopes.

A run's guards are the workflow's (its ``guards=``, a graph's ``guards:``) with the
start's overrides applied. Tightening them (a lower limit or budget, an action that acts
harder) is any writer's to ask for; raising a limit, switching one off (``null``), making
an action milder or turning the confidence gate off needs the ``admin`` scope. Who turned
the gate off is the token, not the body: ``gate_bypass_by`` is journaled as the token's
name (:func:`ratchet.api.auth.decider`), and a name the client gave is kept as
``gate_bypass_note``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ratchet.api.auth import allows, decider
from ratchet.app import Ratchet
from ratchet.engine.guards import DEFAULT, Guards
from ratchet.errors import InvalidInput
from ratchet.model import GuardAction
from ratchet.store import Store
from ratchet.store.tokens import Token
from ratchet.web.errors import ApiError

# Limits where a lower number acts sooner; None switches one off (the loosest).
_LOWER_IS_TIGHTER = (
    "runaway_repeats",
    "max_steps",
    "retry_storm_run",
    "retry_storm_workflow",
    "spike_factor",
    "spike_history",
    "budget_tokens",
    "budget_usd",
    "budget_steps",
    "budget_wall_s",
    "pause_timeout_s",
    "timeout_s",
)
_SEVERITY: dict[str, int] = {GuardAction.RECORD: 0, GuardAction.PAUSE: 1, GuardAction.FAIL: 2}


def loosened(base: Guards, overrides: Mapping[str, Any]) -> list[str]:
    """The fields of ``overrides`` (checked JSON form) that would loosen ``base``."""
    out = []
    for name in _LOWER_IS_TIGHTER:
        if name in overrides:
            new, cur = overrides[name], getattr(base, name)
            if cur is not None and (new is None or new > cur):
                out.append(name)
    if "retry_window_s" in overrides and overrides["retry_window_s"] < base.retry_window_s:
        out.append("retry_window_s")  # a shorter window counts fewer retries
    for kind, action in (overrides.get("actions") or {}).items():
        if _SEVERITY[action] < _SEVERITY[base.action(kind)]:
            out.append(f"actions.{kind}")
    if overrides.get("gate") is False and base.gate:
        out.append("gate")
    return out


async def base_guards(app: Ratchet, store: Store, workflow: str) -> Guards:
    """The guards a run of ``workflow`` has before its overrides (an unknown workflow:
    the defaults; its start is refused on its own)."""
    wd = app.workflows.get(workflow)
    if wd is not None and workflow not in app.graphs:
        return wd.guards or DEFAULT
    stored = await store.get_graph(workflow)
    if stored is None:
        return DEFAULT
    try:
        return Guards.from_json(stored.definition.get("guards"))
    except InvalidInput:
        return DEFAULT


async def authorised(
    app: Ratchet,
    store: Store,
    token: Token,
    workflow: str,
    overrides: Mapping[str, Any] | None,
    field: str = "guards",
) -> dict[str, Any] | None:
    """``overrides`` as the run is to be started with them by ``token``: refused 403 when
    they loosen the workflow's guards and the token lacks admin; ``gate_bypass_by`` set to
    the token (a client's own kept as ``gate_bypass_note``). Malformed overrides are
    passed on as they are, for the start to refuse them naming the problem."""
    if overrides is None:
        return None
    out = dict(overrides)
    if out.get("gate") is False or "gate_bypass_by" in out:
        given = out.get("gate_bypass_by")
        out["gate_bypass_by"] = decider(token)
        if isinstance(given, str) and given != out["gate_bypass_by"]:
            out.setdefault("gate_bypass_note", given)
    if allows(token, "admin"):
        return out
    from ratchet.engine.guards import check_overrides

    try:
        checked = check_overrides(out)
    except InvalidInput:
        return out
    wider = loosened(await base_guards(app, store, workflow), checked)
    if wider:
        raise ApiError(
            403,
            f"{field}: raising or switching off {', '.join(wider)} needs the "
            "admin scope (a runs:write token may only tighten guards)",
            details={"needed": "admin", "fields": wider},
        )
    return out
