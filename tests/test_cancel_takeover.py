"""A cancel requested while a run's worker is gone (dead, paused, cut off) on SQLite and
PostgreSQL: the worker that takes the run over learns of it at once, not a renewal period
later, so the run does not go on (or finish) as if nobody had asked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from waiting import wait_for

import ratchet
from ratchet.model import RunStatus

TTL = 30.0  # renewals every 10 s: far longer than the run takes once taken over


@pytest.fixture
def app(db_url: str) -> Iterator[ratchet.Ratchet]:
    app = ratchet.Ratchet(db_url, lease_ttl=TTL, recovery_interval=0.2)
    yield app
    app.shutdown()


def test_a_run_taken_over_with_a_cancel_pending_is_cancelled_at_once(app: ratchet.Ratchet) -> None:
    ticks: list[int] = []

    @app.step()
    async def tick(i: int) -> int:
        ticks.append(i)
        return i

    @app.workflow()
    async def busy(n: int) -> int:
        return sum([await tick(i) for i in range(n)])

    run_id = app.start(busy, 5000)
    # A worker that claimed the run and died before it wrote anything.
    served = {(busy.name, busy.version)}
    claimed = app.portal.call(app.store.claim("gone", TTL, 1, ["default"], served))
    assert [c.record.run_id for c in claimed] == [run_id]
    assert app.cancel(run_id) == RunStatus.RUNNING  # its lease is live: flagged
    app.clock.advance(TTL + 1)  # the dead worker's lease runs out
    app.launch()
    assert wait_for(lambda: app.get(run_id).status.terminal, timeout=TTL / 3)
    assert app.get(run_id).status == RunStatus.CANCELLED
    assert len(ticks) < 5000
    kinds = [e.kind for e in app.events(run_id)]
    assert kinds[1] == "run_started" and kinds[-1] == "run_cancelled"
