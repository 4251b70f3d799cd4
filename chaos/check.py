"""The invariants of docs/concepts/invariants.md, checked after a campaign from what it
left behind.

The evidence is plain data (:class:`Evidence`): the rows of ``runs``, ``journal_events``,
``side_effect_receipts``, ``run_locks`` and ``signals`` as the database holds them once
the faults have healed, and the receiver's own log of arrivals. Each check takes the
evidence and returns violations; nothing here talks to a database, so the checks can be
tried on hand-made journals (tests/test_chaos_check.py).

The checks:

``lost``        every submitted run, and every child run, is terminal or visibly waiting on
                something that has not come yet (invariant 8);
``failure``     no run failed for a reason the campaign does not expect, and none was
                cancelled unless the campaign cancelled it or one of its ancestors;
``journal``     seq is gapless from 1, each event chains to the one before and its hash
                matches its content; exactly one terminal event, the last, agreeing with
                the run's status (invariant 5);
``completion``  at most one ``step_completed`` per step, and never a ``step_started``
                after it (invariant 3);
``receiver``    the receiver applied each key once, and got one key per delivery of a step
                (several per step, retried steps included); every arrival was claimed by a
                receipt first, of the run and step it names; what a receipt and a step
                recorded is what the receiver answered (invariant 7);
``branches``    a drive that let its run go (it parked, and a fresh claim drove it next)
                had no step attempt in flight: a branch beside a wait is journaled before
                the run parks, and never runs again;
``cancel``      a cancelled run has one ``run_cancelled`` and no step starts after it; a
                child run ends once its parent has ended (a cancel reaches children);
``versions``    runs of a workflow only version-2 workers have were driven by those workers
                alone (drive markers' worker ids), and no run failed as "not registered";
``starts``      a run started by several callers at once under one explicit id is one
                run, every caller got that id back, and a differing start under it was
                refused with RunIdConflict;
``fencing``     nothing written under a stale lease (invariant 4), see below;
``storage``     the database file passes its own integrity check (SQLite);
``keys``        every attempt's key is sha256(run|step|attempt); a re-driven attempt reuses
                its key; attempts only move on after a journaled failure and stay within the
                step's budget (invariant 6). Each delivery of a step has one receipt, under
                the key of the attempt that claimed it: that attempt's own key for the first
                unnamed delivery (``#1``), sha256("<attempt key>|<delivery>") for the others.

Fencing. Events carry no epoch, but drives do: each drive begins with ``run_started`` or
``run_resumed`` carrying its lease epoch, and a drive re-executes the workflow from the top,
so every event it writes falls between its marker and the next drive's. A zombie's write
that slipped past the fence after a steal would land inside a later drive's segment, and
shows as one of: an attempt's outcome (``step_completed``, ``step_retrying``,
``step_failed``) without that attempt's ``step_started`` earlier in the same segment; a
drive marker whose epoch is not above the previous one, or whose drive number repeats;
events before the first marker; a receipt written at an epoch no drive of the run held, or
above the epoch of the drive that completed its step.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.recovery import recoveries
from ratchet.model import (
    GENESIS_HASH,
    TAKEOVERS,
    TERMINAL_EVENTS,
    Event,
    EventKind,
    idempotency_key,
)

TERMINAL_STATUSES = {"succeeded", "failed", "cancelled"}
DRIVE_MARKERS = {EventKind.RUN_STARTED, EventKind.RUN_RESUMED}
ATTEMPT_OUTCOMES = {EventKind.STEP_COMPLETED, EventKind.STEP_RETRYING, EventKind.STEP_FAILED}


@dataclass(frozen=True, slots=True)
class RunRow:
    """A row of ``runs`` (the columns the checks read)."""

    run_id: str
    status: str
    waiting_for: str | None = None
    not_before: float | None = None
    error: str | None = None
    workflow: str | None = None
    parent_run_id: str | None = None


@dataclass(frozen=True, slots=True)
class DupStart:
    """A run started by several callers at once under one explicit run id: what each
    caller got back (the id, or ``Type: message``), and what a start under the same id
    with another input got (``RunIdConflict: ...`` expected)."""

    run_id: str
    results: list[str]
    conflict: str | None = None


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    """A row of ``side_effect_receipts``."""

    key: str
    run_id: str
    step_id: str
    status: str
    epoch: int
    response: Any = None
    delivery: str = "#1"
    attempt: int | None = None  # the attempt that first claimed it


def delivery_key(run_id: str, step_id: str, attempt: int, delivery: str) -> str:
    """The key a delivery claimed by ``attempt`` is sent under (written out here rather
    than imported: the checks do not trust the code they check)."""
    key = idempotency_key(run_id, step_id, attempt)
    if delivery == "#1":
        return key
    return hashlib.sha256(f"{key}|{delivery}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class LockRow:
    """A row of ``run_locks``."""

    run_id: str
    worker_id: str | None
    epoch: int
    expires_at: float


@dataclass(slots=True)
class Evidence:
    """Everything a campaign left behind, as plain data."""

    submitted: list[str]
    runs: dict[str, RunRow]
    events: dict[str, list[Event]]
    receipts: list[ReceiptRow] = field(default_factory=list)
    locks: dict[str, LockRow] = field(default_factory=dict)
    pending_signals: dict[str, set[str]] = field(default_factory=dict)
    arrivals: list[dict[str, Any]] = field(default_factory=list)
    now: float = 0.0
    # Attempts allowed per step name (a step id's part after the ordinal).
    max_attempts: dict[str, int] = field(default_factory=dict)
    # A timer this far past due at collection time was missed, not merely pending.
    timer_grace_s: float = 10.0
    # Errors (substrings) a run may legitimately fail with; any other failure is a violation.
    expected_failures: tuple[str, ...] = ()
    # The database's own consistency check (SQLite: PRAGMA integrity_check), when run.
    integrity: str | None = None
    # Starts of one attempt after which the engine fails its step as a crash loop.
    crash_loop_starts: int = 5
    # Deliveries each sending step name makes; its output holds their answers, in order.
    deliveries_per_step: dict[str, int] = field(default_factory=lambda: {"send": 1})
    # Runs the campaign asked to cancel, and when (runner's clock, Unix seconds).
    cancel_requested: dict[str, float] = field(default_factory=dict)
    # Workflows only version-2 workers register, and the ids those workers ran under.
    v2_only: tuple[str, ...] = ()
    v2_workers: set[str] = field(default_factory=set)
    # Runs started by several callers at once.
    dup_starts: dict[str, DupStart] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: which check, which run, what was seen."""

    check: str
    run_id: str | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "run_id": self.run_id, "detail": self.detail}


