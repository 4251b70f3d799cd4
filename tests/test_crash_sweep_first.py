"""A dead worker's runs go ahead of fresh ones on a worker kept full by a queue.

Real worker processes (tests/support/crash_app.py) on SQLite and PostgreSQL: worker ``a`` dies
holding a run; worker ``b``, its only slot busy, has ready runs queued behind it. Once ``b``
has seen the death (or, when it cannot, once the dead worker's lease has run out), the slot
``b`` frees must go to the orphan, not to the queue: otherwise the orphan waits for every
queued run, however long the queue.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from proc import Harness
from waiting import wait_for

from ratchet.model import EventKind

pytestmark = pytest.mark.crash


def invoked(h: Harness, run_id: str, step_id: str) -> dict[str, Any] | None:
    return next(
        (r for r in h.invocations() if r["run_id"] == run_id and r["step_id"] == step_id), None
    )


def first_drive_at(h: Harness, run_id: str, kind: str) -> float:
    return next(e.at for e in h.app.events(run_id) if e.kind == kind)


@pytest.mark.parametrize(
    ("seen", "reason"),
    [
        pytest.param(True, "takeover", id="death-seen"),
        # A death no worker sees (an earlier version's worker): the sweep, once the lease
        # has run out.
        pytest.param(False, "sweep", id="death-unseen"),
    ],
)
def test_a_full_worker_takes_a_dead_workers_run_before_queued_ones(
    h: Harness, seen: bool, reason: str
) -> None:
    orphan = h.app.start("chain", n=3, block_at=[2])
    a = h.spawn("a", lease_ttl=2.0, concurrency=1)
    wait_for(lambda: invoked(h, orphan, "2:work"), what="the orphan's step 2 running on a")
    if not seen:
        h.unseen("a")
    a.kill()
    a.wait_exit()

    busy = h.app.start("chain", n=1, block_at=[1])
    b = h.spawn("b", lease_ttl=2.0, recovery_interval=0.2, concurrency=1)
    wait_for(lambda: invoked(h, busy, "1:work"), what="the busy run's step running on b")
    queued = [h.app.start("chain", n=1) for _ in range(5)]
    # b is full: its sweeps find no free slot, while the orphan's lease runs out.
    holder, _, expires_at = h.lease(orphan)
    assert holder == "a"
    wait_for(
        lambda: time.time() > expires_at + 0.5 or None,
        timeout=10,
        what="the dead worker's lease to run out",
    )
    assert all(h.app.get(r).status == "queued" for r in queued)

    h.open_gate("step-1")  # the busy run finishes: b's slot is free
    h.open_gate("step-2")
    for run_id in [orphan, busy, *queued]:
        h.wait_status(run_id, "succeeded")
    resumed = [e for e in h.app.events(orphan) if e.kind == EventKind.RUN_RESUMED]
    assert [(e.payload["reason"], e.payload["worker_id"]) for e in resumed] == [(reason, "b")]
    first_fresh = min(first_drive_at(h, r, EventKind.RUN_STARTED) for r in queued)
    assert resumed[0].at < first_fresh, "a queued run went ahead of the dead worker's run"
    assert b.alive()
