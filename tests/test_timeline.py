"""The waterfall the dashboard draws, computed from journals written by hand: attempts,
retries and their backoff, parked stretches (merged for compression), takeovers that cut an
attempt short, markers, and a journal cut at any seq."""

from __future__ import annotations

import json
from typing import Any

from ratchet.api.timeline import SandboxSpan, as_compact, as_dict, waterfall
from ratchet.model import GENESIS_HASH, Event


def journal(*spec: tuple[float, str, str | None, int | None, dict[str, Any]]) -> list[Event]:
    events: list[Event] = []
    prev = GENESIS_HASH
    for seq, (at, kind, step_id, attempt, payload) in enumerate(spec, start=1):
        ev = Event.chain("r", seq, kind, step_id, attempt, payload, at, prev)
        events.append(ev)
        prev = ev.hash
    return events


def shape(events: list[Event]) -> dict[str, list[tuple[str, str, float, float | None]]]:
    return {
        r.step_id: [(s.kind, s.outcome, s.start, s.end) for s in r.segments]
        for r in waterfall("r", events).rows
    }


def test_retries_backoff_and_completion() -> None:
    events = journal(
        (0.0, "run_queued", None, None, {}),
        (1.0, "run_started", None, None, {"worker_id": "a", "epoch": 1, "reason": "claim"}),
        (1.0, "step_started", "1:fetch", 1, {}),
        (2.0, "step_retrying", "1:fetch", 1, {"error": "x"}),
        (2.5, "step_started", "1:fetch", 2, {}),
        (3.0, "step_completed", "1:fetch", 2, {"output": 1}),
        (3.0, "run_succeeded", None, None, {"output": 1}),
    )
    w = waterfall("r", events)
    assert shape(events) == {
        "1:fetch": [
            ("attempt", "retrying", 1.0, 2.0),
            ("backoff", "over", 2.0, 2.5),
            ("attempt", "completed", 2.5, 3.0),
        ]
    }
    assert w.rows[0].attempts == 2 and w.rows[0].status == "completed"
    assert (w.start, w.end, w.last_seq, w.terminal) == (0.0, 3.0, 7, True)
    assert w.markers == []


def test_a_takeover_interrupts_the_attempt_in_flight_and_is_a_marker() -> None:
    events = journal(
        (0.0, "run_started", None, None, {"worker_id": "a", "epoch": 1, "reason": "claim"}),
        (1.0, "step_started", "1:work", 1, {}),
        (
            5.0,
            "run_resumed",
            None,
            None,
            {"worker_id": "b", "epoch": 2, "reason": "sweep", "drive": 2},
        ),
        (5.1, "step_started", "1:work", 1, {"resumed": True}),
        (5.2, "step_completed", "1:work", 1, {"output": None}),
        (5.3, "anomaly_detected", None, None, {"kind": "retry_storm"}),
    )
    assert shape(events) == {
        "1:work": [("attempt", "interrupted", 1.0, 5.0), ("attempt", "completed", 5.1, 5.2)]
    }
    w = waterfall("r", events)
    assert [(m.kind, m.label) for m in w.markers] == [
        # The drive line says why the drive before it ended, and who drove on.
        (
            "run_resumed",
            "drive 1 by a: worker lost (killed or hung), lease expired, "
            "taken over by b after 4.0 s",
        ),
        ("anomaly_detected", "anomaly_detected: retry_storm"),
    ]
    assert w.rows[0].attempts == 1 and not w.terminal
    assert [(d.drive, d.worker_id, d.ended) for d in w.drives] == [
        (1, "a", "worker lost (killed or hung), lease expired, taken over by b after 4.0 s"),
        (2, "b", None),
    ]
    assert as_dict(w)["drives"][1]["label"] == "drive 2 by b (sweep): running"


def test_parked_stretches_children_and_a_journal_cut_short() -> None:
    events = journal(
        (0.0, "run_started", None, None, {"worker_id": "a", "epoch": 1, "reason": "claim"}),
        (1.0, "step_waiting", "1:approval:ok", 1, {"reason": "approval"}),
        (90.0, "run_resumed", None, None, {"worker_id": "a", "epoch": 2, "reason": "claim"}),
        (90.0, "step_completed", "1:approval:ok", None, {"output": {}}),
        (91.0, "step_started", "2:child:payout", 1, {"child_run_id": "r/2"}),
        (91.5, "step_waiting", "2:child:payout", None, {"reason": "child"}),
        (95.0, "step_completed", "2:child:payout", None, {"output": 3}),
    )
    assert shape(events) == {
        "1:approval:ok": [("parked", "over", 1.0, 90.0)],
        "2:child:payout": [("attempt", "over", 91.0, 91.5), ("parked", "over", 91.5, 95.0)],
    }
    w = waterfall("r", events)
    assert w.rows[1].child_run_id == "r/2"
    assert w.parked == [(1.0, 90.0), (91.5, 95.0)]
    # Cut at seq 2: the approval is still waiting, open-ended, and the run parked since.
    cut = waterfall("r", events[:2])
    assert shape(events[:2]) == {"1:approval:ok": [("parked", "waiting", 1.0, None)]}
    assert cut.parked == [(1.0, None)] and cut.last_seq == 2 and cut.end == 1.0
    assert waterfall("r", []).rows == []


