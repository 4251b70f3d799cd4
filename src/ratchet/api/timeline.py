"""A run's journal as a waterfall: one row per step, its attempts, backoffs and parked
time as segments on a time axis, the run's drive boundaries and guard events as
markers, and for an isolated run the span of each of its sandboxes.

This is a view of the journal for the dashboard, computed here in one pass so a page of a
10,000-event run receives a few hundred rows to draw rather than the events themselves. It
is not a second fold: a run's *state* (what the scrubber shows) is :func:`ratchet.model.fold`
alone; this adds only when each thing happened, which the fold does not keep. Like the
model, it imports nothing else of Ratchet's.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ratchet.model import TAKEOVERS, TERMINAL_EVENTS, DriveStory, Event, EventKind, drives, failure

# Event kinds drawn as markers on the time axis (the guards' kinds exist once the guards
# journal them; a journal without them simply has none).
MARKER_KINDS = frozenset(
    {"run_resumed", "anomaly_detected", "confidence_evaluated", "confidence_gate_bypassed"}
)


@dataclass(slots=True)
class Segment:
    """A stretch of a step's time. ``kind``: attempt, backoff or parked. ``outcome`` of an
    attempt: running, completed, failed, retrying (it failed and will be retried) or
    interrupted (its worker died and another drive took the run over); of a parked or
    backoff stretch: waiting or over. ``end`` is None while it goes on."""

    kind: str
    start: float
    end: float | None
    outcome: str
    attempt: int | None
    start_seq: int
    end_seq: int | None = None
    reason: str | None = None  # parked: approval, sleep, signal, child, backoff


@dataclass(slots=True)
class Row:
    """One step (or child run) of the waterfall."""

    step_id: str
    name: str
    kind: str | None
    status: str
    child_run_id: str | None = None
    attempts: int = 0
    segments: list[Segment] = field(default_factory=list)


@dataclass(slots=True)
class Marker:
    seq: int
    at: float
    kind: str
    step_id: str | None
    label: str


@dataclass(slots=True)
class SandboxSpan:
    """One sandbox of an isolated run (a row of ``sandboxes``): when it lived and how it
    ended. ``end`` is None while it lives; ``end_reason``: finished, crashed, oom,
    timeout, killed, shutdown or orphaned."""

    sandbox_id: str
    attempt: int
    start: float
    end: float | None
    status: str  # starting | running | terminated
    exit_code: int | None = None
    signal: int | None = None
    end_reason: str | None = None
    peak_memory: int | None = None


@dataclass(slots=True)
class Waterfall:
    """The rows and markers of a run's journal up to ``last_seq``; ``start``..``end`` is
    the time axis (``end`` is the last event's time). ``parked`` lists the merged stretches
    when the run was parked, which a viewer may compress."""

    run_id: str
    last_seq: int
    start: float | None
    end: float | None
    terminal: bool
    rows: list[Row]
    markers: list[Marker]
    parked: list[tuple[float, float | None]]
    sandboxes: list[SandboxSpan] = field(default_factory=list)
    # Who drove the run and why each drive ended; the step whose failure failed it and
    # its traceback (see ratchet.model.story).
    drives: list[DriveStory] = field(default_factory=list)
    failed_step: str | None = None
    traceback: str | None = None


def _label(ev: Event) -> str:
    p = ev.payload
    if ev.kind == EventKind.RUN_RESUMED:
        return f"drive {p.get('drive', '?')}: {p.get('reason', '?')} by {p.get('worker_id', '?')}"
    detail = p.get("kind") or p.get("type") or p.get("outcome") or p.get("score")
    return f"{ev.kind}: {detail}" if detail is not None else ev.kind


def _close(seg: Segment | None, at: float, seq: int, outcome: str) -> None:
    if seg is not None and seg.end is None:
        seg.end, seg.end_seq, seg.outcome = at, seq, outcome


def _sandboxes_until(spans: Sequence[SandboxSpan], until: float | None) -> list[SandboxSpan]:
    """The sandboxes as they were at ``until`` (a cut journal's last event): those started
    by then, one that ended later still alive."""
    if until is None:
        return list(spans)
    return [
        s
        if s.end is not None and s.end <= until
        else replace(
            s,
            end=None,
            status="running",
            exit_code=None,
            signal=None,
            end_reason=None,
            peak_memory=None,
        )
        for s in spans
        if s.start <= until
    ]


def waterfall(
    run_id: str,
    events: list[Event],
    sandboxes: Sequence[SandboxSpan] = (),
    until: float | None = None,
) -> Waterfall:
    """The waterfall of ``events`` (a run's journal, or its first events, in seq order)
    and of the run's ``sandboxes``, cut at ``until`` (the time of the last event a cut
    journal holds; None: the whole run)."""
    rows: dict[str, Row] = {}
    open_seg: dict[str, Segment] = {}  # each step's segment still going on
    markers: list[Marker] = []
    terminal = False
    told = drives(events)
    # A drive line says why the drive before it ended, and who drove on.
    ended_at = {d.start_seq: prev.label for prev, d in itertools.pairwise(told)}
    for ev in events:
        kind = ev.kind
        if kind in MARKER_KINDS:
            label = ended_at.get(ev.seq) or _label(ev)
            markers.append(Marker(ev.seq, ev.at, kind, ev.step_id, label))
        if kind == EventKind.RUN_RESUMED and ev.payload.get("reason") in TAKEOVERS:
            # The worker that ran these attempts is gone; the new drive starts them again.
            for step_id, seg in list(open_seg.items()):
                if seg.kind == "attempt":
                    _close(seg, ev.at, ev.seq, "interrupted")
                    del open_seg[step_id]
        if kind == EventKind.RUN_QUEUED and terminal:
            terminal = False  # retried or resumed: the run goes on after its end
        if kind in TERMINAL_EVENTS:
            terminal = True
            for seg in open_seg.values():
                _close(
                    seg, ev.at, ev.seq, "cancelled" if kind == EventKind.RUN_CANCELLED else "over"
                )
            open_seg.clear()
        if ev.step_id is None or not kind.startswith("step_"):
            continue
        row = rows.get(ev.step_id)
        if row is None:
            _, _, name = ev.step_id.partition(":")
            row = rows[ev.step_id] = Row(ev.step_id, name or ev.step_id, None, "pending")
        prev = open_seg.pop(ev.step_id, None)
        if kind == EventKind.STEP_STARTED:
            _close(
                prev, ev.at, ev.seq, "over" if prev and prev.kind != "attempt" else "interrupted"
            )
            row.kind = ev.payload.get("kind", row.kind)
            row.child_run_id = ev.payload.get("child_run_id", row.child_run_id)
            seg = Segment("attempt", ev.at, None, "running", ev.attempt, ev.seq)
            row.segments.append(seg)
            open_seg[ev.step_id] = seg
            row.status = "running"
        elif kind == EventKind.STEP_COMPLETED:
            _close(prev, ev.at, ev.seq, "completed" if prev and prev.kind == "attempt" else "over")
            row.status = "completed"
        elif kind == EventKind.STEP_FAILED:
            _close(prev, ev.at, ev.seq, "failed")
            row.status = "failed"
        elif kind == EventKind.STEP_RETRYING:
            _close(prev, ev.at, ev.seq, "retrying")
            seg = Segment("backoff", ev.at, None, "waiting", ev.attempt, ev.seq, reason="backoff")
            row.segments.append(seg)
            open_seg[ev.step_id] = seg
            row.status = "retrying"
        elif kind == EventKind.STEP_WAITING:
            reason = str(ev.payload.get("reason", "waiting"))
            if prev is not None and prev.kind == "backoff":
                # A long backoff parks the run: the same stretch, now parked.
                prev.kind = "parked"
                open_seg[ev.step_id] = prev
            elif prev is not None and prev.kind == "parked":
                open_seg[ev.step_id] = prev  # asked again on a later drive: still parked
            else:
                # A child step parks while its child runs: its attempt ends there.
                _close(prev, ev.at, ev.seq, "over")
                seg = Segment("parked", ev.at, None, "waiting", ev.attempt, ev.seq, reason=reason)
                row.segments.append(seg)
                open_seg[ev.step_id] = seg
            row.status = "waiting"
    for row in rows.values():  # once at the end, not at every event
        row.attempts = len({s.attempt for s in row.segments if s.kind == "attempt"})
    parked = _merge(
        [(s.start, s.end) for r in rows.values() for s in r.segments if s.kind == "parked"]
    )
    return Waterfall(
        run_id,
        events[-1].seq if events else 0,
        events[0].at if events else None,
        events[-1].at if events else None,
        terminal,
        list(rows.values()),
        markers,
        parked,
        # A journal cut at its end is the whole run: its last sandbox may
        # outlive the run's end event.
        _sandboxes_until(sorted(sandboxes, key=lambda s: s.attempt), None if terminal else until),
        told,
        *failure(events),
    )


def _merge(spans: list[tuple[float, float | None]]) -> list[tuple[float, float | None]]:
    """Overlapping stretches as one; an open one (no end) swallows what follows it."""
    out: list[tuple[float, float | None]] = []
    for start, end in sorted(spans, key=lambda s: s[0]):
        if out and (out[-1][1] is None or start <= out[-1][1]):
            last_start, last_end = out[-1]
            merged = None if last_end is None or end is None else max(last_end, end)
            out[-1] = (last_start, merged)
        else:
            out.append((start, end))
    return out


# The columns of a row and of a segment in the compact form, in order.
ROW_FIELDS = ("step_id", "name", "kind", "status", "child_run_id", "attempts")
SEGMENT_FIELDS = ("kind", "start", "end", "outcome", "attempt", "start_seq", "end_seq", "reason")


def _segment(s: Segment) -> list[Any]:
    return [s.kind, s.start, s.end, s.outcome, s.attempt, s.start_seq, s.end_seq, s.reason]


def _head(w: Waterfall) -> dict[str, Any]:
    return {
        "run_id": w.run_id,
        "last_seq": w.last_seq,
        "start": w.start,
        "end": w.end,
        "terminal": w.terminal,
        "markers": [
            {"seq": m.seq, "at": m.at, "kind": m.kind, "step_id": m.step_id, "label": m.label}
            for m in w.markers
        ],
        "parked": [[start, end] for start, end in w.parked],
        "drives": [d.as_dict() for d in w.drives],
        "failed_step": w.failed_step,
        "traceback": w.traceback,
        "sandboxes": [
            {
                "sandbox_id": s.sandbox_id,
                "attempt": s.attempt,
                "start": s.start,
                "end": s.end,
                "status": s.status,
                "exit_code": s.exit_code,
                "signal": s.signal,
                "end_reason": s.end_reason,
                "peak_memory": s.peak_memory,
            }
            for s in w.sandboxes
        ],
    }


def as_dict(w: Waterfall) -> dict[str, Any]:
    """The JSON form the API serves: each row and segment an object."""
    return _head(w) | {
        "rows": [
            {
                "step_id": r.step_id,
                "name": r.name,
                "kind": r.kind,
                "status": r.status,
                "child_run_id": r.child_run_id,
                "attempts": r.attempts,
                "segments": [
                    {
                        "kind": s.kind,
                        "start": s.start,
                        "end": s.end,
                        "outcome": s.outcome,
                        "attempt": s.attempt,
                        "start_seq": s.start_seq,
                        "end_seq": s.end_seq,
                        "reason": s.reason,
                    }
                    for s in r.segments
                ],
            }
            for r in w.rows
        ]
    }


def as_compact(w: Waterfall) -> dict[str, Any]:
    """The form a run page embeds: the same, with each row and segment a list of its
    values in the order ``row_fields`` and ``segment_fields`` name (a row's last value:
    its segments). For thousands of rows it is less than half the bytes for the server to
    encode and the browser to parse; the page expands it into :func:`as_dict`'s form."""
    return _head(w) | {
        "row_fields": ROW_FIELDS,
        "segment_fields": SEGMENT_FIELDS,
        "rows": [
            [
                r.step_id,
                r.name,
                r.kind,
                r.status,
                r.child_run_id,
                r.attempts,
                [_segment(s) for s in r.segments],
            ]
            for r in w.rows
        ],
    }
