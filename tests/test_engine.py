"""The engine in one process, on SQLite and PostgreSQL: steps, replay, retries, parking,
child runs, cancellation and the errors users see."""

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
from ratchet.model import RunStatus, fold


def kinds(app: ratchet.Ratchet, run_id: str) -> list[str]:
    return [e.kind for e in app.events(run_id)]


def test_steps_run_once_and_the_result_comes_back(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()
    seen: list[ratchet.StepInfo] = []

    @app.step()
    async def double(x: int) -> int:
        seen.append(ratchet.current_step())
        return x * 2

    @app.step()
    def add(a: int, b: int) -> int:  # a plain def runs in a thread, context intact
        seen.append(ratchet.current_step())
        return a + b

    @app.workflow()
    async def calc(x: int) -> dict[str, int]:
        y = await double(x)
        return {"z": await add(y, 1)}

    app.launch()
    run_id = app.start(calc, 5)
    assert app.result(run_id, timeout_s=15) == {"z": 11}
    assert [s.step_id for s in seen] == ["1:double", "2:add"]
    info = seen[0]
    assert info.run_id == run_id and info.attempt == 1 and info.lease_epoch >= 1
    assert info.idempotency_key == ratchet.model.idempotency_key(run_id, "1:double", 1)
    assert kinds(app, run_id) == [
        "run_queued",
        "run_started",
        "step_started",
        "step_completed",
        "step_started",
        "step_completed",
        "run_succeeded",
    ]
    assert app.get(run_id).status == RunStatus.SUCCEEDED


def test_completed_steps_are_not_invoked_again_on_redrive(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    calls: Counter[str] = Counter()

    @app.step()
    async def one() -> str:
        calls["one"] += 1
        return "a"

    @app.step()
    async def two(v: str) -> str:
        calls["two"] += 1
        return v + "b"

    @app.workflow()
    async def wf() -> str:
        a = await one()
        go = await ratchet.wait_for_signal("go")
        return await two(a + go["x"])

    app.launch()
    run_id = app.start(wf)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
    app.signal(run_id, "go", {"x": "-"})
    assert app.result(run_id, timeout_s=15) == "a-b"
    assert calls == {"one": 1, "two": 1}  # the re-drive after the signal replayed `one`
    events = app.events(run_id)
    assert [e.kind for e in events].count("run_resumed") == 1
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_redriving_a_finished_run_is_a_noop(make_app: Callable[..., ratchet.Ratchet]) -> None:
    from ratchet.engine.control import Control
    from ratchet.engine.driver import drive
    from ratchet.model import ClaimedRun, Lease

    app = make_app()
    calls = Counter[str]()

    @app.step()
    async def once() -> int:
        calls["once"] += 1
        return 1

    @app.workflow()
    async def wf() -> int:
        return await once()

    app.launch()
    run_id = app.start(wf)
    assert app.result(run_id, timeout_s=15) == 1
    before = app.events(run_id)
    claimed = ClaimedRun(app.get(run_id), Lease(run_id, "other", 99), "claim")
    outcome = app.portal.call(drive(app.store, claimed, app.workflows, Control()))
    assert outcome == "noop" and calls["once"] == 1 and app.events(run_id) == before


def test_retries_journal_each_attempt_and_exhaustion_dead_letters(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    state = {"fail": True}
    attempts: list[int] = []

    @app.step()
    async def first() -> str:
        return "kept"

    @app.step(retry=ratchet.Retry(max_attempts=3, backoff_ms=5, retry_on=["connector"]))
    async def flaky(v: str) -> str:
        attempts.append(ratchet.current_step().attempt)
        if state["fail"]:
            raise ratchet.ConnectorError("upstream 503")
        return v + "!"

    @app.workflow()
    async def wf() -> str:
        return await flaky(await first())

    app.launch()
    run_id = app.start(wf)
    with pytest.raises(ratchet.RunFailed, match="upstream 503"):
        app.result(run_id, timeout_s=15)
    events = app.events(run_id)
    retrying = [e.payload for e in events if e.kind == "step_retrying"]
    assert [(p["attempt"], p["of"]) for p in retrying] == [(1, 3), (2, 3)]
    assert all("ConnectorError: upstream 503" in p["error"] for p in retrying)
    assert [e.kind for e in events][-2:] == ["step_failed", "run_failed"]
    assert attempts == [1, 2, 3]
    [dead] = app.dead_letters()
    assert dead.run_id == run_id and dead.reason == "step_failed"

    state["fail"] = False
    app.retry(run_id)  # resumes after its last completed step, with a fresh budget
    assert app.result(run_id, timeout_s=15) == "kept!"
    assert attempts == [1, 2, 3, 4]
    assert app.dead_letters() == []
    started = [e for e in app.events(run_id) if e.kind == "step_started"]
    assert [(e.step_id, e.attempt) for e in started] == [
        ("1:first", 1),
        ("2:flaky", 1),
        ("2:flaky", 2),
        ("2:flaky", 3),
        ("2:flaky", 4),
    ]
    with pytest.raises(ratchet.NotDeadLettered):
        app.retry(run_id)


def test_errors_outside_retry_on_fail_at_once(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()
    attempts: list[int] = []

    @app.step(retry=ratchet.Retry(max_attempts=5, backoff_ms=1, retry_on=["llm"]))
    async def strict() -> None:
        attempts.append(ratchet.current_step().attempt)
        raise ValueError("bad prompt")

    @app.workflow()
    async def wf() -> None:
        await strict()

    app.launch()
    run_id = app.start(wf)
    with pytest.raises(ratchet.RunFailed, match="ValueError: bad prompt"):
        app.result(run_id, timeout_s=15)
    assert attempts == [1]


def test_step_timeout_is_a_retryable_timeout(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()
    attempts: list[int] = []

    @app.step(
        retry=ratchet.Retry(max_attempts=2, backoff_ms=1, retry_on=["timeout"]), timeout_s=0.05
    )
    async def slow() -> str:
        attempts.append(ratchet.current_step().attempt)
        if len(attempts) == 1:
            await asyncio.sleep(30)
        return "done"

    @app.workflow()
    async def wf() -> str:
        return await slow()

    app.launch()
    run_id = app.start(wf)
    assert app.result(run_id, timeout_s=15) == "done"
    [retry] = [e.payload for e in app.events(run_id) if e.kind == "step_retrying"]
    assert "StepTimeout" in retry["error"] and "0.05s" in retry["error"]


def test_a_long_backoff_parks_the_run_until_its_time(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    attempts: list[int] = []

    @app.step(retry=ratchet.Retry(max_attempts=2, backoff_ms=60_000))
    async def later() -> int:
        attempts.append(ratchet.current_step().attempt)
        if len(attempts) == 1:
            raise ratchet.ToolError("rate limited")
        return len(attempts)

    @app.workflow()
    async def wf() -> int:
        return await later()

    app.launch()
    run_id = app.start(wf)
    rec = wait_for(lambda: (r := app.get(run_id)).status == RunStatus.WAITING and r)
    assert rec.waiting_for == "backoff:1:later" and rec.not_before is not None
    app.clock.advance(61)  # the store's clock: no sleeping through the backoff
    assert app.result(run_id, timeout_s=15) == 2
    assert attempts == [1, 2]


def test_durable_sleep_parks_and_frees_the_worker(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()

    @app.workflow()
    async def napper() -> str:
        await ratchet.sleep(3600)
        return "rested"

    worker = app.launch(concurrency=1)
    run_id = app.start(napper)
    rec = wait_for(lambda: (r := app.get(run_id)).status == RunStatus.WAITING and r)
    assert rec.waiting_for == "sleep:1:sleep"
    assert wait_for(lambda: not worker.active)  # the only slot is free again
    app.clock.advance(3601)
    assert app.result(run_id, timeout_s=15) == "rested"


def test_signal_timeout_raises_in_the_workflow(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()

    @app.workflow()
    async def wf() -> str:
        try:
            await ratchet.wait_for_signal("approve", timeout_s=600)
        except ratchet.SignalTimeout as e:
            return f"timed out: {e}"
        return "approved"

    app.launch()
    run_id = app.start(wf)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
    app.clock.advance(601)
    assert "no signal 'approve' arrived within 600s" in app.result(run_id, timeout_s=15)


def test_child_run_is_found_again_not_spawned_twice(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def summarize(pages: list[str]) -> str:
        decision = await ratchet.wait_for_signal("ok")
        return f"{len(pages)} pages, {decision}"

    @app.workflow()
    async def parent(pages: list[str]) -> str:
        return await ratchet.child(summarize, pages)

    @app.workflow()
    async def failing() -> None:
        raise RuntimeError("child broke")

    @app.workflow()
    async def parent_of_failing() -> str:
        try:
            await ratchet.child(failing)
        except ratchet.ChildRunFailed as e:
            return str(e)
        return "no"

    app.launch()
    run_id = app.start(parent, ["a", "b"])
    child_id = f"{run_id}/1"
    wait_for(
        lambda: any(r.run_id == child_id and r.status == RunStatus.WAITING for r in app.runs())
    )
    # The child's park parks the parent too.
    assert wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
    child = app.get(child_id)
    assert child.parent_run_id == run_id and child.parent_step_id == "1:child:summarize"
    app.signal(child_id, "ok", "yes")
    assert app.result(run_id, timeout_s=15) == "2 pages, yes"
    assert [r.run_id for r in app.runs() if r.parent_run_id == run_id] == [child_id]

    other = app.start(parent_of_failing)
    assert "child broke" in app.result(other, timeout_s=15)


def test_cancel_a_waiting_run_and_a_running_one(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app(lease_ttl=0.6)
    release = threading.Event()

    @app.step()
    def blocking() -> None:
        release.wait(10)

    @app.workflow()
    async def waits() -> None:
        await ratchet.wait_for_signal("never")

    @app.workflow()
    async def busy() -> None:
        await blocking()

    app.launch()
    waiting = app.start(waits)
    wait_for(lambda: app.get(waiting).status == RunStatus.WAITING)
    assert app.cancel(waiting) == RunStatus.CANCELLED
    with pytest.raises(ratchet.RunCancelled):
        app.result(waiting, timeout_s=5)

    running = app.start(busy)
    wait_for(lambda: "step_started" in kinds(app, running))
    app.cancel(running)  # flagged; the worker sees it at its next renewal
    with pytest.raises(ratchet.RunCancelled):
        app.result(running, timeout_s=15)
    release.set()
    assert kinds(app, running).count("run_cancelled") == 1


def test_changed_step_order_fails_the_run_naming_both_steps(db_url: str) -> None:
    old = ratchet.Ratchet(db_url, lease_ttl=3)

    @old.step()
    async def fetch() -> int:
        return 1

    @old.step()
    async def summarize() -> int:
        return 2

    @old.workflow(name="pipeline")
    async def v1() -> int:
        await fetch()
        await ratchet.wait_for_signal("go")
        return await summarize()

    old.launch()
    run_id = old.start(v1)
    wait_for(lambda: old.get(run_id).status == RunStatus.WAITING)
    old.shutdown()

    new = ratchet.Ratchet(db_url, lease_ttl=3)

    @new.step(name="summarize")
    async def summarize2() -> int:
        return 2

    @new.workflow(name="pipeline")
    async def v2() -> int:  # the code changed under the running run
        await summarize2()
        await ratchet.wait_for_signal("go")
        return 0

    try:
        new.launch()
        new.signal(run_id, "go")
        with pytest.raises(ratchet.RunFailed) as err:
            new.result(run_id, timeout_s=15)
        message = str(err.value)
        assert "position 1" in message and "'1:fetch'" in message and "summarize" in message
        assert new.dead_letters()[0].reason == "non_determinism"
    finally:
        new.shutdown()


def test_unserialisable_step_output_fails_with_the_step_named(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.step()
    async def leaky() -> object:
        return object()

    @app.workflow()
    async def wf() -> None:
        await leaky()

    app.launch()
    run_id = app.start(wf)
    with pytest.raises(ratchet.RunFailed, match=r"output of step 1:leaky is not JSON-serialisable"):
        app.result(run_id, timeout_s=15)
    assert "step_completed" not in kinds(app, run_id)


def test_bad_input_is_refused_and_nothing_is_written(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def greet(name: str, excited: bool = False) -> str:
        return name

    with pytest.raises(ratchet.UnknownWorkflow, match="unknown workflow 'nope'.*greet"):
        app.start("nope")
    with pytest.raises(ratchet.InvalidInput, match=r"arguments do not fit workflow greet"):
        app.start(greet)
    with pytest.raises(ratchet.InvalidInput, match=r"greet.*unexpected keyword argument 'loud'"):
        app.start(greet, "ana", loud=True)
    with pytest.raises(ratchet.InvalidInput, match="invalid argument 'name' of workflow greet"):
        app.start(greet, {1, 2})
    with pytest.raises(ratchet.InvalidInput, match="invalid run id"):
        app.start(greet, "ana", run_id="has space")
    assert app.runs() == []
    with pytest.raises(ratchet.UnknownRun, match="'missing'"):
        app.get("missing")
    with pytest.raises(ratchet.UnknownRun, match="'missing'"):
        app.signal("missing", "go")
    with pytest.raises(ratchet.UnknownRun, match="'missing'"):
        app.cancel("missing")
    with pytest.raises(ratchet.UnknownRun, match="'missing'"):
        app.result("missing", timeout_s=1)
    with pytest.raises(ratchet.NotSerializable, match="signal 'go'"):
        app.signal("missing", "go", object())
    with pytest.raises(ratchet.InvalidRetryPolicy, match="max_attempts.*unknown retry class 'gpu'"):
        ratchet.Retry(max_attempts=0, retry_on=["gpu"])
    assert app.runs() == []


def test_start_with_an_explicit_run_id_is_idempotent(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def echo(x: int) -> int:
        return x

    @app.workflow()
    async def other() -> None:
        return None

    assert app.start(echo, 1, run_id="order-42") == "order-42"
    assert app.start(echo, 1, run_id="order-42") == "order-42"
    with pytest.raises(ratchet.RunIdConflict, match="input"):
        app.start(echo, 2, run_id="order-42")
    assert [r.run_id for r in app.runs()] == ["order-42"]
    assert app.get("order-42").input == {"args": [1], "kwargs": {}}
    with pytest.raises(ratchet.InvalidInput, match="already belongs to workflow 'echo'"):
        app.start(other, run_id="order-42")


def test_the_fold_matches_the_runs_row(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()

    @app.step()
    async def s(i: int) -> int:
        return i

    @app.workflow()
    async def wf(n: int) -> int:
        return sum([await s(i) for i in range(n)])

    app.launch()
    run_id = app.start(wf, 4)
    assert app.result(run_id, timeout_s=15) == 6
    events = app.events(run_id)
    # What is stored is the canonical JSON of each payload (SQLite gives back that text;
    # PostgreSQL's jsonb gives back the value, whose canonical text verify() makes), and
    # the chain verifies.
    assert all(
        (e.payload_json or ratchet.model.dumps(e.payload)) == ratchet.model.dumps(e.payload)
        for e in events
    )
    assert all(e.verify() for e in events)
    state = fold(run_id, events)
    assert state.status == app.get(run_id).status == RunStatus.SUCCEEDED
    assert state.output == 6 and len(state.steps) == 4
    assert all(st.status == "completed" and st.attempt == 1 for st in state.steps.values())


def test_children_ending_while_their_parents_park_never_strand_a_parent(db_url: str) -> None:
    # A parent parks on its child while, on another worker, the child ends: whichever
    # commits first, the parent must end up woken (no run left waiting on a finished child).
    apps = [ratchet.Ratchet(db_url, lease_ttl=5) for _ in range(2)]
    try:
        for app in apps:

            @app.workflow(name="kid")
            async def kid(i: int) -> int:
                return i

            @app.workflow(name="parent")
            async def parent(i: int) -> int:
                return await ratchet.child(kid, i)

            app.launch(concurrency=8)
        run_ids = [apps[0].start("parent", i) for i in range(60)]
        for i, run_id in enumerate(run_ids):
            assert apps[1].result(run_id, timeout_s=30) == i
    finally:
        for app in apps:
            app.shutdown()


def test_cancel_of_a_running_run_is_acted_on_before_the_next_renewal(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app(lease_ttl=60.0)  # renewal every 20 s: only the announcement can be quick
    release = threading.Event()

    @app.step()
    def blocking() -> None:
        release.wait(10)

    @app.workflow()
    async def busy() -> None:
        await blocking()

    app.launch()
    try:
        run_id = app.start(busy)
        wait_for(lambda: "step_started" in kinds(app, run_id))
        started = time.monotonic()
        app.cancel(run_id)
        with pytest.raises(ratchet.RunCancelled):
            app.result(run_id, timeout_s=15)
        assert time.monotonic() - started < 5
    finally:
        release.set()


def test_a_storage_failure_inside_a_step_abandons_the_drive_not_the_run(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    # A 60 s lease: only a retry on the same worker, not the sweep, can finish it in time.
    app = make_app(lease_ttl=60.0)
    store = app.store
    original = store.claim_receipt
    calls: list[int] = []

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ratchet.StorageError("PostgreSQL: server closed the connection unexpectedly")
        return await original(*args, **kwargs)

    store.claim_receipt = flaky  # type: ignore[method-assign]

    @app.step()
    async def send() -> str:
        return str(await ratchet.deliver(lambda key: "sent"))

    @app.workflow()
    async def wf() -> str:
        try:
            return await send()
        except Exception as e:  # user code catching everything must not see it
            return f"caught {type(e).__name__}"

    worker = app.launch()
    run_id = app.start(wf)
    assert app.result(run_id, timeout_s=15) == "sent"
    wait_for(lambda: worker.outcomes.get("succeeded") == 1, what="the drive's outcome")
    assert worker.outcomes.get("aborted") == 1
    events = app.events(run_id)
    assert [e.kind for e in events].count("step_failed") == 0
    drives = [e.payload for e in events if e.kind in ("run_started", "run_resumed")]
    # The same worker drove it again at once, under a new epoch that fences the old drive.
    assert len({d["worker_id"] for d in drives}) == 1
    assert [d["reason"] for d in drives] == ["claim", "retry"]
    assert drives[1]["epoch"] == drives[0]["epoch"] + 1
    started = [e for e in events if e.kind == "step_started"]
    assert [(e.attempt, e.payload.get("resumed", False)) for e in started] == [
        (1, False),
        (1, True),
    ]


def test_a_write_the_database_refuses_for_good_fails_the_run_once(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    from ratchet.errors import ValueRefused

    app = make_app()
    store = app.store
    original = store.append
    refused: list[int] = []

    async def refusing(lease: Any, events: Any) -> None:
        if any(e.kind == "step_completed" for e in events):
            refused.append(1)
            raise ValueRefused("PostgreSQL: invalid byte sequence")
        await original(lease, events)

    store.append = refusing  # type: ignore[method-assign]

    @app.step()
    async def one() -> str:
        return "x"

    @app.workflow()
    async def wf() -> str:
        try:
            await one()
            return await one()
        except Exception as e:  # user code catching everything must not hide it
            return f"caught {type(e).__name__}"

    worker = app.launch()
    run_id = app.start(wf)
    with pytest.raises(ratchet.RunFailed, match="refused a write of this run"):
        app.result(run_id, timeout_s=15)
    wait_for(lambda: worker.outcomes.get("failed") == 1, what="the drive's outcome")
    assert refused == [1] and not worker.outcomes.get("aborted")
    [dead] = app.dead_letters()
    assert dead.reason == "store_refused"
    events = app.events(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.kind for e in events][-1] == "run_failed"


def test_a_replayed_step_output_has_the_key_order_of_its_first_run(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    # jsonb keeps keys in its own order; code that serialises a step's output (a prompt, a
    # request body with an idempotency key) must see the same text on every drive.
    app = make_app()
    seen: list[list[str]] = []

    @app.step
    async def info() -> dict[str, Any]:
        return {"sky": "sunny", "city": "Paris", "a": {"zz": 1, "b": 2}}

    @app.workflow()
    async def wf() -> str:
        out = await info()
        seen.append([*out, *out["a"]])
        await ratchet.wait_for_signal("go")
        return "ok"

    app.launch()
    run_id = app.start(wf)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, what="the park")
    app.signal(run_id, "go")
    assert app.result(run_id, timeout_s=15) == "ok"
    assert seen == [["a", "city", "sky", "b", "zz"]] * 2
