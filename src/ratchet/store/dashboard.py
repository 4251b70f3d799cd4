"""The dashboard's reads: the list page's, each confined to one tenant like those of
:mod:`ratchet.store.tokens`, and a journal as the waterfall reads it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ratchet.model import Event
from ratchet.store.dialect import Dialect


async def status_counts(store: Dialect, tenant: str) -> dict[str, int]:
    rows = await store._read(lambda tx: tx.all("ui_status_counts", {"tenant_id": tenant}))
    return {r["status"]: int(r["n"]) for r in rows}


async def runs_changed(store: Dialect, tenant: str) -> tuple[str, float] | None:
    """The tenant's run that changed last and when (None: it has no runs): the live
    list's probe, one index seek. Deleting runs other than that one is not seen here."""
    row = await store._read(lambda tx: tx.one("ui_runs_changed", {"tenant_id": tenant}))
    return None if row is None else (str(row["run_id"]), float(row["changed"]))


async def dead_lettered(store: Dialect, run_id: str) -> bool:
    """Whether the run has a dead-letter row: what a retry needs."""
    row = await store._read(lambda tx: tx.one("ui_dead_lettered", {"run_id": run_id}))
    return int(row["n"]) > 0


async def step_counts(store: Dialect, run_ids: Sequence[str]) -> dict[str, int]:
    ids = {"ids": store._ids(list(run_ids))}
    rows = await store._read(lambda tx: tx.all("ui_step_counts", ids))
    return {r["run_id"]: int(r["steps"]) for r in rows}


async def timeline_events(store: Dialect, run_id: str, upto: int | None = None) -> list[Event]:
    """A run's events up to seq ``upto`` (all when None) in one query, with the payloads
    :func:`ratchet.api.timeline.waterfall` and the run's story (:mod:`ratchet.model.story`)
    read (of a ``step_started``, only its ``kind`` and ``child_run_id``) and ``{}`` for the
    others; unhashed (a view, never a journal to verify
    or replay)."""
    params = {"run_id": run_id, "upto": 2**62 if upto is None else upto}
    rows = await store._read(lambda tx: tx.all("ui_timeline_events", params))
    return [
        Event(
            run_id,
            r["seq"],
            r["kind"],
            r["step_id"],
            r["attempt"],
            _payload(r),
            float(r["at"]),
            "",
            "",
        )
        for r in rows
    ]


def _payload(row: Any) -> dict[str, Any]:
    if row["payload"] is not None:
        return dict(json.loads(row["payload"]))
    fields = (("kind", row["step_kind"]), ("child_run_id", row["child_run_id"]))
    return {k: v for k, v in fields if v is not None}
