"""Runs in the store: starting them (one, a batch, a child), reading and counting them,
and locking their rows in the order every transaction follows.

Lock order: a run's parent's ``runs`` row, then the run's, then its lease row
(``run_locks``). A transaction that needs several takes them in that order, so two never
wait on each other.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from ratchet.errors import BatchItemInvalid, StoreConflict, UnknownRun
from ratchet.model import (
    GENESIS_HASH,
    DeadLetter,
    Event,
    EventKind,
    Lease,
    NewRun,
    RunRecord,
    RunStatus,
    dumps,
)
from ratchet.store.bus import READY
from ratchet.store.dialect import Dialect
from ratchet.store.idempotency import check_in_batch, check_repeat
from ratchet.store.journal import insert_events
from ratchet.store.leases import check_lease
from ratchet.store.rows import dead_letter_from_row, event_params, record_from_row
from ratchet.store.transaction import Tx

__all__ = [
    "RunFilters",
    "create_runs",
    "insert_batch",
    "insert_run",
    "locked_run",
    "locked_run_and_parent",
    "queued_payload",
    "start_child",
    "tags_param",
]


def queued_payload(new: NewRun) -> dict[str, Any]:
    """The payload of a new run's first ``run_queued``."""
    payload: dict[str, Any] = {"workflow": new.workflow, "version": new.workflow_version}
    if new.guards:
        payload["guards"] = new.guards
    if new.tags:
        payload["tags"] = new.tags
    return payload


def _run_params(new: NewRun) -> dict[str, Any]:
    return {
        "run_id": new.run_id,
        "workflow": new.workflow,
        "workflow_version": new.workflow_version,
        "input": dumps(new.input),
        "parent_run_id": new.parent_run_id,
        "parent_step_id": new.parent_step_id,
        "queue": new.queue,
        "priority": new.priority,
        "tenant_id": new.tenant_id,
        "tags": dumps(new.tags),
        "concurrency_key": new.concurrency_key,
    }


def insert_run(d: Dialect, tx: Tx, new: NewRun) -> tuple[RunRecord, bool]:
    """Within ``tx``: write the run and its ``run_queued`` event unless its id exists;
    the run as stored, and whether this wrote it."""
    created = tx.run("run_insert", _run_params(new)) == 1
    if created:
        ev = Event.chain(
            new.run_id,
            1,
            EventKind.RUN_QUEUED,
            None,
            None,
            queued_payload(new),
            time.time(),
            GENESIS_HASH,
        )
        tx.send("event_insert", event_params(ev))
        d._journaled(tx, new.run_id)
        d._announce(tx, READY)
    row = tx.one("run_get", {"run_id": new.run_id})
    return record_from_row(row), created


async def create_run(d: Dialect, new: NewRun) -> tuple[RunRecord, bool]:
    """One run, in its own transaction (see :func:`insert_run`)."""
    return await d._run(lambda tx: insert_run(d, tx, new))


async def create_runs(
    d: Dialect, news: Sequence[NewRun], redact: bool = False
) -> list[tuple[str, RunStatus, bool]]:
    """Many top-level runs in one transaction (see ``Store.create_runs``)."""
    first: dict[str, int] = {}
    for i, new in enumerate(news):
        if new.parent_run_id is not None:
            raise BatchItemInvalid(i, "run_id", "a batch starts top-level runs only")
        j = first.setdefault(new.run_id, i)
        if j != i:
            check_repeat(news[j], new, j, i)
    unique = [news[i] for i in first.values()]
    found = await d._run(lambda tx: _insert_runs(d, tx, unique, redact))
    created = {run_id for run_id, (_, fresh) in found.items() if fresh}
    return [
        (n.run_id, found[n.run_id][0], n.run_id in created and first[n.run_id] == i)
        for i, n in enumerate(news)
    ]


def _insert_runs(
    d: Dialect, tx: Tx, news: list[NewRun], redact: bool = False
) -> dict[str, tuple[RunStatus, bool]]:
    index = {n.run_id: i for i, n in enumerate(news)}
    found: dict[str, tuple[RunStatus, bool]] = {}

    def check_existing(ids: list[str]) -> None:
        for row in tx.all("runs_get_many", {"ids": d._ids(ids)}):
            rec = record_from_row(row)
            check_in_batch(rec, news[index[rec.run_id]], index[rec.run_id], redact)
            found[rec.run_id] = (rec.status, False)

    check_existing(list(index))
    fresh = [n for n in news if n.run_id not in found]
    if fresh:
        now = time.time()
        rows, events = [], []
        for n in fresh:
            ev = Event.chain(
                n.run_id, 1, EventKind.RUN_QUEUED, None, None, queued_payload(n), now, GENESIS_HASH
            )
            rows.append(_run_params(n) | {"parent_run_id": None, "parent_step_id": None})
            events.append(event_params(ev))
        inserted = d._insert_batch(tx, rows, events)
        for run_id in inserted:
            found[run_id] = (RunStatus.QUEUED, True)
        raced = [n.run_id for n in fresh if n.run_id not in found]
        if raced:
            # Started concurrently by another transaction, committed after this one's
            # first look: the inserts skipped them, and a fresh read sees them now.
            check_existing(raced)
        if inserted:
            d._announce(tx, READY)
    return found


