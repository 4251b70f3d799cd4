"""The dashboard's reads: the list page's, each confined to one tenant like those of
:mod:`ratchet.store.tokens`, and a journal as the waterfall reads it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ratchet.model import Event

if TYPE_CHECKING:
    from ratchet.store.base import Store


async def status_counts(store: Store, tenant: str) -> dict[str, int]:
    rows = await store._read(lambda tx: tx.all("ui_status_counts", {"tenant_id": tenant}))
    return {r["status"]: int(r["n"]) for r in rows}


async def runs_changed(store: Store, tenant: str) -> tuple[int, float | None]:
    """How many runs the tenant has and when one last changed: the live list's probe."""
    row = await store._read(lambda tx: tx.one("ui_runs_changed", {"tenant_id": tenant}))
    return int(row["n"]), None if row["changed"] is None else float(row["changed"])


async def step_counts(store: Store, run_ids: Sequence[str]) -> dict[str, int]:
    ids = {"ids": store._ids(list(run_ids))}
    rows = await store._read(lambda tx: tx.all("ui_step_counts", ids))
    return {r["run_id"]: int(r["steps"]) for r in rows}


async def timeline_events(store: Store, run_id: str, upto: int | None = None) -> list[Event]:
    """A run's events up to seq ``upto`` (all when None) in one query, with the payloads
    :func:`ratchet.timeline.waterfall` reads and ``{}`` for the others; unhashed (a view,
    never a journal to verify or replay)."""
    params = {"run_id": run_id, "upto": 2**62 if upto is None else upto}
    rows = await store._read(lambda tx: tx.all("ui_timeline_events", params))
    return [Event(run_id, int(r["seq"]), r["kind"], r["step_id"], r["attempt"],
                  json.loads(r["payload"]) if r["payload"] is not None else {},
                  float(r["at"]), "", "") for r in rows]