@dataclass(slots=True)
class Findings:
    """The violations found, and the figures the checks counted on the way."""

    violations: list[Violation] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


# -- 1. lost runs ----------------------------------------------------------------------------


def check_lost(ev: Evidence) -> tuple[dict[str, Any], list[Violation]]:
    """Every submitted run and every child run is terminal or visibly waiting on something
    still to come; none failed unexpectedly or was cancelled unasked."""
    out: list[Violation] = []
    statuses: Counter[str] = Counter()
    failed: list[dict[str, Any]] = []
    lost = waiting = crash_loops = 0
    children = sorted(r.run_id for r in ev.runs.values() if r.parent_run_id)
    child_statuses: Counter[str] = Counter()
    for run_id in [*ev.submitted, *children]:
        row = ev.runs.get(run_id)
        counts = child_statuses if row is not None and row.parent_run_id else statuses
        problem = None
        if row is None:
            problem = "accepted run missing from the database"
            counts["missing"] += 1
        else:
            counts[row.status] += 1
            if row.status in ("queued", "running"):
                problem = f"stuck {row.status} after the faults healed"
            elif row.status == "waiting":
                problem = _waiting_problem(ev, row)
                waiting += problem is None
            elif row.status == "failed":
                failed.append({"run_id": run_id, "error": row.error})
                loop = crash_loop(ev.events.get(run_id, []), ev.crash_loop_starts)
                if loop is not None:
                    crash_loops += 1
                    if loop:
                        out.append(Violation("failure", run_id, loop))
                elif not _failure_explained(ev, row):
                    out.append(
                        Violation(
                            "failure",
                            run_id,
                            f"failed for no reason the campaign expects: {row.error}",
                        )
                    )
            elif row.status == "cancelled" and not _cancel_asked(ev, run_id):
                out.append(Violation("failure", run_id, "cancelled, though nobody asked"))
        if problem is not None:
            lost += 1
            out.append(Violation("lost", run_id, problem))
    terminal = sum(statuses[s] for s in TERMINAL_STATUSES)
    figures = {
        "submitted": len(ev.submitted),
        "terminal": terminal,
        "succeeded": statuses["succeeded"],
        "failed": statuses["failed"],
        "cancelled": statuses["cancelled"],
        "waiting_visibly": waiting,
        "lost": lost,
        "crash_loops": crash_loops,
        "children": dict(sorted(child_statuses.items())),
        "failed_runs": failed,
    }
    return figures, out


def crash_loop(events: Sequence[Event], starts: int) -> str | None:
    """None if the run did not fail as a crash loop; else "" when the journal bears the
    verdict out (the attempt, in flight, was taken over ``starts`` times from a drive that
    never came back: a sweep or a reclaim found it started), or what is wrong with it.
    Drives after a hand-back or a storage failure do not count."""
    failed = next(
        (
            e
            for e in reversed(events)
            if e.kind == EventKind.STEP_FAILED and e.payload.get("error_type") == "StepCrashLoop"
        ),
        None,
    )
    if failed is None:
        return None
    attempt = (failed.step_id, failed.attempt)
    in_flight = taken_over = 0
    for e in events:
        if e.seq >= failed.seq:
            break
        if _attempted(e) and (e.step_id, e.attempt) == attempt:
            in_flight = 1
        elif (
            e.kind in (EventKind.STEP_COMPLETED, EventKind.STEP_FAILED, EventKind.STEP_RETRYING)
            and (e.step_id, e.attempt) == attempt
        ):
            in_flight = 0
        elif e.kind == EventKind.RUN_RESUMED and e.payload.get("reason") in TAKEOVERS:
            taken_over += in_flight
    if taken_over < starts:
        return (
            f"failed as a crash loop of {failed.step_id} attempt {failed.attempt}, but "
            f"the journal shows it taken over in flight {taken_over} times, not {starts}"
        )
    return ""


