"""Who cancelled a run, on SQLite and PostgreSQL, when a worker holds it: the cancel request
keeps the name (``runs.cancel_by``), the renewal or the park that finds the request brings
it to the drive, and the worker's ``run_cancelled`` says ``by`` whom, as a cancel of a run
no worker holds does; children cancelled with their parent name the same person. A cancel
naming nobody journals "request", as before. A database from before the column gains it."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from waiting import wait_for

import ratchet
from ratchet.model import Event, EventKind, NewRun, RunStatus, drives
from ratchet.store import Store, make_store

TTL = 10.0
SERVED = [("wf", "1")]


def cancelled(app: ratchet.Ratchet, run_id: str) -> Event:
    [ended] = [e for e in app.events(run_id) if e.kind == EventKind.RUN_CANCELLED]
    return ended


def last_drive(app: ratchet.Ratchet, run_id: str) -> str | None:
    return drives(app.events(run_id))[-1].ended


def started(app: ratchet.Ratchet, run_id: str) -> bool:
    return any(e.kind == EventKind.STEP_STARTED for e in app.events(run_id))


def child_of(app: ratchet.Ratchet, run_id: str) -> str:
    found = wait_for(
        lambda: [r.run_id for r in app.runs() if r.parent_run_id == run_id],
        what=f"a child of {run_id}",
    )
    return str(found[0])


# -- a running run ------------------------------------------------------------------------------


def test_a_running_run_cancelled_by_a_person_names_them_and_one_naming_nobody_says_request(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    # A 60 s lease: the worker learns of the cancel from its announcement, not the sweep.
    app = make_app(lease_ttl=60.0)
    release = threading.Event()

    @app.step()
    async def blocked() -> None:
        await asyncio.to_thread(release.wait, 30)

    @app.workflow()
    async def busy() -> None:
        await blocked()

    app.launch()
    try:
        named, unnamed = app.start(busy), app.start(busy)
        wait_for(lambda: started(app, named) and started(app, unnamed), what="steps running")
        # The worker holds both: the store only records the request, the worker ends them.
        # The second request comes while the renewal the first set off may be under way:
        # it renews again at once (a 60 s lease: a missed announcement would wait 20 s).
        assert app.cancel(named, by="ana") == RunStatus.RUNNING
        assert app.cancel(unnamed) == RunStatus.RUNNING
        for run_id in (named, unnamed):
            with pytest.raises(ratchet.RunCancelled):
                app.result(run_id, timeout_s=15)
    finally:
        release.set()
    assert cancelled(app, named).payload == {"error": "cancelled", "by": "ana"}
    assert last_drive(app, named) == "cancelled by ana"
    assert cancelled(app, unnamed).payload == {"error": "cancelled", "by": "request"}
    assert last_drive(app, unnamed) == "cancelled"


def test_a_cancel_found_by_the_park_names_who_asked(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app(lease_ttl=60.0)
    store = app.store
    renew = store.renew

    async def blind_renew(*args: Any, **kwargs: Any) -> Any:
        # Renewals that do not see the cancel: only the park can find it.
        return [dataclasses.replace(h, cancel_requested=False) for h in await renew(*args)]

    store.renew = blind_renew  # type: ignore[method-assign]
    release = threading.Event()

    @app.step()
    async def gate() -> None:
        await asyncio.to_thread(release.wait, 30)

    @app.workflow()
    async def then_waits() -> Any:
        await gate()
        return await ratchet.wait_for_signal("never")

    app.launch()
    run_id = app.start(then_waits)
    try:
        wait_for(lambda: started(app, run_id), what="the step running")
        assert app.cancel(run_id, by="ana") == RunStatus.RUNNING
    finally:
        release.set()  # the step ends, the run waits, and its park finds the cancel
    with pytest.raises(ratchet.RunCancelled):
        app.result(run_id, timeout_s=15)
    assert cancelled(app, run_id).payload == {"error": "cancelled", "by": "ana"}
    assert last_drive(app, run_id) == "cancelled by ana"


# -- children cancelled with their parent --------------------------------------------------------


def _family(app: ratchet.Ratchet, *, parent_busy: bool) -> tuple[Any, threading.Event]:
    """A parent whose child runs a step blocked until the event; with ``parent_busy`` the
    parent runs a blocked step beside its wait for the child, so it is never parked."""
    release = threading.Event()

    @app.step()
    async def toil() -> None:
        await asyncio.to_thread(release.wait, 30)

    @app.workflow()
    async def kid() -> None:
        await toil()

    @app.workflow()
    async def parent() -> None:
        if parent_busy:
            await asyncio.gather(ratchet.child(kid), toil())
        else:
            await ratchet.child(kid)

    return parent, release


@pytest.mark.parametrize("parent_busy", [False, True], ids=["parent_parked", "parent_running"])
def test_children_cancelled_with_their_parent_name_who_cancelled_it(
    make_app: Callable[..., ratchet.Ratchet], parent_busy: bool
) -> None:
    app = make_app(lease_ttl=60.0)
    parent, release = _family(app, parent_busy=parent_busy)
    app.launch()
    try:
        run_id = app.start(parent)
        child_id = child_of(app, run_id)
        wait_for(lambda: started(app, child_id), what="the child's step running")
        if parent_busy:
            wait_for(lambda: started(app, run_id), what="the parent's step running")
            # Held by the worker: its drive ends it, and that commit cancels the child.
            assert app.cancel(run_id, by="ana") == RunStatus.RUNNING
        else:
            # Parked: cancelled here and now, and the running child's worker is asked.
            wait_for(lambda: app.get(run_id).status == RunStatus.WAITING, what="parked")
            assert app.cancel(run_id, by="ana") == RunStatus.CANCELLED
        for rid in (run_id, child_id):
            with pytest.raises(ratchet.RunCancelled):
                app.result(rid, timeout_s=15)
    finally:
        release.set()
    for rid in (run_id, child_id):
        assert cancelled(app, rid).payload["by"] == "ana", rid
        assert (last_drive(app, rid) or "").endswith("cancelled by ana"), rid


# -- the store ----------------------------------------------------------------------------------


async def _running(store: Store, run_id: str) -> Any:
    await store.create_run(NewRun(run_id, "wf", "1", {"args": [], "kwargs": {}}))
    [claimed] = await store.claim("w1", TTL, 10, ["default"], SERVED)
    return claimed


async def test_the_renewal_and_the_park_bring_who_asked_the_first_name_staying(
    store: Store,
) -> None:
    claimed = await _running(store, "r1")
    assert await store.cancel("r1", by="ana") == RunStatus.RUNNING
    assert await store.cancel("r1", by="bob") == RunStatus.RUNNING  # ana asked first
    [held] = await store.renew("w1", TTL, ["r1"])
    assert held.cancel_requested and held.cancel_by == "ana"
    # A cancel pending when the run tries to park wins over the park, and says who asked.
    assert await store.park(claimed.lease, [], ["signal:x"], None) == ("cancel", ["ana"])

    await _running(store, "r2")
    assert await store.cancel("r2") == RunStatus.RUNNING
    [held] = await store.renew("w1", TTL, ["r2"])
    assert held.cancel_requested and held.cancel_by is None
    assert await store.cancel("r2", by="carol") == RunStatus.RUNNING  # the first name given
    [held] = await store.renew("w1", TTL, ["r2"])
    assert held.cancel_by == "carol"


# -- a database from before cancel_by -------------------------------------------------------------


def _unapply(db_url: str) -> None:
    """Take the database back to the schema before the migration that added cancel_by
    (SQLite 019, PostgreSQL 020): what an existing installation has when it upgrades."""
    if db_url.startswith("sqlite:///"):
        conn = sqlite3.connect(db_url[len("sqlite:///") :])
        with conn:
            conn.execute("ALTER TABLE runs DROP COLUMN cancel_by")
            conn.execute("DELETE FROM schema_migrations WHERE version = 19")
        conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as pg:
            pg.execute("ALTER TABLE runs DROP COLUMN cancel_by")
            pg.execute("DELETE FROM schema_migrations WHERE version = 20")


def test_an_existing_database_gains_cancel_by_and_a_request_from_before_names_nobody(
    db_url: str,
) -> None:
    async def before() -> None:
        store = make_store(db_url)
        await store.open()
        try:
            await _running(store, "old")
        finally:
            await store.close()

    asyncio.run(before())
    _unapply(db_url)
    # A cancel requested before the upgrade: the old schema has no name to keep.
    if db_url.startswith("sqlite:///"):
        conn = sqlite3.connect(db_url[len("sqlite:///") :])
        with conn:
            conn.execute("UPDATE runs SET cancel_requested = 1 WHERE run_id = 'old'")
        conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as pg:
            pg.execute("UPDATE runs SET cancel_requested = true WHERE run_id = 'old'")

    async def after() -> None:
        store = make_store(db_url)
        await store.open()  # applies the migration
        try:
            [held] = await store.renew("w1", TTL, ["old"])
            assert held.cancel_requested and held.cancel_by is None
            await _running(store, "new")
            assert await store.cancel("new", by="ana") == RunStatus.RUNNING
            [held] = await store.renew("w1", TTL, ["new"])
            assert held.cancel_by == "ana"
        finally:
            await store.close()

    asyncio.run(after())
