"""The structured drive, on SQLite and PostgreSQL: stops by request at step boundaries,
parallel branches that park together, child ids, failures that must end a run, the lease
deadline, the worker's own threads for `def` steps, the sweep and transient storage errors.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from waiting import wait_for

import ratchet
from ratchet.engine.control import Control, StopReason
from ratchet.model import Event, EventKind, RunStatus


@pytest.fixture
def make_app(db_url: str) -> Iterator[Callable[..., ratchet.Ratchet]]:
    apps: list[ratchet.Ratchet] = []

    def make(**kw: Any) -> ratchet.Ratchet:
        kw.setdefault("lease_ttl", 60.0)  # only what a test sets up may end a lease
        kw.setdefault("recovery_interval", 60.0)
        app = ratchet.Ratchet(db_url, **kw)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.shutdown()


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def of_kind(events: list[Event], kind: str, step_id: str | None = None) -> list[Event]:
    return [e for e in events if e.kind == kind and (step_id is None or e.step_id == step_id)]


def drives(events: list[Event]) -> int:
    return len(of_kind(events, EventKind.RUN_STARTED) + of_kind(events, EventKind.RUN_RESUMED))


def check_ends_once(events: list[Event]) -> None:
    """Gapless, and exactly one terminal event: the last."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    terminal = [e for e in events if e.kind in (EventKind.RUN_SUCCEEDED, EventKind.RUN_FAILED,
                                                EventKind.RUN_CANCELLED)]
    assert terminal == [events[-1]], f"terminal events: {[(e.seq, e.kind) for e in terminal]}"


# -- 1. cancelling a busy run ----------------------------------------------------------------


