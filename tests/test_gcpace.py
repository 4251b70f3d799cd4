"""A worker of many runs paces the garbage collector's full collections by its runs'
turnover, and gives the process its thresholds back when it stops."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import ratchet
from ratchet.engine import gcpace
from ratchet.engine.gcpace import GcPacer


@pytest.fixture
def full_collections() -> Iterator[list[int]]:
    """How many generation-2 collections ran, as a one-item list updated in place."""
    seen = [0]

    def on(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            seen[0] += 1

    gc.callbacks.append(on)
    try:
        yield seen
    finally:
        gc.callbacks.remove(on)


def test_full_collections_wait_for_as_many_finished_runs_as_were_in_flight(
    full_collections: list[int],
) -> None:
    before = gc.get_threshold()
    with GcPacer(3000) as pacer:
        assert gc.get_threshold() == (before[0], before[1], gcpace._NEVER)
        for left in range(2999, 999, -1):  # 3,000 in flight, 2,000 of them finish
            pacer.run_finished(left)
        assert full_collections[0] == 0  # CPython would have walked the heap by now
        for left in range(999, -1, -1):
            pacer.run_finished(left)
        assert full_collections[0] == 1 and pacer.collections == 1
    assert gc.get_threshold() == before


def test_a_worker_of_few_runs_leaves_the_collector_alone(full_collections: list[int]) -> None:
    before = gc.get_threshold()
    with GcPacer(gcpace.PACE_FROM - 1) as pacer:
        assert gc.get_threshold() == before
        for left in range(5000):
            pacer.run_finished(left)
        assert pacer.collections == 0


def test_the_thresholds_come_back_when_the_last_pacing_worker_stops() -> None:
    before = gc.get_threshold()
    with GcPacer(5000):
        with GcPacer(2000):
            assert gc.get_threshold()[2] == gcpace._NEVER
        assert gc.get_threshold()[2] == gcpace._NEVER  # the other worker still runs
    assert gc.get_threshold() == before


def test_a_launched_worker_paces_while_it_runs_and_drives_runs_as_ever(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow(name="echo")
    async def echo(x: int) -> int:
        return x

    before = gc.get_threshold()
    app.launch(concurrency=gcpace.PACE_FROM)
    assert gc.get_threshold()[2] == gcpace._NEVER
    ids = app.start_many(echo, [(i,) for i in range(20)])
    assert [app.result(i, timeout_s=30) for i in ids] == list(range(20))
    app.shutdown()
    assert gc.get_threshold() == before
