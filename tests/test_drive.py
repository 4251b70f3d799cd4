"""The structured drive, on SQLite and PostgreSQL: stops by request at step boundaries,
parallel branches that park together, child ids, failures that must end a run, the lease
deadline, the worker's own threads for `def` steps, the sweep and transient storage errors.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from waiting import wait_for

import ratchet
from ratchet.engine.control import Control, StopReason
from ratchet.engine.worker import Worker
from ratchet.model import ClaimedRun, Event, EventKind, RunStatus, dumps
from ratchet.store.base import Tx


@pytest.fixture
def make_app(make_app: Callable[..., ratchet.Ratchet]) -> Callable[..., ratchet.Ratchet]:
    """Long leases and a slow sweep: only what a test sets up may end a lease."""

    def make(**kw: Any) -> ratchet.Ratchet:
        kw.setdefault("lease_ttl", 60.0)
        kw.setdefault("recovery_interval", 60.0)
        return make_app(**kw)

    return make


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def of_kind(events: list[Event], kind: str, step_id: str | None = None) -> list[Event]:
    return [e for e in events if e.kind == kind and (step_id is None or e.step_id == step_id)]


def drives(events: list[Event]) -> int:
    return len(of_kind(events, EventKind.RUN_STARTED) + of_kind(events, EventKind.RUN_RESUMED))


def check_ends_once(events: list[Event]) -> None:
    """Gapless, and exactly one terminal event: the last."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    terminal = [
        e
        for e in events
        if e.kind in (EventKind.RUN_SUCCEEDED, EventKind.RUN_FAILED, EventKind.RUN_CANCELLED)
    ]
    assert terminal == [events[-1]], f"terminal events: {[(e.seq, e.kind) for e in terminal]}"


# -- 1. cancelling a busy run ----------------------------------------------------------------


def test_cancel_of_a_run_looping_over_quick_steps_stops_it_at_a_step_boundary(
    make_app: Callable[..., ratchet.Ratchet], monkeypatch: pytest.MonkeyPatch
) -> None:
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
    app.cancel(run_id)
    # Ten thousand steps outlast the wait; a lease renewal would bring the cancel only
    # after 20 s: ending in time at all is the announced cancel's doing.
    with pytest.raises(ratchet.RunCancelled):
        app.result(run_id, timeout_s=15)

    events = app.events(run_id)
    check_ends_once(events)
    ended = of_kind(events, EventKind.RUN_CANCELLED)[0].payload
    assert ended == {"error": "cancelled", "by": "request"}  # nobody was named
    # The cancel reaches the drive by its wake-up and again by any lease renewal that
    # lands before the drive has ended (a stop is idempotent): the first one counts.
    cancels = [at for reason, at in stops if reason is StopReason.CANCEL]
    assert cancels, stops
    acknowledged = min(cancels)
    # Once the worker acted on the cancel no step started; the one in flight, if any, ended.
    started = of_kind(events, EventKind.STEP_STARTED)
    assert started and all(e.at <= acknowledged for e in started)
    assert len(started) < 10_000
    assert "step_failed" not in kinds(events)


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside_a_signal_wait"])
def test_cancel_while_an_async_step_sleeps_interrupts_it(
    make_app: Callable[..., ratchet.Ratchet], beside: bool
) -> None:
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
    app.cancel(run_id)
    # The step sleeps 30 s: the run ending within 15 s means it was interrupted.
    with pytest.raises(ratchet.RunCancelled):
        app.result(run_id, timeout_s=15)
    wait_for(interrupted.is_set, timeout=5, what="the step interrupted")
    wait_for(lambda: not worker.active, what="the worker idle")
    events = app.events(run_id)
    check_ends_once(events)
    assert "step_completed" not in kinds(events) and "step_failed" not in kinds(events)
    assert worker.outcomes.get("cancelled") == 1


# -- 2. parallel branches --------------------------------------------------------------------


