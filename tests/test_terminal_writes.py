"""A run's end is written once, with its terminal status: the journal's terminal event and
the runs row never disagree for long, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ratchet.engine.control import Control, DriveOutcome
from ratchet.engine.driver import RunContext, drive
from ratchet.engine.threads import StepThreads
from ratchet.errors import DriveAborted, StorageError
from ratchet.model import Event, EventKind, NewRun, RunStatus, fold
from ratchet.store import Store

TTL = 10.0
SERVED = [("wf", "1")]


def _next(
    events: list[Event],
    kind: str,
    payload: dict[str, Any] | None = None,
    step_id: str | None = None,
    attempt: int | None = None,
) -> Event:
    last = events[-1]
    return Event.chain(
        last.run_id, last.seq + 1, kind, step_id, attempt, payload or {}, 0.0, last.hash
    )


async def _claimed_run(store: Store) -> Any:
    await store.create_run(NewRun("r1", "wf", "1", {"args": [], "kwargs": {}}))
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    return claimed


async def test_a_branch_waiting_to_write_never_carries_the_terminal_event(store: Store) -> None:
    # A branch queued for the drive's write lock while the drive ends the run: had the
    # terminal event been pending when the branch got the lock, its append would commit it
    # with the run still running, and the failed finish below would leave the two apart.
    claimed = await _claimed_run(store)
    ctx = RunContext(
        store, claimed, fold("r1", await store.load_events("r1")), {}, Control(), StepThreads(1)
    )
    ctx.emit(EventKind.RUN_STARTED, payload={"worker_id": "w1"})
    await ctx.flush()

    async def finish_fails(*args: Any, **kwargs: Any) -> None:
        raise StorageError("PostgreSQL: server closed the connection unexpectedly")

    store.finish = finish_fails  # type: ignore[method-assign]
    async with ctx._lock:  # another write in flight
        ctx.emit(EventKind.STEP_STARTED, "1:a", 1, {"idempotency_key": "k"})
        branch = asyncio.create_task(ctx.flush())
        await asyncio.sleep(0)
        ender = asyncio.create_task(ctx.finish(RunStatus.CANCELLED, error="cancelled"))
        await asyncio.sleep(0)
    await branch
    with pytest.raises(DriveAborted):
        await ender
    journal = [e.kind for e in await store.load_events("r1")]
    assert journal == ["run_queued", "run_started", "step_started"]
    rec = await store.get_run("r1")
    assert rec is not None and rec.status == RunStatus.RUNNING


@pytest.mark.parametrize(
    ("kind", "payload", "status", "dead"),
    [
        (EventKind.RUN_CANCELLED, {"error": "cancelled"}, RunStatus.CANCELLED, None),
        (
            EventKind.RUN_FAILED,
            {"error": "step 1:a failed", "reason": "step_failed"},
            RunStatus.FAILED,
            "step_failed",
        ),
        (EventKind.RUN_SUCCEEDED, {"output": {"n": 1}}, RunStatus.SUCCEEDED, None),
    ],
)
async def test_a_row_behind_its_journal_is_settled_by_the_next_drive(
    store: Store, kind: str, payload: dict[str, Any], status: RunStatus, dead: str | None
) -> None:
    # The journal is the truth: a run whose journal ended while its row did not (written by
    # an older version, or by hand) is given the journal's end, and its code never runs.
    claimed = await _claimed_run(store)
    events = await store.load_events("r1")
    started = _next(events, EventKind.RUN_STARTED, {"worker_id": "w1"})
    await store.append(claimed.lease, [started, _next([*events, started], kind, payload)])
    store.clock.advance(TTL + 1)
    [stolen] = await store.steal_expired("w2", TTL, 10, ["default"], SERVED)
    before = await store.load_events("r1")

    assert await drive(store, stolen, {}, Control(), StepThreads(1)) == DriveOutcome.NOOP

    rec = await store.get_run("r1")
    assert rec is not None and rec.status == status
    assert rec.output == payload.get("output") and rec.error == payload.get("error")
    assert await store.load_events("r1") == before  # nothing written to the journal
    assert [d.reason for d in await store.dead_letters()] == ([dead] if dead else [])
    assert await store.claim("w3", TTL, 10, ["default"], SERVED) == []
