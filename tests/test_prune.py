"""Retention, on SQLite and PostgreSQL: ``ratchet prune`` deletes the journals of runs that
finished before the cutoff, in small batches, and keeps their signed receipts (signing one
first where missing), their runs rows and everything else; unfinished and recent runs,
and statuses not asked for, are left alone; a dry run changes nothing; an interrupted prune
is finished by the next one; a pruned run cannot be retried."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import clirun
import pytest
from clirun import data_dir as data_dir
from clirun import ok

import ratchet
from ratchet.engine.retention import prune
from ratchet.errors import NotDeadLettered
from ratchet.store import Store, retention


@pytest.fixture(autouse=True)
def _own_key(data_dir: Path) -> None:
    """Every test here signs with a key of its own."""


def refused(*args: str) -> str:
    return clirun.refused(2, *args)


@pytest.fixture
def app(db_url: str) -> Iterator[ratchet.Ratchet]:
    app = ratchet.Ratchet(db_url, lease_ttl=3.0, recovery_interval=0.5)

    @app.step
    async def part(i: int) -> int:
        return i

    @app.step
    async def broken() -> None:
        raise ValueError("boom")

    @app.workflow()
    async def many(n: int) -> int:
        return sum([await part(i) for i in range(n)])

    @app.workflow()
    async def fails() -> None:
        await broken()

    @app.workflow()
    async def waits() -> Any:
        return await ratchet.wait_for_signal("go")

    try:
        yield app
    finally:
        app.shutdown()


def settle(app: ratchet.Ratchet, *run_ids: str) -> None:
    for run_id in run_ids:
        try:
            app.result(run_id, timeout_s=30)
        except ratchet.RatchetError:
            pass


def journal_sizes(app: ratchet.Ratchet, *run_ids: str) -> list[int]:
    return [len(app.events(r)) for r in run_ids]


def call(app: ratchet.Ratchet, coro: Any) -> Any:
    return app.portal.call(coro)


def test_prune_deletes_old_journals_in_batches_and_keeps_receipts_and_the_rest(
    app: ratchet.Ratchet,
) -> None:
    app.launch()
    ok_runs = [app.start("many", 6, run_id=f"ok-{i}") for i in range(3)]
    failed = app.start("fails", run_id="failed-1")
    waiting = app.start("waits", run_id="waiting-1")
    settle(app, *ok_runs, failed)
    app.shutdown()
    cancelled = app.start("many", 1, run_id="cancelled-1")  # cancelled while queued:
    app.cancel(cancelled)  # no drive signed it
    before = {r: app.run_receipt(r) for r in [*ok_runs, failed]}
    sizes = journal_sizes(app, *ok_runs, failed, cancelled)
    store: Store = app.store
    now = call(app, store.now())

    # Only succeeded ones asked for, and a dry run: nothing changes.
    dry = call(app, prune(store, app.signer, now + 1, ["succeeded"], dry_run=True))
    assert (dry.runs, dry.events) == (3, sum(sizes[:3]))
    assert journal_sizes(app, *ok_runs) == sizes[:3]
    # A cutoff before they finished: nothing to do.
    assert call(app, prune(store, app.signer, now - 3600)).runs == 0

    # Three events per transaction: every journal takes several.
    report = call(app, prune(store, app.signer, now + 1, ["succeeded", "failed"], event_batch=3))
    assert (report.runs, report.events, report.skipped) == (4, sum(sizes[:4]), 0)
    assert journal_sizes(app, *ok_runs, failed) == [0, 0, 0, 0]
    assert journal_sizes(app, cancelled) == [sizes[4]]  # not asked for
    assert len(app.events(waiting)) > 0  # not finished
    for r in [*ok_runs, failed]:
        assert app.run_receipt(r) == before[r]  # kept, unchanged
        assert app.get(r).status.terminal  # the run itself stays
    assert app.dead_letters() == []  # a pruned run cannot be retried: no dead letter
    with pytest.raises(NotDeadLettered):
        app.retry(failed)

    # The cancelled one has no receipt yet: prune signs it first, then deletes.
    assert call(app, retention.get_receipt(store, cancelled)) is None
    assert call(app, prune(store, app.signer, now + 1, ["cancelled"])).runs == 1
    stored = call(app, retention.get_receipt(store, cancelled))
    assert stored is not None and stored.seq == sizes[4]
    assert app.events(cancelled) == []
    # Pruning again finds nothing.
    assert call(app, prune(store, app.signer, now + 1)).runs == 0


def test_an_interrupted_prune_is_finished_by_the_next_one(app: ratchet.Ratchet) -> None:
    app.launch()
    run_id = app.start("many", 10, run_id="half")
    settle(app, run_id)
    store: Store = app.store
    assert call(app, retention.mark_pruned(store, [run_id])) == [run_id]
    assert call(app, retention.delete_events(store, [run_id], 4)) == 4  # then it died
    assert len(app.events(run_id)) > 0
    report = call(app, prune(store, app.signer, call(app, store.now()) - 3600))
    assert report.runs == 0 and report.events > 0  # no new run, the old one finished
    assert app.events(run_id) == []
    assert call(app, retention.pruning_runs(store, 10)) == []


def test_a_run_whose_receipt_does_not_cover_its_journal_is_not_marked(app: ratchet.Ratchet) -> None:
    app.launch()
    run_id = app.start("many", 2, run_id="stale")
    settle(app, run_id)
    store: Store = app.store
    # A receipt over less than the journal (as if written before a retry's events).
    call(
        app,
        store._run(
            lambda tx: tx._cur.execute(
                "UPDATE run_receipts SET seq = seq - 1 WHERE run_id = 'stale'"
            )
        ),
    )
    assert call(app, retention.mark_pruned(store, [run_id])) == []
    n = len(app.events(run_id))
    # prune signs a receipt over the whole journal first, then prunes.
    assert call(app, prune(store, app.signer, call(app, store.now()) + 1)).runs == 1
    stored = call(app, retention.get_receipt(store, run_id))
    assert stored is not None and stored.seq == n


def test_the_prune_command(app: ratchet.Ratchet, db_url: str, tmp_path: Path) -> None:
    app.launch()
    run_id = app.start("many", 3, run_id="cli-1")
    settle(app, run_id)
    app.shutdown()
    n = len(app.events(run_id))
    assert "invalid age 'soon'" in refused("prune", "--finished-before", "soon", "--db", db_url)
    assert "invalid status 'queued'" in refused(
        "prune", "--finished-before", "1d", "--status", "succeeded,queued", "--db", db_url
    )
    assert ok("prune", "--finished-before", "1d", "--db", db_url).stdout.strip() == (
        "pruned 0 runs (0 events) that finished more than 1d ago"
    )
    # Two days later, as far as the run is concerned.
    age = (
        "updated_at - 172800"
        if app.store.dialect == "sqlite"
        else ("updated_at - interval '2 days'")
    )
    call(app, app.store._run(lambda tx: tx._cur.execute(f"UPDATE runs SET updated_at = {age}")))
    out = ok("prune", "--finished-before", "1d", "--dry-run", "--db", db_url).stdout
    assert out.strip() == f"would prune 1 runs ({n} events) that finished more than 1d ago"
    assert len(app.events(run_id)) == n
    receipt = app.run_receipt(run_id)
    pruned = ok("prune", "--finished-before", "1d", "--status", "succeeded", "--db", db_url)
    assert pruned.stdout.strip() == f"pruned 1 runs ({n} events) that finished more than 1d ago"
    assert app.events(run_id) == []
    assert json.loads(ok("receipt", run_id, "--db", db_url).stdout) == receipt
    assert "was pruned; its receipt was kept" in refused("export", run_id, "--db", db_url)
    shown = ok("show", run_id, "--db", db_url).stdout
    assert "0 (journal pruned; signed receipt kept)" in shown and "succeeded" in shown


def test_the_server_prunes_periodically(app: ratchet.Ratchet) -> None:
    from serving import serving
    from waiting import wait_for

    app.launch()
    run_id = app.start("many", 2, run_id="served")
    settle(app, run_id)
    app.shutdown()
    assert app.events(run_id)
    with serving(app, workers=0, prune_finished_before=0.001, prune_interval=0.2):
        wait_for(lambda: app.events(run_id) == [], what="the server's prune")
        again = app.start("many", 1, run_id="served-later")
        app.cancel(again)  # finished after the first pass: the next one takes it
        wait_for(lambda: app.events(again) == [], what="the next prune")
        assert app.run_receipt(run_id) and app.run_receipt(again)