def sandboxes_exhausted(events: Sequence[Event]) -> bool:
    """An isolated run failed after its three sandboxes all ended unfinished (the fleet's
    kills and the campaign's sandbox kills took them)."""
    last = events[-1] if events else None
    return (
        last is not None
        and last.kind == EventKind.RUN_FAILED
        and last.payload.get("code") == "sandbox_resume_exhausted"
        and last.payload.get("attempts") == 3
    )


def _ancestry(ev: Evidence, run_id: str) -> list[str]:
    """``run_id`` and its ancestors, nearest first."""
    out = [run_id]
    row = ev.runs.get(run_id)
    while row is not None and row.parent_run_id and row.parent_run_id not in out:
        out.append(row.parent_run_id)
        row = ev.runs.get(row.parent_run_id)
    return out


def _cancel_asked(ev: Evidence, run_id: str) -> bool:
    """The campaign cancelled the run or an ancestor, or its parent ended: a run's end
    cancels its unfinished children (the parent's own end is judged on its own row)."""
    if any(r in ev.cancel_requested for r in _ancestry(ev, run_id)):
        return True
    row = ev.runs.get(run_id)
    parent = ev.runs.get(row.parent_run_id) if row and row.parent_run_id else None
    return parent is not None and parent.status in TERMINAL_STATUSES


def _failure_explained(ev: Evidence, row: RunRow, depth: int = 0) -> bool:
    """The run failed for a reason the campaign expects, or because a child it awaited
    failed for one: a crash loop the child's journal bears out counts (a wrong crash-loop
    verdict is reported on the child itself)."""
    error = row.error or ""
    if any(x in error for x in ev.expected_failures):
        return True
    if sandboxes_exhausted(ev.events.get(row.run_id, [])):
        return True
    if depth > 16:
        return False
    for child in ev.runs.values():
        if child.parent_run_id != row.run_id or child.status != "failed":
            continue
        if f"child run {child.run_id} " not in error:
            continue
        loop = crash_loop(ev.events.get(child.run_id, []), ev.crash_loop_starts)
        if loop is not None or _failure_explained(ev, child, depth + 1):
            return True
    return False


def _waiting_problem(ev: Evidence, row: RunRow) -> str | None:
    if not row.waiting_for:
        return "waiting with nothing named in waiting_for"
    for waiting_for in waiting_items(row.waiting_for):
        kind, _, name = waiting_for.partition(":")
        if kind == "signal" and name in ev.pending_signals.get(row.run_id, set()):
            return f"waiting for signal {name!r} although it was sent (a lost wake-up)"
        if kind in ("sleep", "backoff") and (
            row.not_before is None or row.not_before < ev.now - ev.timer_grace_s
        ):
            return (
                f"waiting on {waiting_for} whose timer was due at {row.not_before} "
                f"(now {ev.now:.3f}): the timer never fired"
            )
    return None


def waiting_items(waiting_for: str) -> list[str]:
    """What a parked run waits for: ``signal:go``, or each of ``any:["signal:go", ...]``
    (several branches parked together)."""
    if waiting_for.startswith("any:"):
        try:
            items = json.loads(waiting_for[4:])
        except ValueError:
            return [waiting_for]
        return [str(x) for x in items] if isinstance(items, list) else [waiting_for]
    return [waiting_for]


# -- 2. the journal's shape ------------------------------------------------------------------


def check_journal(run_id: str, events: Sequence[Event], row: RunRow | None) -> list[Violation]:
    """seq 1..N, the hash chain, one terminal event (the last) agreeing with the status."""
    out: list[Violation] = []

    def bad(detail: str) -> None:
        out.append(Violation("journal", run_id, detail))

    if not events:
        bad("no journal events")
        return out
    seqs = [e.seq for e in events]
    if seqs != list(range(1, len(events) + 1)):
        gaps = sorted(set(range(1, max(seqs) + 1)) - set(seqs))
        dups = [s for s, n in Counter(seqs).items() if n > 1]
        bad(f"seq not gapless from 1: missing {gaps[:5]} repeated {dups[:5]}")
    prev = GENESIS_HASH
    for e in events:
        if e.prev_hash != prev:
            bad(f"event {e.seq} ({e.kind}) does not chain to the event before it")
            break
        if not e.verify():
            bad(f"event {e.seq} ({e.kind}): hash does not match its content")
            break
        prev = e.hash
    if events[0].kind != EventKind.RUN_QUEUED:
        bad(f"first event is {events[0].kind}, not run_queued")
    terminal = [e for e in events if e.kind in TERMINAL_EVENTS]
    status = row.status if row is not None else None
    if status in TERMINAL_STATUSES:
        if len(terminal) != 1:
            bad(f"{len(terminal)} terminal events: {[(e.seq, e.kind) for e in terminal]}")
        elif events[-1] is not terminal[0]:
            bad(
                f"events after the terminal one (seq {terminal[0].seq}): "
                f"{[(e.seq, e.kind) for e in events if e.seq > terminal[0].seq][:5]}"
            )
        if terminal and str(TERMINAL_EVENTS[EventKind(terminal[-1].kind)]) != status:
            bad(f"status {status} but terminal event {terminal[-1].kind}")
    elif terminal:
        bad(f"status {status} but terminal events {[(e.seq, e.kind) for e in terminal]}")
    return out


