"""Child runs started together (``asyncio.gather`` of ``ratchet.child``) on SQLite and
PostgreSQL: a drive that ends between their commits leaves no child promised by the
journal and never created; a cancel landing while one of them is being created leaves the
run's journal ending with its run_cancelled."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from waiting import wait_for

import ratchet
from ratchet.engine.context import current_run
from ratchet.engine.driver import RunContext
from ratchet.model import TERMINAL_EVENTS, RunStatus


@pytest.fixture
def app(db_url: str) -> Iterator[ratchet.Ratchet]:
    app = ratchet.Ratchet(db_url, lease_ttl=3.0, recovery_interval=0.5)
    yield app
    app.shutdown()


def test_a_child_journaled_as_started_but_never_created_is_created_on_the_next_drive(
    app: ratchet.Ratchet, monkeypatch: pytest.MonkeyPatch
) -> None:
    @app.workflow()
    async def leaf(i: int) -> int:
        return i * 10

    @app.workflow()
    async def fan_out() -> list[int]:
        return list(await asyncio.gather(*(ratchet.child(leaf, i) for i in range(3))))

    store = app.store
    real = store.start_child
    injected: list[str] = []

    async def fail_once_between(lease: Any, events: Any, child: Any) -> Any:
        # A creation whose step_started an earlier commit carried (the branches' events
        # share commits): fail it once, as a dropped connection would, so the drive ends
        # right there, with the child journaled as started and not created.
        carried = any(
            e.kind == "step_started" and e.step_id == child.parent_step_id for e in events
        )
        if not carried and not injected:
            injected.append(child.run_id)
            raise ratchet.StorageError("connection lost (injected)")
        return await real(lease, events, child)

    monkeypatch.setattr(store, "start_child", fail_once_between)
    app.launch()
    run_id = app.start(fan_out)
    assert app.result(run_id, timeout_s=30) == [0, 10, 20]
    children = sorted(r.run_id for r in app.runs() if r.parent_run_id == run_id)
    assert children == [f"{run_id}/1", f"{run_id}/2", f"{run_id}/3"]
    assert all(app.get(c).status == RunStatus.SUCCEEDED for c in children)
    assert injected  # the drive did end between the two commits


def test_a_cancel_while_a_branch_creates_a_child_leaves_run_cancelled_last(
    app: ratchet.Ratchet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Branch A waits for a signal; branch B has created its child and reads it; branch C
    is creating its child (holding the drive's writes). A cancel stops A, the drive decides
    to end and emits run_cancelled, which waits for C's write; B then goes on. Nothing B
    does may land after run_cancelled."""

    @app.workflow()
    async def leaf(i: int) -> int:
        return i

    @app.workflow()
    async def fan_out() -> list[Any]:
        return list(
            await asyncio.gather(
                ratchet.wait_for_signal("never"), ratchet.child(leaf, 1), ratchet.child(leaf, 2)
            )
        )

    store = app.store
    real_get, real_start = store.get_run, store.start_child
    blocked: dict[str, threading.Event] = {"B": threading.Event(), "C": threading.Event()}

    async def until(cond: Callable[[], bool], limit_s: float = 3.0) -> None:
        deadline = time.monotonic() + limit_s
        while not cond() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    def drive_ending() -> bool:
        ctx = current_run.get()
        return ctx is not None and ctx.state.status.terminal

    def emitted_after_end() -> bool:
        ctx = cast(RunContext, current_run.get())  # the driver's own view: its pending events
        assert ctx is not None
        return any(e.kind not in TERMINAL_EVENTS for e in ctx.pending[1:])

    async def get_run(run_id: str) -> Any:
        if run_id.endswith("/2") and not blocked["B"].is_set():  # B, after creating its child
            blocked["B"].set()
            await until(drive_ending)
        return await real_get(run_id)

    async def start_child(lease: Any, events: Any, child: Any) -> Any:
        if child.run_id.endswith("/3") and not blocked["C"].is_set():  # C, holding the writes
            blocked["C"].set()
            await until(drive_ending)
            await until(emitted_after_end, 1.0)  # whatever B adds, it adds now
        return await real_start(lease, events, child)

    monkeypatch.setattr(store, "get_run", get_run)
    monkeypatch.setattr(store, "start_child", start_child)
    app.launch()
    run_id = app.start(fan_out)
    assert all(e.wait(15) for e in blocked.values())
    app.cancel(run_id)
    with pytest.raises(ratchet.RunCancelled):
        app.result(run_id, timeout_s=30)
    events = app.events(run_id)
    assert [e.kind for e in events if e.kind in TERMINAL_EVENTS] == ["run_cancelled"]
    assert events[-1].kind == "run_cancelled", [(e.seq, e.kind, e.step_id) for e in events]
    children = [r.run_id for r in app.runs() if r.parent_run_id == run_id]
    # A child its parent's end found running is cancelled by its own worker, soon after.
    assert children
    wait_for(lambda: all(app.get(c).status.terminal for c in children), what="children ended")