def insert_batch(
    d: Dialect, tx: Tx, runs: list[dict[str, Any]], events: list[dict[str, Any]]
) -> list[str]:
    """Insert ``runs`` (skipping ids that exist) and, for those inserted, their events
    (in the same order); return the ids inserted. A dialect may do it in one statement
    (PostgreSQL); this form holds the write lock throughout (SQLite's BEGIN IMMEDIATE),
    so no other writer can insert one of these ids meanwhile."""
    if tx.many("run_insert", runs) != len(runs):
        raise StoreConflict(
            "a run of the batch was inserted by another writer while this one held the write lock"
        )
    tx.send_many("event_insert", events)
    for row in runs:
        d._journaled(tx, row["run_id"])
    return [row["run_id"] for row in runs]


async def start_child(
    d: Dialect, lease: Lease, events: Sequence[Event], child: NewRun
) -> RunRecord:
    """Append the parent's events and create the child run, in one transaction."""

    def body(tx: Tx) -> RunRecord:
        check_lease(tx, lease)
        insert_events(d, tx, events)
        return insert_run(d, tx, child)[0]

    return await d._run(body)


async def get_run(d: Dialect, run_id: str) -> RunRecord | None:
    """The run, or None."""
    row = await d._read(lambda tx: tx.one("run_get", {"run_id": run_id}))
    return record_from_row(row) if row else None


def tags_param(tags: Mapping[str, str]) -> str:
    """A tag filter as the ``*_tagged`` queries take it: a JSON object."""
    return dumps(dict(tags))


class RunFilters(TypedDict, total=False):
    """What a listing of runs may be narrowed to, beside a status."""

    workflow: str | None  # a workflow's name
    tags: Mapping[str, str] | None  # every one of these tags


async def list_runs(
    d: Dialect,
    status: str | None = None,
    limit: int = 100,
    *,
    workflow: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> list[RunRecord]:
    """The most recent runs (with ``status``, of ``workflow``, with all of ``tags``, if
    given)."""
    # A tag filter has queries of its own, which find the tagged runs along an index
    # first (see runs_filter_tagged).
    params = {"status": status, "workflow": workflow, "limit": limit}
    if tags:
        params["tags"] = tags_param(tags)
        rows = await d._read(lambda tx: tx.all("runs_filter_tagged", params))
    elif workflow is not None:
        rows = await d._read(lambda tx: tx.all("runs_filter", params))
    elif status is None:
        rows = await d._read(lambda tx: tx.all("runs_list", {"limit": limit}))
    else:
        rows = await d._read(lambda tx: tx.all("runs_list_status", params))
    return [record_from_row(r) for r in rows]


async def count_runs(
    d: Dialect,
    status: str | None = None,
    *,
    workflow: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> int:
    """How many runs there are (with ``status``, of ``workflow``, with all of ``tags``, if
    given)."""
    params: dict[str, Any] = {"status": status, "workflow": workflow}
    if tags:
        params["tags"] = tags_param(tags)
        row = await d._read(lambda tx: tx.one("runs_count_tagged", params))
    elif workflow is not None:
        row = await d._read(lambda tx: tx.one("runs_count_filter", params))
    elif status is None:
        row = await d._read(lambda tx: tx.one("runs_count", {}))
    else:
        row = await d._read(lambda tx: tx.one("runs_count_by_status", {"status": status}))
    return int(row[0])


async def finished_among(d: Dialect, run_ids: Sequence[str]) -> list[str]:
    """Those of ``run_ids`` that have reached a terminal status."""
    ids = d._ids(run_ids)
    rows = await d._read(lambda tx: tx.all("runs_finished", {"ids": ids}))
    return [r["run_id"] for r in rows]


async def dead_letters(d: Dialect, limit: int = 100) -> list[DeadLetter]:
    """The dead-letter queue, most recent first."""
    rows = await d._read(lambda tx: tx.all("dead_letters_list", {"limit": limit}))
    return [dead_letter_from_row(r) for r in rows]


async def count_dead_letters(d: Dialect) -> int:
    """How many runs are in the dead-letter queue."""
    return int((await d._read(lambda tx: tx.one("dead_letters_count", {})))[0])


def locked_run(tx: Tx, run_id: str) -> RunRecord:
    """Within ``tx``: lock the run's row and read it; :class:`UnknownRun` if none."""
    row = tx.one("run_get_locked", {"run_id": run_id})
    if row is None:
        raise UnknownRun(f"unknown run id {run_id!r}")
    return record_from_row(row)


def locked_run_and_parent(tx: Tx, run_id: str) -> RunRecord:
    """Lock a run's row, after its parent's when it has one. A run ending wakes its
    parent; the parent parks holding its own row lock while it reads the child's status.
    Holding the parent's row across the child's end makes the two take turns: either the
    parent sees the child ended, or the end sees the parent waiting and wakes it."""
    row = tx.one("run_get", {"run_id": run_id})
    if row is None:
        raise UnknownRun(f"unknown run id {run_id!r}")
    parent = record_from_row(row).parent_run_id
    if parent is not None:
        tx.one("run_get_locked", {"run_id": parent})  # ancestors before descendants
    return locked_run(tx, run_id)