# -- 3. completions --------------------------------------------------------------------------


def check_completions(run_id: str, events: Sequence[Event]) -> tuple[int, list[Violation]]:
    """At most one step_completed per step; nothing starts a completed step again.
    Returns the number of surplus completions and the violations."""
    out: list[Violation] = []
    completed: Counter[str] = Counter()
    surplus = 0
    for e in events:
        if e.step_id is None:
            continue
        if e.kind == EventKind.STEP_COMPLETED:
            completed[e.step_id] += 1
            if completed[e.step_id] > 1:
                surplus += 1
                out.append(
                    Violation(
                        "completion", run_id, f"step {e.step_id} completed again at seq {e.seq}"
                    )
                )
        elif e.kind == EventKind.STEP_STARTED and completed[e.step_id]:
            out.append(
                Violation(
                    "completion",
                    run_id,
                    f"step {e.step_id} started again at seq {e.seq} after it completed",
                )
            )
    return surplus, out


# -- 5. fencing ------------------------------------------------------------------------------


def segments(events: Sequence[Event]) -> list[tuple[Event | None, list[Event]]]:
    """The journal cut at drive markers: (marker, events up to the next marker). The first
    segment's marker is None (the events before any drive)."""
    out: list[tuple[Event | None, list[Event]]] = [(None, [])]
    for e in events:
        if e.kind in DRIVE_MARKERS:
            out.append((e, []))
        else:
            out[-1][1].append(e)
    return out


def _attempted(e: Event) -> bool:
    # A step attempt is announced by a step_started carrying its key (sleeps, signal
    # waits and child runs are journaled without one).
    return e.kind == EventKind.STEP_STARTED and "idempotency_key" in e.payload


def check_fencing(
    run_id: str, events: Sequence[Event], receipts: Iterable[ReceiptRow], lock: LockRow | None
) -> list[Violation]:
    """No journal, receipt or terminal write from a drive that no longer held the lease."""
    out: list[Violation] = []

    def bad(detail: str) -> None:
        out.append(Violation("fencing", run_id, detail))

    attempted_steps = {e.step_id for e in events if _attempted(e)}
    segs = segments(events)
    stray = [
        e
        for e in segs[0][1]
        if e.kind != EventKind.RUN_QUEUED
        # A cancel of a run no worker held: written by the store, naming who asked (or
        # "request") and carrying no error, which a worker's own cancel does.
        and not (
            e.kind == EventKind.RUN_CANCELLED and "by" in e.payload and "error" not in e.payload
        )
    ]
    if stray:
        bad(
            f"events written before any drive held the lease: "
            f"{[(e.seq, e.kind) for e in stray][:5]}"
        )
    epochs: list[int] = []
    workers: list[Any] = []
    completed_at_epoch: dict[str, int] = {}
    for n, (marker, body) in enumerate(segs[1:], start=1):
        assert marker is not None
        epoch = int(marker.payload.get("epoch", -1))
        expected_kind = EventKind.RUN_STARTED if n == 1 else EventKind.RUN_RESUMED
        if marker.kind != expected_kind:
            bad(f"drive {n} (seq {marker.seq}) is journaled as {marker.kind}")
        if marker.payload.get("drive") != n:
            bad(
                f"drive marker at seq {marker.seq} says drive {marker.payload.get('drive')}, "
                f"but it is drive {n} of the journal"
            )
        worker = marker.payload.get("worker_id")
        # Every drive holds a newer epoch, even the same worker's drive after a storage
        # failure abandoned its last one (it takes its lease again, one epoch up).
        if epochs and epoch <= epochs[-1]:
            bad(
                f"drive at seq {marker.seq} holds epoch {epoch} ({worker}), not above the "
                f"previous drive's {epochs[-1]} ({workers[-1]}): a stale lease wrote a drive"
            )
        epochs.append(epoch)
        workers.append(worker)
        started: set[tuple[str, int | None]] = set()
        for e in body:
            if _attempted(e):
                started.add((e.step_id or "", e.attempt))
            elif (
                e.kind in ATTEMPT_OUTCOMES
                and e.step_id in attempted_steps
                and (e.step_id, e.attempt) not in started
                # The crash-loop verdict is given at the step boundary, without a start.
                and e.payload.get("error_type") != "StepCrashLoop"
            ):
                bad(
                    f"{e.kind} of {e.step_id} attempt {e.attempt} at seq {e.seq} lands in "
                    f"drive {n} (epoch {epoch}), which never started that attempt: a write "
                    "from an earlier drive after the lease moved on"
                )
            if e.kind == EventKind.STEP_COMPLETED and e.step_id is not None:
                completed_at_epoch.setdefault(e.step_id, epoch)
    known = set(epochs)
    for r in receipts:
        if r.epoch not in known:
            bad(
                f"receipt {r.key[:12]}… of {r.step_id} written at epoch {r.epoch}, which no "
                f"drive of the run held (drives: {sorted(known)})"
            )
        elif r.step_id in completed_at_epoch and r.epoch > completed_at_epoch[r.step_id]:
            bad(
                f"receipt of {r.step_id} written at epoch {r.epoch} after the step completed "
                f"under epoch {completed_at_epoch[r.step_id]}"
            )
    if epochs and (lock is None or lock.epoch < max(epochs)):
        bad(
            f"run_locks epoch {lock.epoch if lock else None} is below the journal's "
            f"highest drive epoch {max(epochs)}"
        )
    return out


