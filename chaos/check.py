"""The invariants of DESIGN.md §3, checked after a campaign from what it left behind.

The evidence is plain data (:class:`Evidence`): the rows of ``runs``, ``journal_events``,
``side_effect_receipts``, ``run_locks`` and ``signals`` as the database holds them once
the faults have healed, and the receiver's own log of arrivals. Each check takes the
evidence and returns violations; nothing here talks to a database, so the checks can be
tried on hand-made journals (tests/test_chaos_check.py).

The checks:

``lost``        every submitted run is terminal, or visibly waiting on something that has
                not come yet (invariant 8);
``failure``     no run failed or was cancelled for a reason the campaign does not expect;
``journal``     seq is gapless from 1, each event chains to the one before and its hash
                matches its content; exactly one terminal event, the last, agreeing with
                the run's status (invariant 5);
``completion``  at most one ``step_completed`` per step, and never a ``step_started``
                after it (invariant 3);
``receiver``    the receiver applied each key once; every arrival was claimed by a receipt
                first, of the run and step it names; what a receipt and a step recorded is
                what the receiver answered (invariant 7);
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
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratchet.engine.driver import MAX_STARTS_PER_ATTEMPT
from ratchet.model import GENESIS_HASH, TERMINAL_EVENTS, Event, EventKind, idempotency_key

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
    """Every submitted run is terminal or visibly waiting on something still to come."""
    out: list[Violation] = []
    statuses: Counter[str] = Counter()
    failed: list[dict[str, Any]] = []
    lost = waiting = 0
    for run_id in ev.submitted:
        row = ev.runs.get(run_id)
        problem = None
        if row is None:
            problem = "accepted run missing from the database"
            statuses["missing"] += 1
        else:
            statuses[row.status] += 1
            if row.status in ("queued", "running"):
                problem = f"stuck {row.status} after the faults healed"
            elif row.status == "waiting":
                problem = _waiting_problem(ev, row)
                waiting += problem is None
            elif row.status == "failed":
                failed.append({"run_id": run_id, "error": row.error})
                loop = crash_loop(ev.events.get(run_id, []))
                if loop is not None:
                    if loop < MAX_STARTS_PER_ATTEMPT:
                        out.append(Violation("failure", run_id,
                                             f"failed as a crash loop after {loop} starts of the "
                                             f"attempt, not {MAX_STARTS_PER_ATTEMPT}"))
                elif not any(x in (row.error or "") for x in ev.expected_failures):
                    out.append(Violation("failure", run_id,
                                         f"failed for no reason the campaign expects: "
                                         f"{row.error}"))
            elif row.status == "cancelled":
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
        "failed_runs": failed,
    }
    return figures, out


def _waiting_problem(ev: Evidence, row: RunRow) -> str | None:
    if not row.waiting_for:
        return "waiting with nothing named in waiting_for"
    kind, _, name = row.waiting_for.partition(":")
    if kind == "signal" and name in ev.pending_signals.get(row.run_id, set()):
        return f"waiting for signal {name!r} although it was sent (a lost wake-up)"
    if kind in ("sleep", "backoff") and (
            row.not_before is None or row.not_before < ev.now - ev.timer_grace_s):
        return (f"waiting on {row.waiting_for} whose timer was due at {row.not_before} "
                f"(now {ev.now:.3f}): the timer never fired")
    return None


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
            bad(f"events after the terminal one (seq {terminal[0].seq}): "
                f"{[(e.seq, e.kind) for e in events if e.seq > terminal[0].seq][:5]}")
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
                out.append(Violation("completion", run_id,
                                     f"step {e.step_id} completed again at seq {e.seq}"))
        elif e.kind == EventKind.STEP_STARTED and completed[e.step_id]:
            out.append(Violation("completion", run_id,
                                 f"step {e.step_id} started again at seq {e.seq} after it "
                                 "completed"))
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


def crash_loop(events: Sequence[Event]) -> int | None:
    """When the run failed as a crash loop (an attempt that kept losing its worker), how
    many drives started that attempt; the engine's policy gives up after
    MAX_STARTS_PER_ATTEMPT, which the faults of a campaign can legitimately reach."""
    failed = next((e for e in reversed(events) if e.kind == EventKind.STEP_FAILED
                   and e.payload.get("error_type") == CRASH_LOOP), None)
    if failed is None:
        return None
    drives = {marker.seq for marker, body in segments(events)[1:] if marker is not None
              and any(_attempted(e) and e.step_id == failed.step_id
                      and e.attempt == failed.attempt for e in body)}
    return len(drives)


CRASH_LOOP = "StepCrashLoop"


def _attempted(e: Event) -> bool:
    # A step attempt is announced by a step_started carrying its key (sleeps, signal
    # waits and child runs are journaled without one).
    return e.kind == EventKind.STEP_STARTED and "idempotency_key" in e.payload


def check_fencing(run_id: str, events: Sequence[Event], receipts: Iterable[ReceiptRow],
                  lock: LockRow | None) -> list[Violation]:
    """No journal, receipt or terminal write from a drive that no longer held the lease."""
    out: list[Violation] = []

    def bad(detail: str) -> None:
        out.append(Violation("fencing", run_id, detail))

    attempted_steps = {e.step_id for e in events if _attempted(e)}
    segs = segments(events)
    stray = [e for e in segs[0][1] if e.kind != EventKind.RUN_QUEUED
             and not (e.kind == EventKind.RUN_CANCELLED and e.payload.get("by") == "request")]
    if stray:
        bad(f"events written before any drive held the lease: "
            f"{[(e.seq, e.kind) for e in stray][:5]}")
    epochs: list[int] = []
    completed_at_epoch: dict[str, int] = {}
    for n, (marker, body) in enumerate(segs[1:], start=1):
        assert marker is not None
        epoch = int(marker.payload.get("epoch", -1))
        expected_kind = EventKind.RUN_STARTED if n == 1 else EventKind.RUN_RESUMED
        if marker.kind != expected_kind:
            bad(f"drive {n} (seq {marker.seq}) is journaled as {marker.kind}")
        if marker.payload.get("drive") != n:
            bad(f"drive marker at seq {marker.seq} says drive {marker.payload.get('drive')}, "
                f"but it is drive {n} of the journal")
        if epochs and epoch <= epochs[-1]:
            bad(f"drive at seq {marker.seq} holds epoch {epoch}, not above the previous "
                f"drive's {epochs[-1]}: a stale lease wrote a drive")
        epochs.append(epoch)
        started: set[tuple[str, int | None]] = set()
        for e in body:
            if _attempted(e):
                started.add((e.step_id or "", e.attempt))
            elif (e.kind in ATTEMPT_OUTCOMES and e.step_id in attempted_steps
                  and (e.step_id, e.attempt) not in started
                  # A crash loop is declared by the drive that declines to start it again.
                  and e.payload.get("error_type") != CRASH_LOOP):
                bad(f"{e.kind} of {e.step_id} attempt {e.attempt} at seq {e.seq} lands in "
                    f"drive {n} (epoch {epoch}), which never started that attempt: a write "
                    "from an earlier drive after the lease moved on")
            if e.kind == EventKind.STEP_COMPLETED and e.step_id is not None:
                completed_at_epoch.setdefault(e.step_id, epoch)
    known = set(epochs)
    for r in receipts:
        if r.epoch not in known:
            bad(f"receipt {r.key[:12]}… of {r.step_id} written at epoch {r.epoch}, which no "
                f"drive of the run held (drives: {sorted(known)})")
        elif r.step_id in completed_at_epoch and r.epoch > completed_at_epoch[r.step_id]:
            bad(f"receipt of {r.step_id} written at epoch {r.epoch} after the step completed "
                f"under epoch {completed_at_epoch[r.step_id]}")
    if epochs and (lock is None or lock.epoch < max(epochs)):
        bad(f"run_locks epoch {lock.epoch if lock else None} is below the journal's "
            f"highest drive epoch {max(epochs)}")
    return out


# -- 6. keys ---------------------------------------------------------------------------------


def check_keys(run_id: str, events: Sequence[Event], receipts: Iterable[ReceiptRow],
               max_attempts: dict[str, int]) -> list[Violation]:
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
            bad(f"step {e.step_id} attempt {e.attempt} at seq {e.seq} carries key "
                f"{key[:12]}…, not sha256(run|step|attempt) {want[:12]}…")
        keys[key] = e.step_id
        if at in seen:
            if not e.payload.get("resumed"):
                bad(f"step {e.step_id} attempt {e.attempt} started again at seq {e.seq} "
                    "without being marked as the resumed attempt")
        else:
            if e.payload.get("resumed"):
                bad(f"step {e.step_id} attempt {e.attempt} at seq {e.seq} claims to resume "
                    "an attempt the journal never started")
            if e.attempt > 1 and (e.step_id, e.attempt - 1) not in failed:
                bad(f"step {e.step_id} attempt {e.attempt} at seq {e.seq} without a journaled "
                    f"failure of attempt {e.attempt - 1}")
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
            bad(f"delivery {r.delivery} of {r.step_id} has more than one receipt: it was "
                "claimed (and maybe dispatched) under more than one key")
        if r.attempt is None:  # a receipt from before deliveries had identities
            if keys.get(r.key) != r.step_id:
                bad(f"receipt {r.key[:12]}… of {r.step_id} does not carry the key of any "
                    "journaled attempt of that step")
            continue
        if (r.step_id, r.attempt) not in attempts:
            bad(f"receipt {r.key[:12]}… of {r.step_id} delivery {r.delivery} was claimed by "
                f"attempt {r.attempt}, which the journal never started")
        want = delivery_key(run_id, r.step_id, r.attempt, r.delivery)
        if r.key != want:
            bad(f"receipt {r.key[:12]}… of {r.step_id} delivery {r.delivery} is not the key "
                f"attempt {r.attempt} derives for it ({want[:12]}…)")
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
            out.append(Violation("receiver", a.get("run") or None,
                                 f"arrival {a.get('arrival')} with key {key[:12]}… was "
                                 "dispatched without a receipt claiming it"))
        elif (a.get("run"), a.get("step")) != owner[:2]:
            out.append(Violation("receiver", owner[0],
                                 f"arrival {a.get('arrival')} names run {a.get('run')} step "
                                 f"{a.get('step')} but its key is {owner[1]}'s"))
        epoch = a.get("epoch")
        if epoch is not None and any(at < a["t"] and e > epoch
                                     for at, e in drive_epochs.get(a.get("run", ""), ())):
            stale += 1  # a zombie's dispatch: allowed, deduped; its settle is fenced
    double = {k: n for k, n in applies.items() if n > 1}
    for key, n in double.items():
        out.append(Violation("receiver", receipt_keys.get(key, ("?",))[0],
                             f"key {key[:12]}… applied {n} times"))
    for r in ev.receipts:
        if r.status != "settled":
            continue
        if r.key not in applied:
            out.append(Violation("receiver", r.run_id, f"receipt {r.key[:12]}… of {r.step_id} "
                                 "settled, but the receiver never applied its key"))
        elif applied[r.key] != r.response:
            out.append(Violation("receiver", r.run_id, f"receipt {r.key[:12]}… of {r.step_id} "
                                 f"recorded {r.response!r}; the receiver answered "
                                 f"{applied[r.key]!r}"))
    for run_id, events in ev.events.items():
        for e in events:
            if e.kind != EventKind.STEP_COMPLETED or not (e.step_id or "").endswith(":send"):
                continue
            output = e.payload.get("output")
            key = output.get("key") if isinstance(output, dict) else None
            if key is None or receipt_keys.get(key, ("", ""))[:2] != (run_id, e.step_id):
                out.append(Violation("receiver", run_id, f"{e.step_id} completed with "
                                     f"{output!r}, not an answer to one of its own keys"))
            elif applied.get(key) != output:
                out.append(Violation("receiver", run_id, f"{e.step_id} completed with "
                                     f"{output!r}; the receiver answered {applied.get(key)!r}"))
    figures = {
        "dispatches": len(ev.arrivals),
        "unique_keys": len({a["key"] for a in ev.arrivals}),
        "applied_keys": len(applied),
        "resends": len(ev.arrivals) - len({a["key"] for a in ev.arrivals}),
        "receiver_double_applies": sum(n - 1 for n in double.values()),
        "stale_epoch_dispatches": stale,
        "receipts": len(ev.receipts),
        "receipts_settled": sum(1 for r in ev.receipts if r.status == "settled"),
    }
    return figures, out


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
        violations += check_fencing(run_id, events, receipts_by_run.get(run_id, []),
                                    ev.locks.get(run_id))
        violations += check_keys(run_id, events, receipts_by_run.get(run_id, []),
                                 ev.max_attempts)
    receiver_figures, found = check_receiver(ev)
    violations += found
    if ev.integrity not in (None, "ok"):
        violations.append(Violation("storage", None,
                                    f"the database fails its integrity check: {ev.integrity}"))
    findings.violations = violations
    findings.figures = {
        "runs": lost_figures,
        "duplicate_completions": surplus,
        "deliveries": receiver_figures,
        "fencing_violations": sum(1 for v in violations if v.check == "fencing"),
        "violations_by_check": dict(Counter(v.check for v in violations)),
    }
    return findings


def recovery_times(events: dict[str, list[Event]], outages: Iterable[tuple[float, str]]
                   ) -> list[float]:
    """Seconds from each outage ``(time, worker_id)`` (a kill, a crash point, a pause, a
    partition) to the next drive of each run that worker held at that time.

    A run was held at ``t`` when its last drive begun before ``t`` was that worker's and had
    not yet parked or finished by ``t``. Only a next drive that took the run back (a sweep
    of an expired lease, or the same worker id reclaiming it) counts: a run claimed
    afresh had been handed back or parked, not lost."""
    by_worker: dict[str, list[tuple[Event, list[Event], Event | None]]] = defaultdict(list)
    for evs in events.values():
        drives = [(m, body) for m, body in segments(evs)[1:] if m is not None]
        for i, (marker, body) in enumerate(drives):
            following = drives[i + 1][0] if i + 1 < len(drives) else None
            by_worker[str(marker.payload.get("worker_id"))].append((marker, body, following))
    out: list[float] = []
    for t, worker_id in outages:
        for marker, body, following in by_worker.get(worker_id, ()):
            if following is None or not marker.at < t <= following.at:
                continue  # not this run's drive at the time of the outage
            ended = any(e.at <= t and (e.kind in TERMINAL_EVENTS
                                       or e.kind == EventKind.STEP_WAITING) for e in body)
            if not ended and following.payload.get("reason") in ("sweep", "reclaim"):
                out.append(following.at - t)
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]
