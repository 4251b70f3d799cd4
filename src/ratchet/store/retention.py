"""Signed run receipts and journal retention: what receipts and ``ratchet prune`` ask of the
store. Each function is one transaction.

Pruning a run goes in three steps, so that no transaction holds locks for long: mark the
run (``pruned_at``, only if its receipt covers its whole journal), delete its journal a few
hundred events per transaction, then note the journal gone (``journal_pruned``). A prune
interrupted in between is finished by the next one (:func:`pruning_runs`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ratchet.store.dialect import Dialect
from ratchet.store.transaction import Tx


@dataclass(frozen=True, slots=True)
class StoredRunReceipt:
    """A row of ``run_receipts``: the signed envelope over the journal up to ``seq``."""

    run_id: str
    seq: int
    key_id: str
    envelope: dict[str, Any]
    signed_at: float


@dataclass(frozen=True, slots=True)
class PruneCandidate:
    """A finished run past the cutoff: the seq its receipt covers (None: unsigned) and its
    journal's last seq (None: no journal)."""

    run_id: str
    receipt_seq: int | None
    last_seq: int | None

    @property
    def covered(self) -> bool:
        return self.receipt_seq is not None and self.receipt_seq == self.last_seq


def receipt_params(run_id: str, seq: int, key_id: str, envelope: dict[str, Any]) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "seq": seq,
        "key_id": key_id,
        "envelope": json.dumps(envelope, separators=(",", ":"), sort_keys=True),
    }


def put_receipt_in(tx: Tx, params: dict[str, Any]) -> None:
    """Within ``tx``: store a receipt unless one over a longer journal is there already."""
    tx.send("run_receipt_put", params)


async def put_receipt(
    store: Dialect, run_id: str, seq: int, key_id: str, envelope: dict[str, Any]
) -> StoredRunReceipt:
    """Store a run receipt (unless a newer one is there) and return the one stored."""
    params = receipt_params(run_id, seq, key_id, envelope)

    def body(tx: Tx) -> Any:
        tx.run("run_receipt_put", params)
        return tx.one("run_receipt_get", {"run_id": run_id})

    return _receipt(await store._run(body))


async def get_receipt(store: Dialect, run_id: str) -> StoredRunReceipt | None:
    row = await store._read(lambda tx: tx.one("run_receipt_get", {"run_id": run_id}))
    return _receipt(row) if row else None


def _receipt(row: Any) -> StoredRunReceipt:
    return StoredRunReceipt(
        row["run_id"],
        int(row["seq"]),
        row["key_id"],
        json.loads(row["envelope"]),
        float(row["signed_at"]),
    )


async def pruned_at(store: Dialect, run_id: str) -> float | None:
    """When pruning of the run's journal began, or None (never, or no such run)."""
    row = await store._read(lambda tx: tx.one("run_pruned_at", {"run_id": run_id}))
    return None if row is None or row["pruned_at"] is None else float(row["pruned_at"])


def _statuses(store: Dialect, statuses: Sequence[str]) -> Any:
    return store._ids(list(statuses))


async def prune_candidates(
    store: Dialect, before: float, statuses: Sequence[str], limit: int
) -> list[PruneCandidate]:
    """Up to ``limit`` runs finished (with one of ``statuses``) before ``before`` and not yet
    pruned, oldest first."""
    params = {"before": before, "statuses": _statuses(store, statuses), "limit": limit}
    rows = await store._read(lambda tx: tx.all("prune_candidates", params))
    return [
        PruneCandidate(
            r["run_id"],
            None if r["receipt_seq"] is None else int(r["receipt_seq"]),
            None if r["last_seq"] is None else int(r["last_seq"]),
        )
        for r in rows
    ]


async def prune_count(store: Dialect, before: float, statuses: Sequence[str]) -> tuple[int, int]:
    """How many runs :func:`prune_candidates` would give in all, and their events."""
    params = {"before": before, "statuses": _statuses(store, statuses)}
    row = await store._read(lambda tx: tx.one("prune_count", params))
    return int(row["runs"]), int(row["events"] or 0)


async def mark_pruned(store: Dialect, run_ids: Sequence[str]) -> list[str]:
    """Mark the runs whose receipt covers their whole journal as being pruned, and drop
    their dead letters (a pruned run cannot be retried). Returns the runs marked."""

    def body(tx: Tx) -> list[str]:
        marked = [r["run_id"] for r in tx.all("prune_mark", {"ids": store._ids(run_ids)})]
        if marked:
            tx.send("prune_dead_letters", {"ids": store._ids(marked)})
        return marked

    return await store._run(body)


async def pruning_runs(store: Dialect, limit: int) -> list[str]:
    """Runs marked for pruning whose journal is not all deleted yet."""
    rows = await store._read(lambda tx: tx.all("prune_in_progress", {"limit": limit}))
    return [r["run_id"] for r in rows]


async def delete_events(store: Dialect, run_ids: Sequence[str], limit: int) -> int:
    """Delete up to ``limit`` journal events of the runs; returns how many went."""
    params = {"ids": store._ids(run_ids), "limit": limit}
    return await store._run(lambda tx: tx.run("prune_events", params))


async def journals_gone(store: Dialect, run_ids: Sequence[str]) -> None:
    params = {"ids": store._ids(run_ids)}
    await store._run(lambda tx: tx.send("prune_done", params))
