"""Deduplicated, debounced and delayed starts, on both backends: a dedup id held by the
database while its run is not terminal (several processes racing, exactly one wins), starts
from two processes collapsing into one run that begins after the window with the latest
input, runs no worker claims before their time, the batch start, and bad options refused
with nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import starts_app
from waiting import wait_for

import ratchet
from ratchet.model import EventKind, RunStatus

APP = Path(starts_app.__file__)
# A claim may see the database's clock a hair before the worker's own stamps its event.
CLOCKS_S = 0.05


def _started_at(app: ratchet.Ratchet, run_id: str) -> float:
    return next(e.at for e in app.events(run_id) if e.kind == EventKind.RUN_STARTED)


def _starter(db_url: str, go: Path, mode: str, key: str, x: int) -> subprocess.Popen[str]:
    """A process that starts ``echo(x)`` once ``go`` exists (see starts_app)."""
    return subprocess.Popen(
        [sys.executable, str(APP), db_url, str(go), mode, key, str(x)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _said(proc: subprocess.Popen[str]) -> dict[str, str]:
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_a_dedup_id_is_held_until_its_run_ends(db_url: str) -> None:
    with starts_app.build(db_url) as app:
        first = app.start("echo", 1, dedup_id="order-7")
        with pytest.raises(ratchet.DuplicateStart, match="order-7") as refused:
            app.start("echo", 2, dedup_id="order-7")
        assert refused.value.run_id == first and first in str(refused.value)
        # Another dedup id, or no dedup id, is another run.
        other = app.start("echo", 3, dedup_id="order-8")
        plain = app.start("echo", 4)
        assert len({first, other, plain}) == 3
        # An explicit run id repeated is the same start, not a duplicate.
        assert app.start("echo", 5, dedup_id="order-9", run_id="r9") == "r9"
        assert app.start("echo", 5, dedup_id="order-9", run_id="r9") == "r9"
        # The run's end frees the id in the commit that ends it.
        app.cancel(first)
        wait_for(lambda: app.get(first).status == RunStatus.CANCELLED, what="the cancel")
        again = app.start("echo", 6, dedup_id="order-7")
        assert again != first
        app.launch()
        assert app.result(again, timeout_s=15) == 6
        after = app.start("echo", 7, dedup_id="order-7")
        assert after not in (first, again)


def test_a_resume_is_refused_while_another_run_holds_the_dedup_id(db_url: str) -> None:
    with starts_app.build(db_url) as app:
        first = app.start("echo", 1, dedup_id="order-7")
        app.cancel(first)
        wait_for(lambda: app.get(first).status == RunStatus.CANCELLED, what="the cancel")
        second = app.start("echo", 2, dedup_id="order-7")
        with pytest.raises(ratchet.DuplicateStart, match="holds its dedup id") as refused:
            app.resume(first)
        assert refused.value.run_id == second
        assert app.get(first).status == RunStatus.CANCELLED
        assert [e.kind for e in app.events(first)][-1] == EventKind.RUN_CANCELLED
        app.cancel(second)
        wait_for(lambda: app.get(second).status == RunStatus.CANCELLED, what="the cancel")
        app.resume(first)
        assert app.get(first).status == RunStatus.QUEUED


def test_concurrent_starts_with_one_dedup_id_from_several_processes_one_wins(
    db_url: str, tmp_path: Path
) -> None:
    with starts_app.build(db_url) as app:
        _ = app.store  # migrated once, before the racers
        go = tmp_path / "go"
        procs = [_starter(db_url, go, "dedup", "order-42", x) for x in (1, 2, 3, 4)]
        go.touch()
        said = [_said(p) for p in procs]
        won = [s["won"] for s in said if "won" in s]
        assert len(won) == 1, said
        assert [s["dup"] for s in said if "dup" in s] == won * 3
        assert [r.run_id for r in app.runs()] == won


def test_debounced_starts_from_two_processes_collapse_into_one_run_with_the_latest_input(
    db_url: str, tmp_path: Path
) -> None:
    with starts_app.build(db_url) as app:
        _ = app.store
        # Both processes are up before the first starts; the second starts as soon as the
        # first has, well within the window.
        go_a, go_b = tmp_path / "go-a", tmp_path / "go-b"
        pa = _starter(db_url, go_a, "debounce:1.0", "doc-42", 1)
        pb = _starter(db_url, go_b, "debounce:1.0", "doc-42", 2)
        go_a.touch()
        a = _said(pa)
        go_b.touch()
        b = _said(pb)
        assert a["won"] == b["won"], (a, b)
        run_id = a["won"]
        rec = app.get(run_id)
        assert rec.status == RunStatus.WAITING and rec.input == {"args": [2], "kwargs": {}}
        assert rec.not_before is not None
        # Another key is another run.
        other = app.start("echo", 9, debounce=ratchet.Debounce(key="doc-43", wait_s=0.2))
        assert other != run_id
        app.launch()
        assert app.result(run_id, timeout_s=15) == 2
        assert _started_at(app, run_id) >= rec.not_before - CLOCKS_S
        assert app.result(other, timeout_s=15) == 9
        assert sorted(r.run_id for r in app.runs()) == sorted([run_id, other])
        # Once the run has begun, a start of its key is a new run.
        later = app.start("echo", 3, debounce=ratchet.Debounce(key="doc-42", wait_s=0.2))
        assert later != run_id and app.result(later, timeout_s=15) == 3


def test_debounced_starts_racing_from_several_processes_make_one_run(
    db_url: str, tmp_path: Path
) -> None:
    with starts_app.build(db_url) as app:
        _ = app.store
        go = tmp_path / "go"
        procs = [_starter(db_url, go, "debounce:30", "doc-7", x) for x in (1, 2, 3, 4)]
        go.touch()
        said = [_said(p) for p in procs]
        assert len({s["won"] for s in said}) == 1, said
        [rec] = app.runs()
        assert rec.run_id == said[0]["won"] and rec.status == RunStatus.WAITING
        assert rec.input["args"][0] in (1, 2, 3, 4)


def test_a_delayed_start_is_not_claimed_before_its_time_by_a_running_worker(db_url: str) -> None:
    with starts_app.build(db_url) as app:
        app.launch()
        quick = app.start("echo", 0)
        assert app.result(quick, timeout_s=15) == 0  # the worker claims what is ready
        delayed = app.start("echo", 1, delay_s=1.0)
        at = datetime.now(UTC) + timedelta(seconds=1.2)
        timed = app.start("echo", 2, start_at=at)
        recs = {r: app.get(r) for r in (delayed, timed)}
        assert all(rec.status == RunStatus.WAITING for rec in recs.values())
        assert recs[timed].not_before == pytest.approx(at.timestamp())
        assert app.result(delayed, timeout_s=15) == 1
        assert app.result(timed, timeout_s=15) == 2
        for run_id, rec in recs.items():
            assert rec.not_before is not None
            assert _started_at(app, run_id) >= rec.not_before - CLOCKS_S


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"start_at": datetime(2030, 1, 1)}, "start_at", "has no time zone"),
        ({"start_at": "2030-01-01T00:00:00Z"}, "start_at", "expected a datetime"),
        (
            {"start_at": datetime(2030, 1, 1, tzinfo=UTC), "delay_s": 1},
            "start_at",
            "not both",
        ),
        ({"delay_s": -1}, "delay_s", "0 or more"),
        ({"delay_s": True}, "delay_s", "a number of seconds"),
        ({"dedup_id": ""}, "dedup_id", "1 to 200 characters"),
        ({"debounce": {"key": "k", "wait_s": 1}}, "debounce", "ratchet.Debounce"),
        (
            {"debounce": ratchet.Debounce(key="k", wait_s=1), "dedup_id": "d"},
            "debounce",
            "takes no dedup_id",
        ),
        (
            {"debounce": ratchet.Debounce(key="k", wait_s=1), "run_id": "r"},
            "debounce",
            "takes no run_id",
        ),
    ],
)
def test_bad_start_options_are_refused_naming_the_field_and_nothing_is_written(
    db_url: str, options: dict[str, Any], field: str, message: str
) -> None:
    with starts_app.build(db_url) as app:
        with pytest.raises(ratchet.InvalidInput, match=message) as refused:
            app.start("echo", 1, **options)
        assert refused.value.field == field and str(refused.value).startswith(f"{field}: ")
        assert app.runs() == []


def test_a_debounce_refuses_a_window_that_is_no_window() -> None:
    for wait_s in (0, -1, float("nan"), 10**9):
        with pytest.raises(ratchet.InvalidInput, match="debounce.wait_s"):
            ratchet.Debounce(key="k", wait_s=wait_s)
    with pytest.raises(ratchet.InvalidInput, match="debounce.key"):
        ratchet.Debounce(key="", wait_s=1)


def test_a_batch_takes_each_start_option_and_a_duplicate_writes_nothing(db_url: str) -> None:
    with starts_app.build(db_url) as app:
        ids = app.start_many(
            "echo",
            [
                ratchet.Start(1, dedup_id="b-1"),
                ratchet.Start(2, delay_s=60),
                ratchet.Start(3, debounce=ratchet.Debounce(key="d", wait_s=60)),
                ratchet.Start(4, debounce=ratchet.Debounce(key="d", wait_s=60)),
                {"x": 5},
            ],
        )
        assert ids[2] == ids[3] and len(set(ids)) == 4
        assert [app.get(i).status for i in ids] == [
            RunStatus.QUEUED,
            RunStatus.WAITING,
            RunStatus.WAITING,
            RunStatus.WAITING,
            RunStatus.QUEUED,
        ]
        assert app.get(ids[2]).input == {"args": [4], "kwargs": {}}
        before = sorted(r.run_id for r in app.runs())
        with pytest.raises(ratchet.DuplicateStart, match="item 1: ") as refused:
            app.start_many(
                "echo", [ratchet.Start(6, dedup_id="b-2"), ratchet.Start(7, dedup_id="b-1")]
            )
        assert refused.value.run_id == ids[0]
        with pytest.raises(ratchet.BatchItemInvalid, match=r"item 1 \(delay_s\)"):
            app.start_many("echo", [ratchet.Start(6), ratchet.Start(7, delay_s=-3)])
        assert sorted(r.run_id for r in app.runs()) == before