# -- 6. keys ---------------------------------------------------------------------------------


def check_keys(
    run_id: str,
    events: Sequence[Event],
    receipts: Iterable[ReceiptRow],
    max_attempts: dict[str, int],
) -> list[Violation]:
    """Keys are sha256(run|step|attempt); a re-drive reuses its attempt's key; a new attempt
    follows a journaled failure of the one before; attempts stay within budget."""
    out: list[Violation] = []

    def bad(detail: str) -> None:
        out.append(Violation("keys", run_id, detail))

    seen: set[tuple[str, int]] = set()
    failed: set[tuple[str, int]] = set()
    keys: dict[str, str] = {}
    for e in events:
        if e.step_id is None or e.attempt is None:
            continue
        at = (e.step_id, e.attempt)
        if e.kind in (EventKind.STEP_RETRYING, EventKind.STEP_FAILED):
            failed.add(at)
        if not _attempted(e):
            continue
        key = e.payload["idempotency_key"]
        want = idempotency_key(run_id, e.step_id, e.attempt)
        if key != want:
            bad(
                f"step {e.step_id} attempt {e.attempt} at seq {e.seq} carries key "
                f"{key[:12]}…, not sha256(run|step|attempt) {want[:12]}…"
            )
        keys[key] = e.step_id
        if at in seen:
            if not e.payload.get("resumed"):
                bad(
                    f"step {e.step_id} attempt {e.attempt} started again at seq {e.seq} "
                    "without being marked as the resumed attempt"
                )
        else:
            if e.payload.get("resumed"):
                bad(
                    f"step {e.step_id} attempt {e.attempt} at seq {e.seq} claims to resume "
                    "an attempt the journal never started"
                )
            if e.attempt > 1 and (e.step_id, e.attempt - 1) not in failed:
                bad(
                    f"step {e.step_id} attempt {e.attempt} at seq {e.seq} without a journaled "
                    f"failure of attempt {e.attempt - 1}"
                )
            seen.add(at)
        name = e.step_id.partition(":")[2]
        budget = max_attempts.get(name)
        if budget is not None and e.attempt > budget:
            bad(f"step {e.step_id} reached attempt {e.attempt}, over its budget of {budget}")
    attempts = {(e.step_id, e.attempt) for e in events if _attempted(e)}
    deliveries: Counter[tuple[str, str]] = Counter()
    for r in receipts:
        deliveries[(r.step_id, r.delivery)] += 1
        if deliveries[(r.step_id, r.delivery)] == 2:
            bad(
                f"delivery {r.delivery} of {r.step_id} has more than one receipt: it was "
                "claimed (and maybe dispatched) under more than one key"
            )
        if r.attempt is None:  # a receipt from before deliveries had identities
            if keys.get(r.key) != r.step_id:
                bad(
                    f"receipt {r.key[:12]}… of {r.step_id} does not carry the key of any "
                    "journaled attempt of that step"
                )
            continue
        if (r.step_id, r.attempt) not in attempts:
            bad(
                f"receipt {r.key[:12]}… of {r.step_id} delivery {r.delivery} was claimed by "
                f"attempt {r.attempt}, which the journal never started"
            )
        want = delivery_key(run_id, r.step_id, r.attempt, r.delivery)
        if r.key != want:
            bad(
                f"receipt {r.key[:12]}… of {r.step_id} delivery {r.delivery} is not the key "
                f"attempt {r.attempt} derives for it ({want[:12]}…)"
            )
    return out


# -- 4. the receiver -------------------------------------------------------------------------


