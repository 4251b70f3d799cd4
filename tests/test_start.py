"""Idempotent start: one run per run id, whoever asks and however many ask at once; a
second request that differs from the first is refused, naming the difference."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import ratchet

CLIENTS = 32
ROUNDS = 8


def _client(db_url: str) -> tuple[ratchet.Ratchet, ratchet.WorkflowDef]:
    app = ratchet.Ratchet(db_url)

    @app.workflow(name="checkout")
    async def checkout(order: int) -> int:
        return order

    return app, checkout


def test_concurrent_starts_with_one_run_id_all_get_it_back(db_url: str) -> None:
    clients = [_client(db_url) for _ in range(CLIENTS)]
    try:
        for app, _ in clients:
            app.store  # noqa: B018 - connect (and migrate) before the race, not during it
        barrier = threading.Barrier(CLIENTS)

        def start(i: int) -> list[str]:
            app, wf = clients[i]
            got = []
            for n in range(ROUNDS):  # several races, so a narrow window is hit for sure
                barrier.wait(timeout=30)
                try:
                    got.append(app.start(wf, 7, run_id=f"same-{n}"))
                except Exception as e:  # every caller must get the id: show who did not
                    got.append(repr(e))
            return got

        with ThreadPoolExecutor(CLIENTS) as pool:
            got = list(pool.map(start, range(CLIENTS)))
        assert got == [[f"same-{n}" for n in range(ROUNDS)]] * CLIENTS
        app = clients[0][0]
        assert sorted(r.run_id for r in app.runs()) == [f"same-{n}" for n in range(ROUNDS)]
        for n in range(ROUNDS):
            assert [e.kind for e in app.events(f"same-{n}")] == ["run_queued"]
    finally:
        for app, _ in clients:
            app.shutdown()


def test_a_different_request_under_an_existing_run_id_is_refused(db_url: str) -> None:
    app, wf = _client(db_url)
    try:
        assert app.start(wf, 1, run_id="dup") == "dup"
        assert app.start(wf, 1, run_id="dup") == "dup"  # the same request: idempotent
        with pytest.raises(ratchet.RunIdConflict, match=r"'dup'.*input .*\[1\].*not .*\[2\]"):
            app.start(wf, 2, run_id="dup")
        with pytest.raises(ratchet.RunIdConflict, match=r"queue 'default' \(not 'slow'\)"):
            app.start(wf, 1, run_id="dup", queue="slow")
        with pytest.raises(ratchet.RunIdConflict, match=r"priority 0 \(not 5\)"):
            app.start(wf, 1, run_id="dup", priority=5)
        with pytest.raises(ratchet.InvalidInput, match="already belongs to workflow"):
            other = app.workflow(name="other")(_other)
            app.start(other, run_id="dup")
        rec = app.get("dup")
        assert rec.input == {"args": [1], "kwargs": {}} and rec.queue == "default"
        assert rec.priority == 0 and [r.run_id for r in app.runs()] == ["dup"]
    finally:
        app.shutdown()


async def _other() -> None:
    return None
