"""Schedules fired by several worker processes, on SQLite and PostgreSQL: exactly one run
per tick, consecutive ticks, and a worker SIGKILLed loses or doubles none. (Downtime and
the missed policies are in test_schedules.py, with the scheduler's clock injected.)"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import schedule_app
from proc import Harness
from waiting import wait_for

from ratchet.engine.schedules import tick_run_id

pytestmark = pytest.mark.crash


@pytest.fixture
def sh(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, app=schedule_app)
    try:
        yield harness
    finally:
        harness.close()


def tick_runs(h: Harness) -> list[str]:
    return sorted(r.run_id for r in h.app.runs(limit=1000, workflow="tick"))


def check_one_run_per_tick(ids: list[str]) -> list[float]:
    """Each run is a tick's (its id derived from it), and the ticks are consecutive seconds."""
    ticks = [datetime.fromisoformat(i.removeprefix("sched:tick:")).timestamp() for i in ids]
    assert ids == [tick_run_id("tick", t) for t in ticks]  # nothing but ticks, no double
    assert ticks == [ticks[0] + k for k in range(len(ticks))], f"gaps in {ids}"
    return ticks


def test_three_workers_fire_each_tick_once_and_a_killed_one_loses_none(sh: Harness) -> None:
    h = sh
    workers = [h.spawn(f"w{i}") for i in range(3)]
    for w in workers:
        w.wait_started()
    wait_for(lambda: len(tick_runs(h)) >= 3, timeout=20, what="three ticks")
    workers[0].kill()
    before = len(tick_runs(h))
    wait_for(lambda: len(tick_runs(h)) >= before + 3, timeout=20, what="ticks after the kill")
    for w in workers[1:]:
        w.terminate()
        w.wait_exit()
    ids = tick_runs(h)
    ticks = check_one_run_per_tick(ids)
    assert len(ticks) >= 6
    # Every run was driven to the end by a worker, with the tick's time as its `at`.
    done = [r for r in h.app.runs(limit=1000, workflow="tick") if r.status == "succeeded"]
    assert done, h.worker_logs()
    r = done[0]
    at = h.app.result(r.run_id, timeout_s=0)
    assert tick_run_id("tick", datetime.fromisoformat(at).timestamp()) == r.run_id
    assert datetime.fromisoformat(at).tzinfo is not None
    # The schedule's last fired tick is the newest run's.
    [row] = h.app.schedules()
    assert row["last_fired"] == datetime.fromtimestamp(ticks[-1], UTC).isoformat()

