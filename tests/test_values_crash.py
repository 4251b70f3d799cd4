"""Values of every kind pydantic reads, across a SIGKILL, on SQLite and PostgreSQL: what
a step returned, what the workflow was started with and the typed signal it waited for
come back as the annotated types, equal to what was returned, and a re-drive by another
worker process (which replays them from the journal) gets exactly what the first drive
got; the run's result reads back as its annotated type."""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import values_app
from proc import Harness
from waiting import wait_for

from ratchet.model import EventKind

pytestmark = pytest.mark.crash
WORKER = "w-values"  # the restarted worker reclaims the killed one's run at once


@pytest.fixture
def h(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, values_app)
    try:
        yield harness
    finally:
        harness.close()


def drives_seen(h: Harness) -> list[dict[str, Any]]:
    path = values_app.seen_log(h.invocation_log)
    if not path.exists():
        return []
    return [
        json.loads(line)
        for line in path.read_text().splitlines(keepends=True)
        if line.endswith("\n")
    ]


def test_every_kind_of_value_comes_back_the_same_after_a_sigkill(h: Harness) -> None:
    fields = list(typing.get_type_hints(values_app.Everything))
    run_id = h.app.start("kinds", *values_app.ARGS)
    h.app.signal(run_id, "order", values_app.SIGNAL)  # kept until the run asks for it
    a = h.spawn("a", worker_id=WORKER)
    h.wait_invoked(f"{len(fields) + 2}:hold")  # every value journaled; the signal taken
    a.kill()
    b = h.spawn("a-restarted", worker_id=WORKER)
    first, replay = wait_for(
        lambda: drives_seen(h) if len(drives_seen(h)) == 2 else None,
        what="the re-drive to replay every value",
        detail=h.worker_logs,
    )
    h.open_gate("hold")
    h.wait_status(run_id, "succeeded")

    assert (first["pid"], replay["pid"]) == (a.pid, b.pid)
    assert set(first["seen"]) == {*fields, "arg:parcel", "arg:when", "signal"}
    # Each value is what was returned (sent, started with), as its annotated type...
    assert {k: v["equal"] for k, v in first["seen"].items()} == dict.fromkeys(first["seen"], True)
    assert first["seen"]["stamp"]["repr"].startswith("Stamp(at=datetime.datetime(2024, 5, 6")
    # ... and the replay got exactly what the first drive got.
    assert replay["seen"] == first["seen"]
    # No step's code ran again; the blocked one ran once more.
    calls = h.calls()
    assert {k: n for k, n in calls.items() if not k.endswith(":hold")} == {
        f"{i}:{name}": 1 for i, name in enumerate(fields, start=1)
    }
    assert calls[f"{len(fields) + 2}:hold"] == 2

    result = h.app.result(run_id)
    assert result == values_app.VALUES
    assert type(result["order"]) is values_app.Order and type(result["point"]) is values_app.Point
    events = h.app.events(run_id)
    assert all(e.verify() for e in events)
    # The journal holds the JSON form: ISO times, base64 bytes, a Decimal's digits.
    outputs = {
        e.step_id.split(":", 1)[1]: e.payload["output"]
        for e in events
        if e.kind == EventKind.STEP_COMPLETED and e.step_id
    }
    assert outputs["moment"] == "2024-05-06T07:08:09.123456+02:00"
    assert outputs["amount"] == "12345678901234567890.000001"
    assert outputs["parcel"]["label"] == "AP9iaW5hcnmA"
    assert outputs["signal:order"]["id"] == "12345678-1234-5678-1234-567812345678"