def test_a_long_backoff_is_parked_time_and_a_cancel_ends_what_goes_on() -> None:
    events = journal(
        (0.0, "run_started", None, None, {}),
        (1.0, "step_started", "1:call", 1, {}),
        (2.0, "step_retrying", "1:call", 1, {"error": "x", "retry_at": 60.0}),
        (2.0, "step_waiting", "1:call", 1, {"reason": "backoff", "retry_at": 60.0}),
        (30.0, "run_cancelled", None, None, {"by": "request"}),
    )
    assert shape(events) == {
        "1:call": [("attempt", "retrying", 1.0, 2.0), ("parked", "cancelled", 2.0, 30.0)]
    }
    assert waterfall("r", events).parked == [(2.0, 30.0)]


def test_a_run_queued_again_after_its_end_is_not_terminal_until_it_ends_again() -> None:
    # A cancelled run resumed (or a failed one retried): its page must follow it again.
    events = journal(
        (0.0, "run_started", None, None, {}),
        (1.0, "step_started", "1:work", 1, {}),
        (2.0, "step_completed", "1:work", 1, {}),
        (3.0, "run_cancelled", None, None, {"by": "ana"}),
        (4.0, "run_queued", None, None, {"reason": "resume", "by": "ana"}),
        (5.0, "run_succeeded", None, None, {}),
    )
    assert [waterfall("r", events[:n]).terminal for n in (3, 4, 5, 6)] == [
        False,
        True,
        False,
        True,
    ]


def test_the_compact_form_expands_to_the_api_form() -> None:
    events = journal(
        (0.0, "run_started", None, None, {"worker_id": "a", "epoch": 1, "reason": "claim"}),
        (1.0, "step_started", "1:fetch", 1, {"kind": "tool"}),
        (2.0, "step_retrying", "1:fetch", 1, {"error": "x"}),
        (2.5, "step_started", "1:fetch", 2, {"kind": "tool"}),
        (3.0, "step_completed", "1:fetch", 2, {"output": 1}),
        (4.0, "step_started", "2:child:payout", 1, {"child_run_id": "r/2"}),
        (4.5, "step_waiting", "2:child:payout", None, {"reason": "child"}),
    )
    w = waterfall("r", events)
    compact = json.loads(json.dumps(as_compact(w)))
    rf, sf = compact.pop("row_fields"), compact.pop("segment_fields")
    # What run.js's expand() does.
    compact["rows"] = [
        dict(zip(rf, r, strict=False))
        | {"segments": [dict(zip(sf, s, strict=True)) for s in r[len(rf)]]}
        for r in compact["rows"]
    ]
    assert compact == json.loads(json.dumps(as_dict(w)))
    assert compact["rows"][0]["kind"] == "tool" and compact["rows"][0]["attempts"] == 2


def test_an_isolated_runs_sandboxes_are_spans_and_a_cut_shows_them_as_they_were() -> None:
    events = journal(
        (0.0, "run_queued", None, None, {}),
        (1.2, "run_started", None, None, {"worker_id": "a", "epoch": 1, "reason": "claim"}),
        (1.3, "step_started", "1:work", 1, {}),
        (
            4.2,
            "run_resumed",
            None,
            None,
            {"worker_id": "a", "epoch": 2, "reason": "resume", "drive": 2},
        ),
        (4.3, "step_started", "1:work", 1, {"resumed": True}),
        (4.4, "step_completed", "1:work", 1, {"output": 1}),
        (4.5, "run_succeeded", None, None, {"output": 1}),
    )
    second = SandboxSpan("sbx-2", 2, 4.0, 4.6, "terminated", 0, None, "finished", 1 << 20)
    first = SandboxSpan("sbx-1", 1, 1.0, 3.0, "terminated", None, 9, "crashed", 2 << 20)
    w = waterfall("r", events, [second, first])
    assert w.sandboxes == [first, second]  # by attempt; the last outlives the run's end
    assert as_dict(w)["sandboxes"][0] == {
        "sandbox_id": "sbx-1",
        "attempt": 1,
        "start": 1.0,
        "end": 3.0,
        "status": "terminated",
        "exit_code": None,
        "signal": 9,
        "end_reason": "crashed",
        "peak_memory": 2 << 20,
    }
    # Cut at seq 3 (t=1.3): the first sandbox alive, the second not started yet.
    cut = waterfall("r", events[:3], [first, second], until=events[2].at)
    assert [(s.sandbox_id, s.end, s.status, s.signal, s.end_reason) for s in cut.sandboxes] == [
        ("sbx-1", None, "running", None, None)
    ]
    # Cut at seq 5 (t=4.3): the first over, the second alive.
    cut = waterfall("r", events[:5], [first, second], until=events[4].at)
    assert [(s.sandbox_id, s.end_reason) for s in cut.sandboxes] == [
        ("sbx-1", "crashed"),
        ("sbx-2", None),
    ]
    # A cut that holds the run's end is the whole run.
    assert waterfall("r", events, [first, second], until=events[-1].at).sandboxes == [first, second]
    assert waterfall("r", events).sandboxes == []  # an in-process run has none
