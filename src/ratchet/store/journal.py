"""The journal in the store: appends (fenced by the lease, or by the run's locked row for
writers without one) and reads.

A journal is a chain: each event carries the hash of the one before it, and ``seq`` grows
by one per event with no gaps, so a reader that tails a journal (``events_load`` after the
last seq it saw) never skips an event. A transaction that appends wakes the run's tails
once it commits (:meth:`Dialect._journaled`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ratchet.errors import LeaseLost
from ratchet.model import GENESIS_HASH, Event, Lease
from ratchet.store.dialect import Dialect
from ratchet.store.leases import check_lease
from ratchet.store.rows import event_params, events_from_rows
from ratchet.store.transaction import Tx

__all__ = [
    "append",
    "append_unowned",
    "heads",
    "insert_events",
    "load_events",
    "load_requests",
]


def insert_events(d: Dialect, tx: Tx, events: Sequence[Event]) -> None:
    """Within ``tx``: insert ``events`` (the caller has checked the lease)."""
    for run_id in {e.run_id for e in events}:
        d._journaled(tx, run_id)
    if len(events) == 1:
        tx.send("event_insert", event_params(events[0]))
    elif events:
        tx.send_many("event_insert", [event_params(e) for e in events])


def append_unowned(d: Dialect, tx: Tx, run_id: str, kind: str, payload: dict[str, Any]) -> Event:
    """Append for a writer without the lease; the caller holds the run's lease row
    locked (or fenced), so no holder can append concurrently."""
    last = tx.one("event_last", {"run_id": run_id})
    seq, prev = (last["seq"], last["hash"]) if last else (0, GENESIS_HASH)
    ev = Event.chain(run_id, seq + 1, kind, None, None, payload, time.time(), prev)
    tx.send("event_insert", event_params(ev))
    d._journaled(tx, run_id)
    return ev


async def append(d: Dialect, lease: Lease, events: Sequence[Event]) -> None:
    """Append events under the lease: all land, or LeaseLost and none do."""
    if not events:
        return await d._run(check_lease, lease)
    holder = {"worker_id": lease.worker_id, "epoch": lease.epoch}
    rows = [event_params(e) | holder for e in events]

    def body(tx: Tx) -> None:
        # One statement per event checks the lease and inserts; fewer rows than events
        # means the lease was lost, and the transaction rolls back.
        inserted = (
            tx.run("event_insert_leased", rows[0])
            if len(rows) == 1
            else tx.many("event_insert_leased", rows)
        )
        if inserted != len(rows):
            raise LeaseLost(lease.run_id)
        d._journaled(tx, lease.run_id)

    await d._run(body)


async def load_events(d: Dialect, run_id: str, after: int = 0, limit: int = -1) -> list[Event]:
    """A run's journal after ``after``, in one query."""
    if limit < 0:
        limit = 2**62
    params = {"run_id": run_id, "after": after, "limit": limit}
    rows = await d._read(lambda tx: tx.all("events_load", params))
    return events_from_rows(rows, d.json_text_canonical)


async def load_requests(d: Dialect, run_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The model requests the run journaled and the drifts journaled of them, in seq order:
    ``(kind, step id, request or payload)``, in one query."""
    rows = await d._read(lambda tx: tx.all("requests_load", {"run_id": run_id}))
    return [(r["kind"], r["step_id"], json.loads(r["data"])) for r in rows]


async def heads(d: Dialect, run_ids: Sequence[str]) -> dict[str, int]:
    """The last seq of each run's journal (runs without events are left out)."""
    params = {"ids": d._ids(run_ids)}
    rows = await d._read(lambda tx: tx.all("events_heads", params))
    return {r["run_id"]: int(r["seq"]) for r in rows}