def check_receiver(ev: Evidence) -> tuple[dict[str, Any], list[Violation]]:
    """Each key applied once; every arrival was claimed by a receipt of the run and step it
    names; what the journal and the receipts recorded is what the receiver answered."""
    out: list[Violation] = []
    drive_epochs: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for run_id, events in ev.events.items():
        for e in events:
            if e.kind in DRIVE_MARKERS:
                drive_epochs[run_id].append((e.at, int(e.payload.get("epoch", 0))))
    # A delivery claims its receipt before it dispatches, so every key that reaches the
    # receiver has one; the key names the receipt's run and step (check_keys ties it to an
    # attempt of that step).
    receipt_keys = {r.key: (r.run_id, r.step_id, r.attempt or 0) for r in ev.receipts}
    applied: dict[str, Any] = {}
    applies: Counter[str] = Counter()
    stale = 0
    for a in ev.arrivals:
        key = a["key"]
        if a.get("applied"):
            applies[key] += 1
            applied.setdefault(key, a.get("response"))
        owner = receipt_keys.get(key)
        if owner is None:
            out.append(
                Violation(
                    "receiver",
                    a.get("run") or None,
                    f"arrival {a.get('arrival')} with key {key[:12]}… was "
                    "dispatched without a receipt claiming it",
                )
            )
        elif (a.get("run"), a.get("step")) != owner[:2]:
            out.append(
                Violation(
                    "receiver",
                    owner[0],
                    f"arrival {a.get('arrival')} names run {a.get('run')} step "
                    f"{a.get('step')} but its key is {owner[1]}'s",
                )
            )
        epoch = a.get("epoch")
        if epoch is not None and any(
            at < a["t"] and e > epoch for at, e in drive_epochs.get(a.get("run", ""), ())
        ):
            stale += 1  # a zombie's dispatch: allowed, deduped; its settle is fenced
    double = {k: n for k, n in applies.items() if n > 1}
    for key, n in double.items():
        out.append(
            Violation(
                "receiver", receipt_keys.get(key, ("?",))[0], f"key {key[:12]}… applied {n} times"
            )
        )
    for r in ev.receipts:
        if r.status != "settled":
            continue
        if r.key not in applied:
            out.append(
                Violation(
                    "receiver",
                    r.run_id,
                    f"receipt {r.key[:12]}… of {r.step_id} "
                    "settled, but the receiver never applied its key",
                )
            )
        elif applied[r.key] != r.response:
            out.append(
                Violation(
                    "receiver",
                    r.run_id,
                    f"receipt {r.key[:12]}… of {r.step_id} "
                    f"recorded {r.response!r}; the receiver answered "
                    f"{applied[r.key]!r}",
                )
            )
    # One delivery of a step goes out under one key, whatever retries and re-drives
    # happen: a second key for it means it was claimed, and sent, again.
    keys_by_delivery: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for a in ev.arrivals:
        if a.get("delivery"):
            keys_by_delivery[(a.get("run", ""), a.get("step", ""), a["delivery"])].add(a["key"])
    for (run_id, step_id, delivery), found_keys in sorted(keys_by_delivery.items()):
        if len(found_keys) > 1:
            out.append(
                Violation(
                    "receiver",
                    run_id,
                    f"delivery {delivery} of {step_id} "
                    f"arrived under {len(found_keys)} keys: sent again by a "
                    "later attempt",
                )
            )
    completed_attempt: dict[tuple[str, str], int] = {}
    for run_id, events in ev.events.items():
        for e in events:
            if e.kind != EventKind.STEP_COMPLETED or e.step_id is None:
                continue
            if e.attempt is not None:
                completed_attempt[(run_id, e.step_id)] = e.attempt
            count = ev.deliveries_per_step.get(e.step_id.partition(":")[2])
            if count is None:
                continue
            out += _check_answers(run_id, e, count, receipt_keys, applied)
    reused = sum(
        1
        for r in ev.receipts
        if r.attempt is not None and completed_attempt.get((r.run_id, r.step_id), 0) > r.attempt
    )
    figures = {
        "dispatches": len(ev.arrivals),
        "unique_keys": len({a["key"] for a in ev.arrivals}),
        "applied_keys": len(applied),
        "resends": len(ev.arrivals) - len({a["key"] for a in ev.arrivals}),
        "receiver_double_applies": sum(n - 1 for n in double.values()),
        "stale_epoch_dispatches": stale,
        "receipts": len(ev.receipts),
        "receipts_settled": sum(1 for r in ev.receipts if r.status == "settled"),
        "receipts_reused_by_a_later_attempt": reused,
    }
    return figures, out


