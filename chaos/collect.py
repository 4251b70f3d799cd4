"""Read what a campaign left in its database into :class:`chaos.check.Evidence`.

Plain SQL over the tables, read-only, outside the engine: the checks must not trust the
code they check to tell them what happened.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg

from chaos.check import Evidence, LockRow, ReceiptRow, RunRow, waiting_items
from ratchet.model import Event, dumps


def _queries(url: str) -> dict[str, str]:
    """The evidence queries, reading times as Unix seconds and JSON as text. On PostgreSQL
    those columns are timestamptz and jsonb, converted here; an event written before its
    migration 005 may keep the text it was hashed with in payload_text."""
    pg = not url.startswith("sqlite:///")

    def seconds(column: str) -> str:
        return f"extract(epoch FROM {column})::float8" if pg else column

    def text(column: str) -> str:
        return f"{column}::text" if pg else column

    # The payload's text, and whether it is the text the event was hashed with: SQLite's
    # is; jsonb keeps its own spacing and key order, except in payload_text.
    payload = (
        "coalesce(payload_text, payload::text), payload_text IS NOT NULL" if pg else "payload, 1"
    )
    return {
        "runs": (
            f"SELECT run_id, status, waiting_for, {seconds('not_before')}, error, "
            "workflow, parent_run_id FROM runs"
        ),
        "events": (
            f"SELECT run_id, seq, kind, step_id, attempt, {seconds('at')}, prev_hash, "
            f"hash, {payload} FROM journal_events ORDER BY run_id, seq"
        ),
        "receipts": (
            "SELECT idempotency_key, run_id, step_id, status, epoch, "
            f"{text('response')}, delivery, attempt FROM side_effect_receipts"
        ),
        # A finished run's lease row is gone; runs.lease_epoch keeps its last epoch.
        "locks": (
            "SELECT r.run_id, l.worker_id, coalesce(l.epoch, r.lease_epoch), "
            f"coalesce({seconds('l.expires_at')}, 0) FROM runs r "
            "LEFT JOIN run_locks l ON l.run_id = r.run_id "
            "WHERE l.run_id IS NOT NULL OR r.lease_epoch > 0"
        ),
    }


SIGNALS = "SELECT run_id, name FROM signals WHERE consumed_seq IS NULL"
STATUS = "SELECT status, count(*) FROM runs GROUP BY status"


def _rows(url: str, sql: str) -> list[Any]:
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url[len("sqlite:///") :], timeout=60)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    with psycopg.connect(url, connect_timeout=10) as pg:
        return pg.execute(sql).fetchall()


def journal_size(url: str) -> int:
    """How many events the journal holds now (it grows while any run makes progress)."""
    return int(_rows(url, "SELECT count(*) FROM journal_events")[0][0])


def status_counts(url: str) -> Counter[str]:
    """How many runs are in each status now."""
    return Counter({status: int(n) for status, n in _rows(url, STATUS)})


def waiting_for_signals(url: str) -> list[tuple[str, str]]:
    """``(run, signal name)`` for each signal a parked run waits for."""
    rows = _rows(
        url,
        "SELECT run_id, waiting_for FROM runs WHERE status = 'waiting' "
        "AND waiting_for LIKE '%signal:%'",
    )
    return [
        (run_id, item.partition(":")[2])
        for run_id, waiting_for in rows
        for item in waiting_items(waiting_for)
        if item.startswith("signal:")
    ]


def busy(url: str, run_ids: Iterable[str]) -> list[str]:
    """Those of ``run_ids`` that are running with a step in flight (their last journal
    event starts one), or waiting on a child run."""
    ids = sorted(set(run_ids))
    if not ids:
        return []
    marks = ", ".join(f"'{i}'" for i in ids)  # campaign run ids: letters, digits, '-'
    sql = (
        "SELECT r.run_id, r.status, r.waiting_for, e.kind FROM runs r "
        "JOIN journal_events e ON e.run_id = r.run_id AND e.seq = "
        "(SELECT max(seq) FROM journal_events WHERE run_id = r.run_id) "
        f"WHERE r.run_id IN ({marks})"
    )
    return [
        run_id
        for run_id, status, waiting_for, kind in _rows(url, sql)
        if (status == "running" and kind == "step_started")
        or (status == "waiting" and (waiting_for or "").startswith("child:"))
    ]


def evidence(
    url: str,
    submitted: list[str],
    arrivals: list[dict[str, Any]],
    now: float,
    max_attempts: dict[str, int],
    **more: Any,
) -> Evidence:
    """Everything the checks read, from the database at ``url`` and the receiver's log;
    ``more`` are what the campaign itself knows (see :class:`Evidence`)."""
    q = _queries(url)
    runs = {r[0]: RunRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in _rows(url, q["runs"])}
    events: dict[str, list[Event]] = {}
    for r in _rows(url, q["events"]):
        payload = json.loads(r[8])
        events.setdefault(r[0], []).append(
            Event(
                r[0],
                int(r[1]),
                r[2],
                r[3],
                r[4],
                payload,
                float(r[5]),
                r[6],
                r[7],
                r[8] if r[9] else dumps(payload),
            )
        )
    receipts = [
        ReceiptRow(
            r[0],
            r[1],
            r[2],
            r[3],
            int(r[4]),
            json.loads(r[5]) if r[5] is not None else None,
            r[6],
            int(r[7]) if r[7] is not None else None,
        )
        for r in _rows(url, q["receipts"])
    ]
    locks = {r[0]: LockRow(r[0], r[1], int(r[2]), float(r[3])) for r in _rows(url, q["locks"])}
    pending: dict[str, set[str]] = {}
    for run_id, name in _rows(url, SIGNALS):
        pending.setdefault(run_id, set()).add(name)
    integrity = None
    if url.startswith("sqlite:///"):
        integrity = "; ".join(str(r[0]) for r in _rows(url, "PRAGMA integrity_check"))
    return Evidence(
        submitted=submitted,
        runs=runs,
        events=events,
        receipts=receipts,
        locks=locks,
        pending_signals=pending,
        arrivals=arrivals,
        now=now,
        max_attempts=max_attempts,
        integrity=integrity,
        **more,
    )


# -- worker logs -----------------------------------------------------------------------------

_LEASE_LOST_WRITE = re.compile(r"action=lease_lost run_id=\S+ epoch=")
_LEASE_LOST_RENEW = re.compile(r"action=lease_lost run_id=\S+\s*$")


def log_figures(paths: Iterable[Path]) -> dict[str, int]:
    """Counts from the workers' logs: refused stale writes (a write under a lease that had
    moved on, refused by the store: ``action=lease_lost ... epoch=``), drives fenced off by a
    renewal before they wrote, storage errors, disk-full errors, tracebacks."""
    counts: Counter[str] = Counter()
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            if "action=lease_lost" in line:
                if _LEASE_LOST_WRITE.search(line):
                    counts["stale_writes_refused"] += 1
                elif _LEASE_LOST_RENEW.search(line):
                    counts["fenced_on_renewal"] += 1
            elif "action=drive_error" in line:
                counts["drives_abandoned_on_error"] += 1
            elif "action=run_failed" in line:
                counts["runs_failed_logged"] += 1
            elif "action=worker_started" in line:
                counts["worker_starts"] += 1
            if "disk is full" in line:
                counts["disk_full_errors"] += 1
            if line.startswith("Traceback"):
                counts["tracebacks"] += 1
    return dict(counts)
