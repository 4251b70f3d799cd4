"""A run's story from journals written by hand: who drove each drive and why it ended
(a takeover, a park, a cancel by a person, a dead letter retried by one, a claim reason
this version does not know), the input in the shape it was given, a model's answer as
text."""

from __future__ import annotations

from typing import Any

import pytest

from ratchet.model import GENESIS_HASH, Event, answer_text, drives, duration, given_input


def journal(*spec: tuple[float, str, dict[str, Any]]) -> list[Event]:
    events: list[Event] = []
    prev = GENESIS_HASH
    for seq, (at, kind, payload) in enumerate(spec, start=1):
        step = "1:work" if kind.startswith("step_") else None
        ev = Event.chain("r", seq, kind, step, 1 if step else None, payload, at, prev)
        events.append(ev)
        prev = ev.hash
    return events


def drive(worker: str, n: int, reason: str = "claim") -> dict[str, Any]:
    return {"worker_id": worker, "epoch": n, "drive": n, "reason": reason}


def told(events: list[Event]) -> list[tuple[str | None, str | None]]:
    return [(d.worker_id, d.ended) for d in drives(events)]


def test_a_killed_workers_drive_is_taken_over_and_the_next_succeeds() -> None:
    events = journal(
        (0.0, "run_queued", {}),
        (1.0, "run_started", drive("w1", 1)),
        (1.5, "step_started", {}),
        (3.6, "run_resumed", drive("w2", 2, "sweep")),
        (3.7, "step_started", {"resumed": True}),
        (3.8, "step_completed", {"output": 1}),
        (3.9, "run_succeeded", {"output": 1}),
    )
    assert told(events) == [
        ("w1", "worker lost (killed or hung), lease expired, taken over by w2 after 2.1 s"),
        ("w2", "succeeded"),
    ]
    assert [d.label for d in drives(events)] == [
        "drive 1 by w1: worker lost (killed or hung), lease expired, taken over by w2 after 2.1 s",
        "drive 2 by w2 (sweep): succeeded",
    ]
    assert duration(events) == pytest.approx(2.9)


def test_a_killed_workers_drive_seen_dead_is_taken_over_before_its_lease_expires() -> None:
    events = journal(
        (1.0, "run_started", drive("w1", 1)),
        (1.5, "step_started", {}),
        (2.1, "run_resumed", drive("w2", 2, "takeover")),
        (2.2, "run_succeeded", {"output": 1}),
    )
    assert told(events) == [
        ("w1", "worker killed, taken over by w2 after 600 ms"),
        ("w2", "succeeded"),
    ]


def test_a_parked_run_resumed_then_cancelled_by_a_person() -> None:
    events = journal(
        (1.0, "run_started", drive("w1", 1)),
        (1.1, "step_waiting", {"reason": "approval", "name": "ok"}),
        (9.0, "approval_decided", {"approved": True}),
        (9.5, "run_resumed", drive("w2", 2)),
        (9.6, "step_completed", {"output": None}),
        (9.7, "step_waiting", {"reason": "signal", "name": "go"}),
        (20.0, "run_cancelled", {"by": "ana"}),
    )
    assert told(events) == [
        ("w1", "parked (approval), resumed by w2 after 8.4 s"),
        ("w2", "parked (signal), cancelled by ana"),
    ]
    # The drive ended when it parked, not when the person cancelled the run.
    assert drives(events)[1].end == 9.7
    # An older journal's cancel says "request": nobody is named.
    old = journal((1.0, "run_started", drive("w1", 1)), (2.0, "run_cancelled", {"by": "request"}))
    assert told(old) == [("w1", "cancelled")]


def test_a_run_its_worker_cancelled_names_who_asked_and_the_drive_ends_with_it() -> None:
    events = journal(
        (1.0, "run_started", drive("w1", 1)),
        (1.1, "step_waiting", {"reason": "signal", "name": "go"}),
        (5.0, "run_cancelled", {"error": "cancelled", "by": "ana"}),
    )
    # Its worker held it (waiting in memory, not parked): the drive ended with the cancel.
    assert told(events) == [("w1", "cancelled by ana")]
    assert drives(events)[0].end == 5.0
    nobody = journal(
        (1.0, "run_started", drive("w1", 1)),
        (2.0, "run_cancelled", {"error": "cancelled", "by": "request"}),
    )
    assert told(nobody) == [("w1", "cancelled")] and drives(nobody)[0].end == 2.0
    # A worker's cancel from before cancels named anyone.
    old = journal(
        (1.0, "run_started", drive("w1", 1)), (2.0, "run_cancelled", {"error": "cancelled"})
    )
    assert told(old) == [("w1", "cancelled")]


def test_a_dead_lettered_run_retried_by_a_person_and_a_reason_this_version_does_not_know() -> None:
    events = journal(
        (1.0, "run_started", drive("w1", 1)),
        (1.1, "step_failed", {"error": "x", "error_type": "ValueError"}),
        (1.2, "run_failed", {"error": "x", "reason": "step_failed"}),
        (5.0, "run_queued", {"reason": "retry", "by": "ana"}),
        (5.5, "run_started", drive("w2", 2)),
        (6.0, "run_resumed", drive("w3", 3, "worker_died")),
        (6.5, "run_succeeded", {"output": None}),
    )
    assert told(events) == [
        ("w1", "failed, dead-lettered (step_failed), retried by ana"),
        ("w2", "ended, taken over by w3 (worker_died) after 500 ms"),
        ("w3", "succeeded"),
    ]


def test_the_input_in_the_shape_it_was_given() -> None:
    assert given_input({"args": [], "kwargs": {"n": 1}}) == {"n": 1}
    assert given_input({"args": [{"q": 1}], "kwargs": {}}) == {"q": 1}  # a graph's input
    assert given_input({"args": [1, 2], "kwargs": {}}) == [1, 2]
    both = {"args": [1], "kwargs": {"y": 2}}
    assert given_input(both) == both
    assert given_input({"other": 1}) == {"other": 1}


def test_a_models_answer_as_text() -> None:
    chat = {
        "choices": [
            {
                "message": {
                    "content": "It is sunny.",
                    "tool_calls": [{"function": {"name": "lookup", "arguments": '{"c":"P"}'}}],
                }
            }
        ]
    }
    assert answer_text(chat) == 'It is sunny.\nlookup({"c":"P"})'
    responses = {
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": "Hi"}]},
            {"type": "function_call", "name": "f", "arguments": "{}"},
        ]
    }
    assert answer_text(responses) == "Hi\nf({})"
    claude = {
        "type": "message",
        "content": [
            {"type": "text", "text": "Sure."},
            {"type": "tool_use", "name": "g", "input": {"a": 1}},
        ],
    }
    assert answer_text(claude) == 'Sure.\ng({"a":1})'
    assert answer_text({"data": [{"embedding": [0.1]}]}) is None