def _check_answers(
    run_id: str,
    e: Event,
    count: int,
    receipt_keys: dict[str, tuple[str, str, int]],
    applied: dict[str, Any],
) -> list[Violation]:
    """A sending step's output: ``count`` answers (one bare, several as a list), each the
    receiver's answer to a key of one of the step's own receipts, no key twice."""
    out: list[Violation] = []
    output = e.payload.get("output")
    answers = [output] if count == 1 else output if isinstance(output, list) else None
    if answers is None or len(answers) != count:
        return [
            Violation(
                "receiver", run_id, f"{e.step_id} completed with {output!r}, not {count} answers"
            )
        ]
    seen: set[str] = set()
    for answer in answers:
        key = answer.get("key") if isinstance(answer, dict) else None
        if key is None or receipt_keys.get(key, ("", ""))[:2] != (run_id, e.step_id):
            out.append(
                Violation(
                    "receiver",
                    run_id,
                    f"{e.step_id} completed with {answer!r}, not an answer to one of its own keys",
                )
            )
        elif applied.get(key) != answer:
            out.append(
                Violation(
                    "receiver",
                    run_id,
                    f"{e.step_id} completed with "
                    f"{answer!r}; the receiver answered {applied.get(key)!r}",
                )
            )
        elif key in seen:
            out.append(
                Violation(
                    "receiver",
                    run_id,
                    f"{e.step_id} completed with the answer to key {key[:12]}… twice",
                )
            )
        if key is not None:
            seen.add(key)
    return out


# -- 7. parallel branches -------------------------------------------------------------------


def check_branches(run_id: str, events: Sequence[Event]) -> list[Violation]:
    """A drive that let its run go while it could still write (it parked; the next drive
    is a fresh claim under a higher epoch, not a sweep or a reclaim after a death) had no
    step attempt in flight: the run parks only when every branch waits, so a step running
    beside a wait is journaled first and is not run again by the next drive."""
    out: list[Violation] = []
    drives = [(m, body) for m, body in segments(events)[1:] if m is not None]
    for (marker, body), (following, _) in itertools.pairwise(drives):
        fresh = int(following.payload.get("epoch", -1)) > int(marker.payload.get("epoch", -1))
        if following.payload.get("reason") != "claim" or not fresh:
            continue  # taken over after a death or a storage failure: in flight is fine
        in_flight: dict[tuple[str, int | None], Event] = {}
        for e in body:
            if _attempted(e):
                in_flight[(e.step_id or "", e.attempt)] = e
            elif e.kind in ATTEMPT_OUTCOMES:
                in_flight.pop((e.step_id or "", e.attempt), None)
        for (step_id, attempt), e in sorted(in_flight.items(), key=lambda x: x[1].seq):
            out.append(
                Violation(
                    "branches",
                    run_id,
                    f"drive {marker.payload.get('drive')} let the run go with "
                    f"step {step_id} attempt {attempt} (seq {e.seq}) in flight: "
                    f"drive {following.payload.get('drive')} (seq {following.seq}) "
                    "claimed it afresh",
                )
            )
    return out


# -- 8. cancels ------------------------------------------------------------------------------


def check_cancels(ev: Evidence) -> tuple[dict[str, Any], list[Violation]]:
    """A cancelled run has one run_cancelled, the last event, and no step starts after it;
    a child run is terminal once its parent is. Figures: what became of the runs the
    campaign cancelled, and how long their cancels took."""
    out: list[Violation] = []
    for row in ev.runs.values():
        events = ev.events.get(row.run_id, [])
        cancels = [e for e in events if e.kind == EventKind.RUN_CANCELLED]
        if row.status == "cancelled" and len(cancels) != 1:
            out.append(
                Violation(
                    "cancel", row.run_id, f"cancelled with {len(cancels)} run_cancelled events"
                )
            )
        if cancels:
            after = [
                e for e in events if e.seq > cancels[0].seq and e.kind == EventKind.STEP_STARTED
            ]
            if after:
                out.append(
                    Violation(
                        "cancel",
                        row.run_id,
                        f"step {after[0].step_id} started "
                        f"at seq {after[0].seq}, after run_cancelled at seq "
                        f"{cancels[0].seq}",
                    )
                )
        parent = ev.runs.get(row.parent_run_id) if row.parent_run_id else None
        if (
            parent is not None
            and parent.status in TERMINAL_STATUSES
            and row.status not in TERMINAL_STATUSES
        ):
            out.append(
                Violation(
                    "cancel",
                    row.run_id,
                    f"child run left {row.status} after "
                    f"its parent {parent.run_id} ended {parent.status}",
                )
            )
    outcomes: Counter[str] = Counter()
    latency: list[float] = []
    late_steps = 0
    for run_id, asked_at in ev.cancel_requested.items():
        asked = ev.runs.get(run_id)
        outcomes[asked.status if asked else "missing"] += 1
        events = ev.events.get(run_id, [])
        cancelled = next((e for e in events if e.kind == EventKind.RUN_CANCELLED), None)
        if cancelled is not None:
            latency.append(max(0.0, cancelled.at - asked_at))
        late_steps += sum(1 for e in events if e.kind == EventKind.STEP_STARTED and e.at > asked_at)
    children_cancelled = sum(
        1 for r in ev.runs.values() if r.parent_run_id and r.status == "cancelled"
    )
    figures = {
        "requested": len(ev.cancel_requested),
        "outcomes": dict(sorted(outcomes.items())),
        "children_cancelled": children_cancelled,
        "steps_started_after_request": late_steps,
        "latency_s": {
            "p50": _r(percentile(latency, 50)),
            "p99": _r(percentile(latency, 99)),
            "max": _r(max(latency) if latency else None),
        },
    }
    return figures, out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