def test_a_step_beside_a_signal_wait_is_journaled_before_the_run_parks(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
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


def _crossed_branches(app: ratchet.Ratchet, calls: Counter[str], *, second_a: list[bool]) -> Any:
    """Two branches of two steps each whose steps finish in another order than they were
    called: a1 is called first and finishes after b2 is called; b2 finishes after a2 is
    called. Then the run parks on a signal, so the next drive replays all four."""
    b2_called, a2_called = asyncio.Event(), asyncio.Event()

    @app.step()
    async def a1() -> str:
        calls["a1"] += 1
        await b2_called.wait()
        return "a1"

    @app.step()
    async def a2() -> str:
        calls["a2"] += 1
        a2_called.set()
        return "a2"

    @app.step()
    async def b1() -> str:
        calls["b1"] += 1
        return "b1"

    @app.step()
    async def b2() -> str:
        calls["b2"] += 1
        b2_called.set()
        await a2_called.wait()
        return "b2"

    async def branch_a() -> str:
        first = await a1()
        return first + await a2() if second_a[0] else first

    async def branch_b() -> str:
        return await b1() + await b2()

    @app.workflow()
    async def crossed() -> list[Any]:
        done = list(await asyncio.gather(branch_a(), branch_b()))
        return [*done, await ratchet.wait_for_signal("go")]

    return crossed


def test_branches_whose_steps_finished_out_of_call_order_replay_in_the_journals_order(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    calls: Counter[str] = Counter()
    crossed = _crossed_branches(app, calls, second_a=[True])
    app.launch()
    run_id = app.start(crossed)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, what="the run parked")
    first = {e.step_id: e.seq for e in of_kind(app.events(run_id), EventKind.STEP_STARTED)}
    assert list(first) == ["1:a1", "2:b1", "3:b2", "4:a2"]  # a2 was called after b2
    app.signal(run_id, "go", "now")
    assert app.result(run_id, timeout_s=15) == ["a1a2", "b1b2", "now"]
    assert calls == {"a1": 1, "a2": 1, "b1": 1, "b2": 1}  # the replay ran none again
    events = app.events(run_id)
    check_ends_once(events)
    assert drives(events) == 2


def test_a_replay_waiting_for_a_call_the_code_no_longer_makes_fails_as_non_deterministic(
    make_app: Callable[..., ratchet.Ratchet], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratchet.engine import replay

    monkeypatch.setattr(replay, "REPLAY_STALL_S", 0.5)
    app = make_app()
    calls: Counter[str] = Counter()
    second_a = [True]
    crossed = _crossed_branches(app, calls, second_a=second_a)
    app.launch()
    run_id = app.start(crossed)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, what="the run parked")
    second_a[0] = False  # the code changed under the parked run: branch a ends after a1
    app.signal(run_id, "go", "now")
    with pytest.raises(ratchet.RunFailed, match="NonDeterminismError"):
        app.result(run_id, timeout_s=15)
    assert calls == {"a1": 1, "a2": 1, "b1": 1, "b2": 1}


def test_one_branch_failing_fails_the_run_and_stops_its_sibling(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
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
    # The sibling sleeps 30 s: the run ending within 15 s means it was interrupted.
    with pytest.raises(ratchet.RunFailed, match="ValueError: boom"):
        app.result(run_id, timeout_s=15)
    assert interrupted.is_set()  # stopped before the run ended, not after
    wait_for(lambda: not worker.active, what="the worker idle")
    events = app.events(run_id)
    check_ends_once(events)
    assert [(e.kind, e.step_id) for e in events if e.step_id == "1:long"] == [
        ("step_started", "1:long")
    ]
    assert of_kind(events, EventKind.STEP_FAILED, "2:boom")[0].payload["error"] == (
        "ValueError: boom"
    )
    assert worker.outcomes.get("failed") == 1


def test_a_fan_out_of_quick_children_costs_no_park_per_child(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
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
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
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
    rec = wait_for(
        lambda: (r := app.get(run_id)).status == RunStatus.WAITING and r, what="the parent parked"
    )
    assert rec.waiting_for is not None and all(c in rec.waiting_for for c in children)
    assert sorted(r.run_id for r in app.runs() if r.parent_run_id == run_id) == sorted(children)
    assert drives(app.events(run_id)) == 1
    for child_id in children:
        wait_for(
            lambda c=child_id: app.get(c).status == RunStatus.WAITING,
            what=f"child {child_id} parked",
        )
        app.signal(child_id, "go")
    assert app.result(run_id, timeout_s=15) == list(range(10))
    events = app.events(run_id)
    check_ends_once(events)
    assert len(of_kind(events, EventKind.STEP_STARTED)) == 10  # each child created once


# -- 3. child ids ----------------------------------------------------------------------------


def test_a_user_run_named_like_the_old_child_ids_is_not_taken_for_the_child(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def kid() -> str:
        return "the child's"

    @app.workflow()
    async def impostor() -> str:
        return "someone else's"

    @app.workflow()
    async def parent() -> str:
        return str(await ratchet.child(kid))

    app.launch()
    assert app.result(app.start(impostor, run_id="order-7-1"), timeout_s=15) == "someone else's"
    run_id = app.start(parent, run_id="order-7")
    assert app.result(run_id, timeout_s=15) == "the child's"
    [child] = [r for r in app.runs() if r.parent_run_id == run_id]
    assert child.run_id == "order-7/1" and "/" in child.run_id
    assert child.workflow == "kid" and child.parent_step_id == "1:child:kid"
    assert app.get("order-7-1").parent_run_id is None


def test_a_retried_run_whose_child_failed_starts_a_new_child(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    broken = {"kid": True}
    calls: Counter[str] = Counter()

    @app.step()
    async def before() -> str:
        calls["before"] += 1
        return "kept"

    @app.workflow()
    async def kid() -> str:
        if broken["kid"]:
            raise RuntimeError("kid broke")
        return "fixed"

    @app.workflow()
    async def parent() -> list[str]:
        return [await before(), str(await ratchet.child(kid))]

    app.launch()
    run_id = app.start(parent)
    with pytest.raises(ratchet.RunFailed, match="kid broke"):
        app.result(run_id, timeout_s=15)
    assert [d.reason for d in app.dead_letters() if d.run_id == run_id] == ["step_failed"]

    broken["kid"] = False
    app.retry(run_id)
    assert app.result(run_id, timeout_s=15) == ["kept", "fixed"]
    assert calls == {"before": 1}
    children = {r.run_id: r.status for r in app.runs() if r.parent_run_id == run_id}
    assert children == {f"{run_id}/2": RunStatus.FAILED, f"{run_id}/2.2": RunStatus.SUCCEEDED}
    started = of_kind(app.events(run_id), EventKind.STEP_STARTED, "2:child:kid")
    assert [(e.attempt, e.payload["child_run_id"]) for e in started] == [
        (1, f"{run_id}/2"),
        (2, f"{run_id}/2.2"),
    ]


def test_a_retried_run_whose_signal_timed_out_waits_again_with_a_fresh_deadline(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def approval() -> Any:
        return await ratchet.wait_for_signal("approve", timeout_s=600)

    app.launch()
    run_id = app.start(approval)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, what="the run parked")
    app.clock.advance(601)
    with pytest.raises(ratchet.RunFailed, match="no signal 'approve' arrived within 600s"):
        app.result(run_id, timeout_s=15)

    app.retry(run_id)
    rec = wait_for(
        lambda: (r := app.get(run_id)).status in (RunStatus.WAITING, RunStatus.FAILED) and r,
        what="the retried run parked or failed",
    )
    assert rec.status == RunStatus.WAITING, rec.error
    first, second = [
        e.payload["deadline"] for e in app.events(run_id) if e.kind == EventKind.STEP_WAITING
    ]
    assert second >= first + 601
    app.signal(run_id, "approve", {"by": "ana"})
    assert app.result(run_id, timeout_s=15) == {"by": "ana"}
    assert kinds(app.events(run_id))[-1] == "run_succeeded"


# -- 4. failures that loop -------------------------------------------------------------------


@pytest.mark.parametrize("raised", ["SystemExit", "KeyboardInterrupt"])
@pytest.mark.parametrize("kind", ["async", "def", "async_timeout", "def_timeout"])
def test_a_step_raising_a_base_exception_fails_after_its_attempts(
    make_app: Callable[..., ratchet.Ratchet], raised: str, kind: str
) -> None:
    app = make_app()
    attempts: list[int] = []
    error: type[BaseException] = SystemExit if raised == "SystemExit" else KeyboardInterrupt
    retry = ratchet.Retry(max_attempts=2, backoff_ms=1)

    def body() -> None:
        attempts.append(ratchet.current_step().attempt)
        raise error(2)

    timeout_s = 10 if kind.endswith("_timeout") else None
    if kind.startswith("def"):

        @app.step(name="quit", retry=retry, timeout_s=timeout_s)
        def quit_def() -> None:
            body()

        step: Callable[[], Any] = quit_def
    else:

        @app.step(name="quit", retry=retry, timeout_s=timeout_s)
        async def quit_async() -> None:  # with a timeout: stops a whole worker on main
            body()

        step = quit_async

    @app.workflow()
    async def wf() -> None:
        await step()

    worker = app.launch()
    run_id = app.start(wf)
    with pytest.raises(ratchet.RunFailed, match=f"{raised}: 2"):
        app.result(run_id, timeout_s=15)
    assert attempts == [1, 2]
    events = app.events(run_id)
    check_ends_once(events)
    [failed] = of_kind(events, EventKind.STEP_FAILED, "1:quit")
    assert failed.attempt == 2 and failed.payload["error_type"] == raised
    assert [e.attempt for e in of_kind(events, EventKind.STEP_STARTED)] == [1, 2]
    assert [d.reason for d in app.dead_letters()] == ["step_failed"]
    wait_for(lambda: not worker.active, what="the worker idle")
    assert worker.outcomes.get("failed") == 1


def test_a_step_error_holding_nul_fails_the_run_on_both_backends(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.step()
    async def nul() -> None:
        raise ValueError("bad\x00byte")

    @app.workflow()
    async def wf() -> None:
        await nul()

    worker = app.launch()
    run_id = app.start(wf)
    with pytest.raises(ratchet.RunFailed, match=r"ValueError: bad\\x00byte"):
        app.result(run_id, timeout_s=15)
    rec = app.get(run_id)
    assert rec.error is not None and "bad\\x00byte" in rec.error and "\x00" not in rec.error
    events = app.events(run_id)
    check_ends_once(events)
    assert of_kind(events, EventKind.STEP_FAILED)[0].payload["error"] == "ValueError: bad\\x00byte"
    assert [d.error for d in app.dead_letters()] == [rec.error]
    assert worker.outcomes.get("aborted") is None


def test_a_steps_own_timeout_error_is_not_taken_for_its_timeout(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.step(timeout_s=10)
    async def upstream() -> None:
        raise TimeoutError("upstream took too long")

    @app.workflow()
    async def wf() -> None:
        await upstream()

    app.launch()
    run_id = app.start(wf)
    with pytest.raises(ratchet.RunFailed, match="TimeoutError: upstream took too long"):
        app.result(run_id, timeout_s=15)
    [failed] = of_kind(app.events(run_id), EventKind.STEP_FAILED)
    assert failed.payload["error_type"] == "TimeoutError"


# -- 6. the lease deadline -------------------------------------------------------------------


def test_a_drive_whose_renewals_fail_past_the_ttl_stops_its_step(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app(lease_ttl=1.0)
    store = app.store
    renew = store.renew
    failing = threading.Event()
    interrupted = threading.Event()
    # In the order they happened, on the worker's own clock: each failed renewal with the
    # drive's lease deadline as the worker then had it, and the step's interruption.
    happened: list[tuple[str, float, float]] = []

    async def flaky_renew(*args: Any, **kwargs: Any) -> Any:
        if failing.is_set():
            for active in worker.active.values():  # none once the drive has stopped
                happened.append(("renew_failed", time.monotonic(), active.deadline))
            raise ratchet.StorageError("PostgreSQL: server closed the connection unexpectedly")
        return await renew(*args, **kwargs)

    store.renew = flaky_renew  # type: ignore[method-assign]

    @app.step()
    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            happened.append(("interrupted", time.monotonic(), 0.0))
            interrupted.set()
            raise

    @app.workflow()
    async def wf() -> None:
        await forever()

    worker = app.launch()
    run_id = app.start(wf)
    wait_for(lambda: "step_started" in kinds(app.events(run_id)), what="the step running")
    failing.set()
    wait_for(lambda: worker.outcomes.get("lease_lost") == 1, timeout=15, what="lease_lost")
    assert interrupted.is_set()
    # By the TTL, not long after: the step was interrupted past its lease's deadline, at
    # the first renewal failing past it, before the next one was tried.
    what = [kind for kind, _, _ in happened]
    assert what.count("interrupted") == 1, what
    cut = what.index("interrupted")
    failed, interrupted_at = happened[:cut], happened[cut][1]
    assert failed, what  # renewals failed first
    deadline = failed[-1][2]
    assert all(d == deadline for _, _, d in failed)  # no renewal landed meanwhile
    assert interrupted_at >= deadline
    past = [at for _, at, _ in failed if at >= deadline]
    assert len(past) <= 1, f"{len(past)} renewals failed past the deadline before the stop"
    assert not worker.active
    events = app.events(run_id)
    assert kinds(events)[-1] == "step_started"  # nothing written without the lease
    assert app.get(run_id).status == RunStatus.RUNNING  # for the sweep of a live worker


# -- 7. threads for `def` steps --------------------------------------------------------------


def test_def_steps_are_not_capped_at_asyncios_default_pool(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    barrier = threading.Barrier(16, timeout=10)  # only stops a hung test

    @app.step()
    def meet(i: int) -> int:
        barrier.wait()  # all 16 at once, or none
        return i

    @app.workflow()
    async def wf(i: int) -> int:
        return await meet(i)

    app.launch(concurrency=16)
    run_ids = [app.start(wf, i) for i in range(16)]
    assert [app.result(r, timeout_s=15) for r in run_ids] == list(range(16))


def test_a_timed_out_def_step_does_not_starve_later_ones(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    release = threading.Event()

    @app.step(timeout_s=0.2)
    def hang() -> None:
        release.wait(3)  # past its timeout: abandoned, its thread still busy

    @app.step(timeout_s=0.2)
    def trivial(i: int) -> int:
        return i

    @app.workflow()
    async def wf(i: int) -> int:
        try:
            await hang()
        except ratchet.StepFailed as e:
            assert "StepTimeout" in str(e)
        return await trivial(i)

    app.launch(concurrency=4)
    try:
        run_ids = [app.start(wf, i) for i in range(20)]
        assert [app.result(r, timeout_s=15) for r in run_ids] == list(range(20))
    finally:
        release.set()
    for run_id in run_ids:
        [failed] = of_kind(app.events(run_id), EventKind.STEP_FAILED)
        assert failed.step_id == "1:hang" and failed.payload["error_type"] == "StepTimeout"


# -- 8. a step its workflow abandons ---------------------------------------------------------


def test_a_step_abandoned_by_asyncio_wait_for_is_not_run_again_on_a_re_drive(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    calls: Counter[str] = Counter()

    @app.step()
    async def slow() -> str:
        calls["slow"] += 1
        await asyncio.sleep(30)
        return "late"

    @app.workflow()
    async def impatient() -> list[Any]:
        try:
            got = await asyncio.wait_for(slow(), 0.1)
        except TimeoutError:
            got = "gave up"
        return [got, await ratchet.wait_for_signal("go")]

    app.launch()
    run_id = app.start(impatient)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, what="the run parked")
    app.signal(run_id, "go", 1)
    assert app.result(run_id, timeout_s=15) == ["gave up", 1]
    assert calls == {"slow": 1}
    events = app.events(run_id)
    check_ends_once(events)
    assert drives(events) == 2
    [failed] = of_kind(events, EventKind.STEP_FAILED, "1:slow")
    assert failed.payload["error_type"] == "StepAbandoned"


# -- 9. a step that kills its worker every time ----------------------------------------------


def _install_journal(
    app: ratchet.Ratchet,
    run_id: str,
    workflow: str,
    entries: list[tuple[str, str | None, int | None, dict[str, Any]]],
) -> None:
    """Write a queued run whose journal holds ``entries`` after its ``run_queued``, as a
    worker that died after each of them would have left it."""
    events: list[Event] = []
    prev = "0" * 64
    at = time.time() - 60
    for kind, step_id, attempt, payload in [
        (EventKind.RUN_QUEUED, None, None, {"workflow": workflow, "version": "1"}),
        *entries,
    ]:
        ev = Event.chain(run_id, len(events) + 1, kind, step_id, attempt, payload, at, prev)
        events.append(ev)
        prev, at = ev.hash, at + 1

    def body(tx: Tx) -> None:
        tx.run(
            "run_insert",
            {
                "run_id": run_id,
                "workflow": workflow,
                "workflow_version": "1",
                "input": dumps({"args": [], "kwargs": {}}),
                "parent_run_id": None,
                "parent_step_id": None,
                "queue": "default",
                "priority": 0,
                "tenant_id": "default",
                "tags": "{}",
                "concurrency_key": None,
            },
        )
        app.store._insert_events(tx, events)

    app.portal.call(app.store._run(body))


@pytest.mark.parametrize("starts", [4, 5])
def test_an_attempt_started_five_times_fails_as_a_crash_loop(
    make_app: Callable[..., ratchet.Ratchet], starts: int
) -> None:
    app = make_app()
    calls: Counter[str] = Counter()

    @app.step()
    async def fatal() -> str:
        calls["fatal"] += 1
        return "survived"

    @app.workflow()
    async def doomed() -> str:
        return str(await fatal())

    run_id = "crashy-1"
    key = ratchet.model.idempotency_key(run_id, "1:fatal", 1)
    entries: list[tuple[str, str | None, int | None, dict[str, Any]]] = []
    for n in range(1, starts + 1):
        entries.append(
            (
                EventKind.RUN_STARTED if n == 1 else EventKind.RUN_RESUMED,
                None,
                None,
                {
                    "worker_id": f"w{n}",
                    "epoch": n,
                    "reason": "claim" if n == 1 else "sweep",
                    "drive": n,
                },
            )
        )
        entries.append(
            (
                EventKind.STEP_STARTED,
                "1:fatal",
                1,
                {"idempotency_key": key} | ({"resumed": True} if n > 1 else {}),
            )
        )
        # A drive after a storage failure, on the same worker, does not count.
        entries.append(
            (
                EventKind.RUN_RESUMED,
                None,
                None,
                {"worker_id": f"w{n}", "epoch": n + 100, "reason": "retry", "drive": n},
            )
        )
        entries.append(
            (EventKind.STEP_STARTED, "1:fatal", 1, {"idempotency_key": key, "resumed": True})
        )
    _install_journal(app, run_id, "doomed", entries)
    # The worker of the last start died too: its lease ran out, and the sweep takes the run.
    taken = app.portal.call(app.store.claim("dead", 1.0, 1, ["default"], [("doomed", "1")]))
    assert len(taken) == 1
    app.clock.advance(2.0)
    app.launch(recovery_interval=0.2)
    if starts < 5:  # the fifth start is allowed: the step runs, once
        assert app.result(run_id, timeout_s=15) == "survived"
        assert calls == {"fatal": 1}
        return
    with pytest.raises(ratchet.RunFailed, match="attempt 1 was started 5 times and never"):
        app.result(run_id, timeout_s=15)
    assert calls == {}
    events = app.events(run_id)
    check_ends_once(events)
    [failed] = of_kind(events, EventKind.STEP_FAILED, "1:fatal")
    assert failed.attempt == 1 and failed.payload["error_type"] == "StepCrashLoop"
    [dead] = app.dead_letters()
    assert dead.run_id == run_id and dead.reason == "crash_loop"


# -- 10. the sweep ---------------------------------------------------------------------------


def test_one_sweep_takes_every_orphan_when_its_passes_come_back_full(
    make_app: Callable[..., ratchet.Ratchet], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()
    # One sweep of three passes, not three sweeps an interval apart: each pass notes how
    # many times the sweep loop had waited out its interval by then.
    interval = 3.0
    waits = 0
    passes: list[tuple[int, int]] = []
    sweep, sleep = Worker.sweep, asyncio.sleep

    async def recording_sweep(self: Worker) -> list[ClaimedRun]:
        taken = await sweep(self)
        passes.append((waits, len(taken)))
        return taken

    async def counting_sleep(delay: float, *args: Any) -> Any:
        nonlocal waits
        if delay == interval:  # the sweep loop's wait; nothing else sleeps this long
            waits += 1
        return await sleep(delay, *args)

    monkeypatch.setattr(Worker, "sweep", recording_sweep)
    monkeypatch.setattr(asyncio, "sleep", counting_sleep)

    @app.workflow()
    async def orphan(i: int) -> int:
        return i

    run_ids = [app.start(orphan, i) for i in range(45)]
    # A worker that died holding all 45: their leases ran out a second ago.
    taken = app.portal.call(app.store.claim("dead", 1.0, 45, ["default"], [("orphan", "1")]))
    assert len(taken) == 45
    app.clock.advance(2.0)

    app.launch(concurrency=64, recovery_interval=interval)
    assert [app.result(r, timeout_s=15) for r in run_ids] == list(range(45))
    took = [(at, n) for at, n in passes if n]
    assert [n for _, n in took] == [20, 20, 5]
    assert len({w for w, _ in took}) == 1, passes  # no interval waited between the passes
    for run_id in run_ids:
        [started] = of_kind(app.events(run_id), EventKind.RUN_STARTED)
        assert started.payload["reason"] == "sweep"


# -- 11. cancel reaches children -------------------------------------------------------------


def child_of(app: ratchet.Ratchet, run_id: str) -> str:
    """The id of the run's one child, once it exists."""
    found = wait_for(
        lambda: [r.run_id for r in app.runs() if r.parent_run_id == run_id],
        what=f"a child of {run_id}",
    )
    assert len(found) == 1
    return str(found[0])


def test_cancelling_a_parent_cancels_its_waiting_child_at_once(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def kid() -> Any:
        return await ratchet.wait_for_signal("go")

    @app.workflow()
    async def parent() -> Any:
        return await ratchet.child(kid)

    app.launch()
    run_id = app.start(parent)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, what="the parent parked")
    child_id = child_of(app, run_id)
    assert app.get(child_id).status == RunStatus.WAITING
    assert app.cancel(run_id, by="ana") == RunStatus.CANCELLED
    assert app.get(child_id).status == RunStatus.CANCELLED  # in the same transaction
    for rid in (run_id, child_id):
        events = app.events(rid)
        check_ends_once(events)
        [ended] = of_kind(events, EventKind.RUN_CANCELLED)
        assert ended.payload == {"by": "ana"}  # the child too: cancelled by the same person


def test_cancelling_a_parent_stops_a_child_a_worker_is_running(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    interrupted = threading.Event()

    @app.step()
    async def toil() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted.set()
            raise

    @app.workflow()
    async def kid() -> None:
        await toil()

    @app.workflow()
    async def parent() -> None:
        await ratchet.child(kid)

    worker = app.launch()
    run_id = app.start(parent)
    child_id = child_of(app, run_id)
    wait_for(lambda: "step_started" in kinds(app.events(child_id)), what="the child's step running")
    app.cancel(run_id)
    # The child's step sleeps 30 s: both ending within 15 s means it was interrupted.
    for rid in (run_id, child_id):
        with pytest.raises(ratchet.RunCancelled):
            app.result(rid, timeout_s=15)
    assert interrupted.is_set()
    wait_for(lambda: not worker.active, what="the worker idle")
    for rid in (run_id, child_id):
        events = app.events(rid)
        check_ends_once(events)
        assert len(of_kind(events, EventKind.RUN_CANCELLED)) == 1
    assert [e.kind for e in app.events(child_id) if e.step_id == "1:toil"] == ["step_started"]
    assert worker.outcomes.get("cancelled") == 2


# -- 12. a transient storage error -----------------------------------------------------------


def _fails_once(store: Any, method: str) -> list[int]:
    """Make ``store.<method>`` raise a StorageError on its first call; the calls, counted."""
    real = getattr(store, method)
    calls: list[int] = []

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ratchet.StorageError("PostgreSQL: server closed the connection unexpectedly")
        return await real(*args, **kwargs)

    setattr(store, method, flaky)
    return calls


def test_a_failed_park_is_retried_on_the_same_worker(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()  # a 60 s lease: only a retry on this worker, not the sweep, is in time
    _fails_once(app.store, "park")
    calls: list[ratchet.StepInfo] = []

    @app.step()
    async def first() -> str:
        calls.append(ratchet.current_step())
        return "a"

    @app.workflow()
    async def wf() -> list[Any]:
        return [await first(), await ratchet.wait_for_signal("go")]

    worker = app.launch()
    run_id = app.start(wf)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, timeout=5, what="the run parked")
    assert worker.outcomes.get("aborted") == 1 and worker.outcomes.get("parked") == 1
    events = app.events(run_id)
    runs = [e.payload for e in events if e.kind in ("run_started", "run_resumed")]
    # The same worker again, under a new epoch that fences the abandoned drive.
    assert len(runs) == 2 and len({d["worker_id"] for d in runs}) == 1
    assert [d["reason"] for d in runs] == ["claim", "retry"]
    # The failed park took the step's completion with it: the step ran again, same key.
    assert [(c.attempt, c.idempotency_key) for c in calls] == [(1, calls[0].idempotency_key)] * 2
    app.signal(run_id, "go", "b")
    assert app.result(run_id, timeout_s=15) == ["a", "b"]
    check_ends_once(app.events(run_id))


def test_a_storage_error_in_a_guards_read_is_retried_not_the_runs_failure(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()  # a 60 s lease: only a retry on this worker, not the sweep, is in time
    # The retry storm guard's count, after the first failed attempt.
    reads = _fails_once(app.store, "recent_retries")
    attempts: list[int] = []

    @app.step(retry=ratchet.Retry(max_attempts=3, backoff_ms=10))
    async def flaky() -> str:
        attempts.append(ratchet.current_step().attempt)
        if len(attempts) == 1:
            raise ratchet.ConnectorError("first attempt fails")
        return "ok"

    @app.workflow()
    async def wf() -> str:
        return await flaky()

    worker = app.launch()
    run_id = app.start(wf)
    assert app.result(run_id, timeout_s=15) == "ok"
    assert worker.outcomes.get("aborted") == 1 and len(reads) == 1
    # The abandoned drive's step_retrying never landed: the attempt in flight runs again.
    assert attempts == [1, 1]
    runs = [
        e.payload["reason"] for e in app.events(run_id) if e.kind in ("run_started", "run_resumed")
    ]
    assert runs == ["claim", "retry"]
    check_ends_once(app.events(run_id))
