"""What the guards read across runs: retries of a workflow's recent runs, and the model
calls of its last finished runs (for anomaly baselines), summed from their journals.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ratchet.model import LLMTotals
from ratchet.store.dialect import Dialect

__all__ = ["llm_history", "llm_totals", "recent_retries"]


async def recent_retries(d: Dialect, workflow: str, window_s: float) -> int:
    """How many retries the runs of ``workflow`` journaled within the last ``window_s``."""
    params = {"workflow": workflow, "window_s": window_s}
    row = await d._read(lambda tx: tx.one("guard_retries_recent", params))
    return int(row["n"]) if row else 0


async def llm_history(
    d: Dialect, workflow: str, limit: int
) -> list[tuple[str, str | None, dict[str, Any] | None]]:
    """The LLM calls of the last ``limit`` finished runs of ``workflow``."""
    params = {"workflow": workflow, "limit": limit}
    rows = await d._read(lambda tx: tx.all("guard_llm_history", params))
    return [(r["run_id"], r["step_id"], json.loads(r["llm"]) if r["llm"] else None) for r in rows]


async def llm_totals(d: Dialect, run_ids: Sequence[str]) -> dict[str, LLMTotals]:
    """The model calls of each run, summed (runs without any are left out)."""
    params = {"ids": d._ids(list(run_ids))}
    rows = await d._read(lambda tx: tx.all("llm_calls_of_runs", params))
    totals: dict[str, LLMTotals] = {}
    for r in rows:
        totals.setdefault(r["run_id"], LLMTotals()).add(json.loads(r["llm"]))
    return totals
