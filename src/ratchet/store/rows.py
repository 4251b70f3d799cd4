"""Rows as the model's values, and the model's values as query parameters.

Rows are read by column name (sqlite3.Row; a name-indexable tuple on PostgreSQL): one
mapping per row shape, so a query may add or reorder columns without breaking its readers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ratchet.model import DeadLetter, DeliveryReceipt, Event, RunRecord, RunStatus, dumps

__all__ = [
    "dead_letter_from_row",
    "event_from_row",
    "event_params",
    "events_from_rows",
    "receipt_from_row",
    "record_from_row",
]


def record_from_row(row: Any) -> RunRecord:
    """A ``runs`` row (the columns of ``run_get``) as a :class:`RunRecord`."""
    output = row["output"]
    return RunRecord(
        run_id=row["run_id"],
        workflow=row["workflow"],
        workflow_version=row["workflow_version"],
        input=json.loads(row["input"]),
        status=RunStatus(row["status"]),
        output=json.loads(output) if output is not None else None,
        error=row["error"],
        parent_run_id=row["parent_run_id"],
        parent_step_id=row["parent_step_id"],
        queue=row["queue"],
        priority=row["priority"],
        not_before=row["not_before"],
        waiting_for=row["waiting_for"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        tenant_id=row["tenant_id"],
        tags=json.loads(row["tags"]),
        forked_from=row["forked_from"],
        forked_at=row["forked_at"],
        concurrency_key=row["concurrency_key"],
    )


def event_from_row(row: Any, canonical: bool = True) -> Event:
    """A ``journal_events`` row as an :class:`Event`. ``canonical``: the stored payload text
    is the canonical text the event was hashed with. Otherwise (jsonb, which keeps its own
    spacing and key order) the event carries no text, and :meth:`Event.verify` makes the
    canonical one from the value when asked (reading a journal does not pay for it), unless
    the row says its text is the one hashed (``payload_exact``: kept from before jsonb)."""
    text = row["payload"]
    # jsonb gives objects back with its own key order (shorter keys first); a replay must
    # see a step's output exactly as its first run did (canonical JSON: sorted keys), or
    # code that serialises it (a prompt, a request body) would differ between drives.
    payload = json.loads(text) if canonical else json.loads(text, object_pairs_hook=_sorted)
    return Event(
        row["run_id"],
        row["seq"],
        row["kind"],
        row["step_id"],
        row["attempt"],
        payload,
        row["at"],
        row["prev_hash"],
        row["hash"],
        text if canonical or row["payload_exact"] else "",
    )


def events_from_rows(rows: Sequence[Any], canonical: bool = True) -> list[Event]:
    """Rows of ``journal_events`` as events (see :func:`event_from_row`). A replay reads
    thousands: their payloads are decoded by one parse of a JSON array holding them all,
    which gives the same values as a parse of each and saves a decoder call per event."""
    if not rows:
        return []
    array = "[" + ",".join([r["payload"] for r in rows]) + "]"
    payloads = json.loads(array) if canonical else json.loads(array, object_pairs_hook=_sorted)
    if len(payloads) != len(rows):  # a stored text that is not one JSON value
        return [event_from_row(r, canonical) for r in rows]
    # events_load's columns, by position (both dialects give them in this order).
    return [
        Event(
            run_id,
            seq,
            kind,
            step_id,
            attempt,
            payload,
            at,
            prev_hash,
            hash_,
            text if canonical or exact else "",
        )
        for (
            run_id,
            seq,
            kind,
            step_id,
            attempt,
            text,
            exact,
            at,
            prev_hash,
            hash_,
        ), payload in zip(rows, payloads, strict=True)
    ]


def _sorted(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    pairs.sort(key=lambda kv: kv[0])
    return dict(pairs)


def event_params(ev: Event) -> dict[str, Any]:
    """An event as the parameters of ``event_insert``."""
    return {
        "run_id": ev.run_id,
        "seq": ev.seq,
        "kind": ev.kind,
        "step_id": ev.step_id,
        "attempt": ev.attempt,
        "payload": ev.payload_json or dumps(ev.payload),
        "at": ev.at,
        "prev_hash": ev.prev_hash,
        "hash": ev.hash,
    }


def receipt_from_row(row: Any) -> DeliveryReceipt:
    """A ``receipts`` row (a delivery's receipt) as a :class:`DeliveryReceipt`."""
    response = row["response"]
    return DeliveryReceipt(
        row["idempotency_key"],
        row["run_id"],
        row["step_id"],
        row["status"],
        json.loads(response) if response is not None else None,
        row["claimed_at"],
        row["settled_at"],
        row["delivery"],
        row["attempt"],
        row["settled_by"],
    )


def dead_letter_from_row(row: Any) -> DeadLetter:
    """A ``dead_letters`` row (joined with its run's workflow) as a :class:`DeadLetter`."""
    return DeadLetter(row["run_id"], row["workflow"], row["reason"], row["error"], row["at"])