def test_cancel_of_a_run_looping_over_quick_steps_stops_it_at_a_step_boundary(
        make_app: Callable[..., ratchet.Ratchet], monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app()  # a 60 s lease: only the announced cancel can end the run in time
    stops: list[tuple[StopReason, float]] = []
    stop = Control.stop

    def recording_stop(self: Control, reason: StopReason, **kw: Any) -> None:
        stops.append((reason, time.time()))
        stop(self, reason, **kw)

    monkeypatch.setattr(Control, "stop", recording_stop)

    @app.step()
    async def tick(i: int) -> int:
        return i

    @app.workflow()
    async def busy(n: int) -> int:
        return sum([await tick(i) for i in range(n)])

    app.launch()
    run_id = app.start(busy, 10_000)
    wait_for(lambda: len(app.events(run_id, after=20)) > 0, what="steps under way")
    began = time.monotonic()
    app.cancel(run_id)
    with pytest.raises(ratchet.RunCancelled):
        app.result(run_id, timeout_s=15)
    assert time.monotonic() - began < 5

    events = app.events(run_id)
    check_ends_once(events)
    assert of_kind(events, EventKind.RUN_CANCELLED)[0].payload == {"error": "cancelled"}
    [acknowledged] = [at for reason, at in stops if reason is StopReason.CANCEL]
    # Once the worker acted on the cancel no step started; the one in flight, if any, ended.
    started = of_kind(events, EventKind.STEP_STARTED)
    assert started and all(e.at <= acknowledged for e in started)
    assert len(started) < 10_000
    assert "step_failed" not in kinds(events)


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside_a_signal_wait"])
def test_cancel_while_an_async_step_sleeps_interrupts_it(
        make_app: Callable[..., ratchet.Ratchet], beside: bool) -> None:
    app = make_app()
    interrupted = threading.Event()

    @app.step()
    async def nap() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted.set()
            raise

    @app.workflow()
    async def sleepy() -> None:
        if beside:  # the waiting branch must not park the run while the step sleeps
            await asyncio.gather(nap(), ratchet.wait_for_signal("never"))
        else:
            await nap()

    worker = app.launch()
    run_id = app.start(sleepy)
    wait_for(lambda: "step_started" in kinds(app.events(run_id)), what="the step running")
    began = time.monotonic()
    app.cancel(run_id)
    with pytest.raises(ratchet.RunCancelled):
        app.result(run_id, timeout_s=15)
    wait_for(interrupted.is_set, timeout=5, what="the step interrupted")
    assert time.monotonic() - began < 5
    wait_for(lambda: not worker.active, what="the worker idle")
    events = app.events(run_id)
    check_ends_once(events)
    assert "step_completed" not in kinds(events) and "step_failed" not in kinds(events)
    assert worker.outcomes.get("cancelled") == 1


# -- 2. parallel branches --------------------------------------------------------------------


def test_a_step_beside_a_signal_wait_is_journaled_before_the_run_parks(
        make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()
    calls: Counter[str] = Counter()

    @app.step()
    async def slow() -> str:
        calls["slow"] += 1
        await asyncio.sleep(0.3)  # the work: still running when the other branch waits
        return "done"

    @app.workflow()
    async def both() -> list[Any]:
        return list(await asyncio.gather(slow(), ratchet.wait_for_signal("go")))

    app.launch()
    run_id = app.start(both)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, what="the run parked")
    parked = app.events(run_id)
    [completed] = of_kind(parked, EventKind.STEP_COMPLETED, "1:slow")
    assert completed.payload == {"output": "done"}
    app.signal(run_id, "go", {"by": "ana"})
    assert app.result(run_id, timeout_s=15) == ["done", {"by": "ana"}]
    assert calls == {"slow": 1}
    events = app.events(run_id)
    check_ends_once(events)
    assert len(of_kind(events, EventKind.STEP_STARTED, "1:slow")) == 1
    assert drives(events) == 2


def test_one_branch_failing_fails_the_run_and_stops_its_sibling(
        make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()
    long_started = asyncio.Event()
    interrupted = threading.Event()

    @app.step()
    async def long() -> str:
        long_started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted.set()
            raise
        return "late"

    @app.step()
    async def boom() -> None:
        await long_started.wait()  # fail while the sibling is in step code
        raise ValueError("boom")

    @app.workflow()
    async def pair() -> None:
        await asyncio.gather(long(), boom())

    worker = app.launch()
    run_id = app.start(pair)
    began = time.monotonic()
    with pytest.raises(ratchet.RunFailed, match="ValueError: boom"):
        app.result(run_id, timeout_s=15)
    assert time.monotonic() - began < 5
    assert interrupted.is_set()  # stopped before the run ended, not after
    wait_for(lambda: not worker.active, what="the worker idle")
    events = app.events(run_id)
    check_ends_once(events)
    assert [(e.kind, e.step_id) for e in events if e.step_id == "1:long"] == [
        ("step_started", "1:long")]
    assert of_kind(events, EventKind.STEP_FAILED, "2:boom")[0].payload["error"] == (
        "ValueError: boom")
    assert worker.outcomes.get("failed") == 1


def test_a_fan_out_of_quick_children_costs_no_park_per_child(
        make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()

    @app.step()
    async def compute(i: int) -> int:
        await asyncio.sleep(0.03 * i)  # quick, but ending one after another
        return i * i

    @app.workflow()
    async def square(i: int) -> int:
        return await compute(i)

    @app.workflow()
    async def fan(n: int) -> list[int]:
        return list(await asyncio.gather(*(ratchet.child(square, i) for i in range(n))))

    app.launch()
    run_id = app.start(fan, 10)
    assert app.result(run_id, timeout_s=15) == [i * i for i in range(10)]
    events = app.events(run_id)
    check_ends_once(events)
    assert drives(events) <= 2, kinds(events)
    children = sorted(r.run_id for r in app.runs() if r.parent_run_id == run_id)
    assert children == sorted(f"{run_id}/{i}" for i in range(1, 11))


def test_a_fan_out_of_slow_children_parks_once_with_every_child_created(
        make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()

    @app.workflow()
    async def gated(i: int) -> int:
        await ratchet.wait_for_signal("go")
        return i

    @app.workflow()
    async def fan(n: int) -> list[int]:
        return list(await asyncio.gather(*(ratchet.child(gated, i) for i in range(n))))

    app.launch()
    run_id = app.start(fan, 10)
    children = [f"{run_id}/{i}" for i in range(1, 11)]
    rec = wait_for(lambda: (r := app.get(run_id)).status == RunStatus.WAITING and r,
                   what="the parent parked")
    assert rec.waiting_for is not None and all(c in rec.waiting_for for c in children)
    assert sorted(r.run_id for r in app.runs() if r.parent_run_id == run_id) == sorted(children)
    assert drives(app.events(run_id)) == 1
    for child_id in children:
        wait_for(lambda c=child_id: app.get(c).status == RunStatus.WAITING,  # type: ignore[misc]
                 what=f"child {child_id} parked")
        app.signal(child_id, "go")
    assert app.result(run_id, timeout_s=15) == list(range(10))
    events = app.events(run_id)
    check_ends_once(events)
    assert len(of_kind(events, EventKind.STEP_STARTED)) == 10  # each child created once
