"""Child runs started together (``asyncio.gather`` of ``ratchet.child``) on SQLite and
PostgreSQL: a drive that ends between their commits leaves no child promised by the
journal and never created."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import ratchet
from ratchet.model import RunStatus


@pytest.fixture
def app(db_url: str) -> Iterator[ratchet.Ratchet]:
    app = ratchet.Ratchet(db_url, lease_ttl=3.0, recovery_interval=0.5)
    yield app
    app.shutdown()


def test_a_child_journaled_as_started_but_never_created_is_created_on_the_next_drive(
        app: ratchet.Ratchet, monkeypatch: pytest.MonkeyPatch) -> None:
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
        carried = any(e.kind == "step_started" and e.step_id == child.parent_step_id
                      for e in events)
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
