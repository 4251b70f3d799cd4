"""The typed state vocabularies: wait keys round-trip through their stored form, and the
enums keep the strings the database and the journal already hold."""

from __future__ import annotations

import pytest

from ratchet.errors import RetryClass
from ratchet.model import (
    ApprovalStatus,
    ClaimReason,
    DeliveryStatus,
    SandboxStatus,
    StepStatus,
    WaitKey,
    WaitKind,
)


@pytest.mark.parametrize(
    ("key", "kind", "value", "stored"),
    [
        (WaitKey.signal("go"), WaitKind.SIGNAL, "go", "signal:go"),
        (WaitKey.child("run-1"), WaitKind.CHILD, "run-1", "child:run-1"),
        (WaitKey.sleep("3:nap"), WaitKind.SLEEP, "3:nap", "sleep:3:nap"),
        (WaitKey.backoff("2:fetch"), WaitKind.BACKOFF, "2:fetch", "backoff:2:fetch"),
        (WaitKey.approval("4:approval:ship"), WaitKind.APPROVAL, "4:approval:ship", None),
    ],
)
def test_a_wait_key_round_trips(key: WaitKey, kind: WaitKind, value: str, stored: str) -> None:
    assert (key.kind, key.value) == (kind, value)
    assert str(key) == (stored or f"approval:{value}")
    assert WaitKey.parse(str(key)) == key
    assert key.members == (key,)


def test_several_keys_park_as_any_and_round_trip() -> None:
    key = WaitKey.any_of([WaitKey.signal("b"), WaitKey.child("r"), WaitKey.signal("b")])
    assert key.kind == WaitKind.ANY
    assert str(key) == 'any:["child:r","signal:b"]'  # the form runs.waiting_for holds
    assert WaitKey.parse(str(key)) == key
    assert key.members == (WaitKey.child("r"), WaitKey.signal("b"))
    assert WaitKey.any_of(["signal:x", WaitKey.signal("x")]) == WaitKey.signal("x")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "signal",
        "signal:",
        "Signal:go",
        ":go",
        "any:[]",
        'any:["signal:a"]',
        "any:not json",
        'any:["signal:a","bogus:b"]',
        'any:["signal:a","any:[]"]',
    ],
)
def test_a_malformed_wait_key_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a wait key"):
        WaitKey.parse(text)


def test_a_wait_key_needs_a_value() -> None:
    with pytest.raises(ValueError):
        WaitKey.signal("")
    with pytest.raises(ValueError):
        WaitKey.any_of([])


def test_the_enums_keep_the_stored_strings() -> None:
    assert [s.value for s in StepStatus] == [
        "pending",
        "started",
        "retrying",
        "waiting",
        "completed",
        "failed",
    ]
    assert [s.value for s in DeliveryStatus] == ["claimed", "settled", "failed"]
    assert [s.value for s in ApprovalStatus] == ["pending", "approved", "rejected", "expired"]
    assert [s.value for s in SandboxStatus] == ["starting", "running", "terminated"]
    assert {r.value for r in ClaimReason} >= {"claim", "sweep", "reclaim", "retry"}
    assert {c.value for c in RetryClass} == {"any", "timeout", "llm", "connector", "tool", "never"}
    # Members are their strings: rows and payloads read back as str compare equal.
    completed: str = StepStatus.COMPLETED
    assert completed == "completed" and f"{ApprovalStatus.EXPIRED}" == "expired"