# -- 9. two worker versions ------------------------------------------------------------------


def check_versions(ev: Evidence) -> tuple[dict[str, Any], list[Violation]]:
    """Runs of the workflows only version-2 workers have were driven by those workers
    alone; no run failed because its worker did not have its workflow."""
    out: list[Violation] = []
    runs = drives = 0
    for row in ev.runs.values():
        if row.status == "failed" and "not registered" in (row.error or ""):
            out.append(
                Violation(
                    "versions",
                    row.run_id,
                    f"failed on a worker that does not serve it: {row.error}",
                )
            )
        if row.workflow not in ev.v2_only:
            continue
        runs += 1
        for e in ev.events.get(row.run_id, []):
            if e.kind not in DRIVE_MARKERS:
                continue
            drives += 1
            worker = e.payload.get("worker_id")
            if worker not in ev.v2_workers:
                out.append(
                    Violation(
                        "versions",
                        row.run_id,
                        f"{row.workflow} run driven at "
                        f"seq {e.seq} by {worker}, not a version-2 worker",
                    )
                )
    return {"v2_only_runs": runs, "v2_only_drives": drives, "v2_workers": len(ev.v2_workers)}, out


# -- 10. duplicate starts --------------------------------------------------------------------


def check_starts(ev: Evidence) -> tuple[dict[str, Any], list[Violation]]:
    """Concurrent starts under one explicit run id: every caller got the id back, one run
    was created (one ``run_queued`` that is not a re-queue), and a start with another
    input under that id was refused with RunIdConflict."""
    out: list[Violation] = []
    callers = answered = 0
    for run_id, dup in sorted(ev.dup_starts.items()):
        for n, result in enumerate(dup.results, start=1):
            callers += 1
            if result == run_id:
                answered += 1
            else:
                out.append(
                    Violation(
                        "starts",
                        run_id,
                        f"caller {n} of {len(dup.results)} got {result!r}, not the run id",
                    )
                )
        if run_id not in ev.runs:
            out.append(Violation("starts", run_id, "no run exists under the id"))
        created = [
            e
            for e in ev.events.get(run_id, [])
            if e.kind == EventKind.RUN_QUEUED and "reason" not in e.payload
        ]
        if len(created) != 1:
            out.append(
                Violation("starts", run_id, f"{len(created)} creations journaled under one run id")
            )
        if dup.conflict is not None and not dup.conflict.startswith("RunIdConflict"):
            out.append(
                Violation(
                    "starts",
                    run_id,
                    f"a start with another input under the id "
                    f"got {dup.conflict!r}, not RunIdConflict",
                )
            )
    return {"runs": len(ev.dup_starts), "callers": callers, "answered_with_id": answered}, out


# -- all of it -------------------------------------------------------------------------------


def check_all(ev: Evidence) -> Findings:
    """Every check over the whole evidence."""
    findings = Findings()
    lost_figures, violations = check_lost(ev)
    receipts_by_run: dict[str, list[ReceiptRow]] = defaultdict(list)
    for r in ev.receipts:
        receipts_by_run[r.run_id].append(r)
    surplus = 0
    for run_id in sorted(set(ev.events) | set(ev.submitted)):
        events = ev.events.get(run_id, [])
        row = ev.runs.get(run_id)
        if row is None and not events:
            continue  # already reported as missing
        violations += check_journal(run_id, events, row)
        n, found = check_completions(run_id, events)
        surplus += n
        violations += found
        violations += check_fencing(
            run_id, events, receipts_by_run.get(run_id, []), ev.locks.get(run_id)
        )
        violations += check_keys(run_id, events, receipts_by_run.get(run_id, []), ev.max_attempts)
        violations += check_branches(run_id, events)
    receiver_figures, found = check_receiver(ev)
    violations += found
    cancel_figures, found = check_cancels(ev)
    violations += found
    version_figures, found = check_versions(ev)
    violations += found
    start_figures, found = check_starts(ev)
    violations += found
    if ev.integrity not in (None, "ok"):
        violations.append(
            Violation("storage", None, f"the database fails its integrity check: {ev.integrity}")
        )
    findings.violations = violations
    findings.figures = {
        "runs": lost_figures,
        "duplicate_completions": surplus,
        "deliveries": receiver_figures,
        "cancels": cancel_figures,
        "versions": version_figures,
        "duplicate_starts": start_figures,
        "fencing_violations": sum(1 for v in violations if v.check == "fencing"),
        "violations_by_check": dict(Counter(v.check for v in violations)),
    }
    return findings


def recovery_times(
    events: dict[str, list[Event]], outages: Iterable[tuple[float, str]]
) -> list[float]:
    """Seconds from each outage ``(time, worker_id)`` (a kill, a crash point, a pause, a
    partition) to the next drive of each run that worker held at that time (see
    :func:`chaos.recovery.recoveries`)."""
    return [r.seconds for r in recoveries(events, [(t, w, "") for t, w in outages])]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]
