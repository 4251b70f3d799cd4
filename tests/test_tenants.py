"""Tenants never meet, tried from the API of a real server on both backends: two tenants'
runs of the same id are two runs on every route; no answer to one tenant depends on what
another stored (not even 202 against 409); no error quotes a stored value; who decided is
the token; and a database written before run ids were scoped keeps working, its old runs
reachable by their tenant and in nobody else's way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import crash_app
import psycopg
import pytest
from httpx_sse import connect_sse
from proc import Harness
from serving import serving
from test_server import ALL, Api, api_of, engine_id, frames, problem
from waiting import wait_for

from ratchet.model import NewRun
from ratchet.store import make_store


@pytest.fixture
def api(h: Harness) -> Iterator[Api]:
    with api_of(h, heartbeat_s=0.3) as a:
        yield a


def kinds(h: Harness, run_id: str) -> list[str]:
    return [e.kind for e in h.app.events(run_id)]


def test_the_same_run_id_in_two_tenants_is_two_runs_on_every_route(api: Api) -> None:
    h = api.h
    # acme's order-1 waits for a signal; globex's order-1 is another workflow altogether.
    a = api.acme.post("/v1/runs", json={"workflow": "listener", "input": {}, "run_id": "order-1"})
    b = api.other.post(
        "/v1/runs", json={"workflow": "approver", "input": {"amount": 7}, "run_id": "order-1"}
    )
    assert (a.status_code, b.status_code) == (202, 202), (a.text, b.text)
    assert a.json() == b.json() == {"run_id": "order-1", "status": "queued"}
    doomed = {"workflow": "retrier", "input": {"succeed_on": 9, "block_on": 0}, "run_id": "doomed"}
    assert api.acme.post("/v1/runs", json=doomed).status_code == 202
    assert api.other.post("/v1/runs", json=doomed).status_code == 202
    h.spawn("w", lease_ttl=3.0, recovery_interval=0.5)
    acme, globex = engine_id("order-1"), engine_id("order-1", "globex")
    h.wait_parked(acme, "signal:go")
    h.wait_parked(globex, "approval:")

    # Reads: each tenant its own run, under the same id.
    assert api.acme.get("/v1/runs/order-1").json()["workflow"] == "listener"
    mine = api.other.get("/v1/runs/order-1").json()
    assert (mine["run_id"], mine["workflow"], mine["input"]) == (
        "order-1",
        "approver",
        {"amount": 7},
    )
    assert [r["run_id"] for r in api.other.get("/v1/runs").json()["runs"]] == ["doomed", "order-1"]
    page = api.other.get("/v1/runs/order-1/events").json()
    assert {e["run_id"] for e in page["events"]} == {"order-1"}
    assert [e["kind"] for e in page["events"]] == kinds(h, globex)
    assert api.other.get("/v1/runs/order-1/state").json()["run_id"] == "order-1"
    assert api.other.get("/v1/runs/order-1/waterfall").json()["run_id"] == "order-1"

    # A signal of globex's lands on globex's run; acme's still waits for its own.
    before = kinds(h, acme)
    assert api.other.post("/v1/runs/order-1/signals/go", json={"data": 1}).status_code == 202
    # An approval acme's run never asked for is not found; globex decides its own.
    step = h.app.approvals(globex)[0].step_id
    problem(
        api.acme.post(f"/v1/runs/order-1/approvals/{step}", json={"approved": True}),
        404,
        "not_found",
    )
    decided = api.other.post(
        f"/v1/runs/order-1/approvals/{step}", json={"approved": True, "by": "someone-else"}
    )
    assert decided.status_code == 200, decided.text
    assert (decided.json()["by"], decided.json()["note"]) == ("globex-ops", "someone-else")
    # globex's stream follows its run to the end: its events, under its own id.
    with connect_sse(
        api.other, "GET", "/v1/runs/order-1/events", headers={"Accept": "text/event-stream"}
    ) as source:
        got = [(sse.event, sse.json()["run_id"]) for sse in frames(source)]
    assert [k for k, _ in got] == kinds(h, globex) and got[-1][0] == "run_succeeded"
    assert {r for _, r in got} == {"order-1"}
    journaled = next(e for e in h.app.events(globex) if e.kind == "approval_decided")
    assert (journaled.payload["by"], journaled.payload["note"]) == ("globex-ops", "someone-else")
    assert kinds(h, acme) == before  # untouched by all of it
    assert h.app.get(acme).status == "waiting"

    # Receipts: each tenant's own run's.
    receipt = api.other.get("/v1/runs/order-1/receipt")
    assert receipt.status_code == 200, receipt.text
    problem(api.acme.get("/v1/runs/order-1/receipt"), 409, "conflict")  # acme's goes on

    # Cancelling acme's order-1 cancels acme's only.
    assert api.acme.post("/v1/runs/order-1/cancel").json()["status"] == "cancelled"
    assert h.app.get(globex).status == "succeeded"

    # Dead letters: each its own "doomed"; a retry re-queues that tenant's only.
    h.wait_status(engine_id("doomed"), "failed")
    h.wait_status(engine_id("doomed", "globex"), "failed")
    assert [d["run_id"] for d in api.acme.get("/v1/dead-letters").json()] == ["doomed"]
    assert [d["run_id"] for d in api.other.get("/v1/dead-letters").json()] == ["doomed"]
    assert api.other.post("/v1/dead-letters/doomed/retry").status_code == 202
    assert kinds(h, engine_id("doomed")).count("run_queued") == 1
    wait_for(
        lambda: kinds(h, engine_id("doomed", "globex")).count("run_queued") == 2,
        what="globex's doomed to be re-queued",
    )


def strip_id(body: Any) -> Any:
    """An answer with its run ids blanked, to compare two answers about different ids."""
    if isinstance(body, dict):
        return {k: ("*" if k == "run_id" else strip_id(v)) for k, v in body.items()}
    if isinstance(body, list):
        return [strip_id(v) for v in body]
    return body


def test_no_answer_to_one_tenant_depends_on_what_another_stored(api: Api) -> None:
    secret = {"workflow": "chain", "input": {"n": 1, "block_at": [424242]}, "run_id": "taken"}
    assert api.acme.post("/v1/runs", json=secret).status_code == 202
    assert api.acme.post("/v1/runs", json=secret | {"run_id": "taken-2"}).status_code == 202
    key = {"Idempotency-Key": "order-77"}
    assert (
        api.acme.post(
            "/v1/runs", json={"workflow": "chain", "input": {"n": 1}}, headers=key
        ).status_code
        == 202
    )
    # globex with bodies that would conflict with acme's runs, against a fresh id: the
    # same answers, item by item.
    for body, fresh in [
        (
            {"workflow": "listener", "input": {}, "run_id": "taken"},
            {"workflow": "listener", "input": {}, "run_id": "fresh-1"},
        ),
        (
            {"workflow": "chain", "input": {"n": 2}, "run_id": "taken-2"},
            {"workflow": "chain", "input": {"n": 2}, "run_id": "fresh-2"},
        ),
    ]:
        theirs, new = api.other.post("/v1/runs", json=body), api.other.post("/v1/runs", json=fresh)
        assert (
            (theirs.status_code, strip_id(theirs.json()))
            == (new.status_code, strip_id(new.json()))
            == (202, {"run_id": "*", "status": "queued"})
        )
    keyed = api.other.post("/v1/runs", json={"workflow": "chain", "input": {"n": 3}}, headers=key)
    assert keyed.status_code == 202
    batch = api.other.post(
        "/v1/runs:batch",
        json={
            "runs": [
                {"workflow": "listener", "input": {}, "run_id": "taken"},
                {"workflow": "listener", "input": {}, "run_id": "fresh-3"},
            ]
        },
    )
    assert batch.status_code == 202, batch.text
    assert [x["created"] for x in batch.json()["runs"]] == [False, True]  # its own "taken"
    # acme's own conflicts name what differs, never what acme stored.
    writer = api.client(api.token("acme", ("runs:write",)))
    for body in [secret | {"input": {"n": 2}}, secret | {"workflow": "listener", "input": {}}]:
        refused = problem(writer.post("/v1/runs", json=body), 422, "invalid_input")
        assert "424242" not in refused["message"] and "'chain'" not in refused["message"]
        assert "run id 'taken' already exists with another" in refused["message"], refused
    refused = problem(
        writer.post("/v1/runs:batch", json={"runs": [secret | {"queue": "q"}]}),
        422,
        "invalid_input",
    )
    assert "424242" not in refused["message"] and "another queue" in refused["message"]
    # Nothing of globex's reached acme's runs.
    assert api.acme.get("/v1/runs/taken").json()["input"] == secret["input"]


def test_a_write_only_token_is_not_told_who_decided(api: Api) -> None:
    h = api.h
    run_id = api.start("approver", {"amount": 3})
    h.spawn("w", lease_ttl=3.0)
    h.wait_parked(engine_id(run_id), "approval:")
    step = h.app.approvals(engine_id(run_id))[0].step_id
    done = api.acme.post(
        f"/v1/runs/{run_id}/approvals/{step}", json={"approved": True, "comment": "secret reason"}
    )
    assert done.json()["by"] == "acme-ops" and done.json()["note"] is None
    writer = api.client(api.token("acme", ("runs:write",)))
    again = problem(
        writer.post(f"/v1/runs/{run_id}/approvals/{step}", json={"approved": False}),
        409,
        "conflict",
    )
    assert "acme-ops" not in again["message"] and "secret reason" not in again["message"]
    reader = problem(
        api.acme.post(f"/v1/runs/{run_id}/approvals/{step}", json={"approved": False}),
        409,
        "conflict",
    )
    assert "acme-ops" in reader["message"]  # a token that may read the run is told


def test_guards_may_be_tightened_by_a_writer_and_loosened_by_an_admin_only(api: Api) -> None:
    writer = api.client(api.token("acme", ("runs:write",), name="wes"))
    start = {"workflow": "chain", "input": {"n": 1}}
    for tighter in [
        {"max_steps": 5},
        {"budget_usd": 0.5},
        {"budget_tokens": 100},
        {"actions": {"runaway_loop": "fail"}},
        {"budget_usd": None},
        {"retry_window_s": 600},
    ]:
        r = writer.post("/v1/runs", json=start | {"guards": tighter})
        assert r.status_code == 202, (tighter, r.text)
    for looser, field in [
        ({"max_steps": 50_000}, "max_steps"),
        ({"max_steps": None}, "max_steps"),
        ({"runaway_repeats": None}, "runaway_repeats"),
        ({"actions": {"excessive_steps": "record"}}, "actions.excessive_steps"),
        ({"gate": False, "gate_bypass_by": "wes"}, "gate"),
        ({"retry_window_s": 1}, "retry_window_s"),
    ]:
        refused = problem(
            writer.post("/v1/runs", json=start | {"guards": looser}), 403, "forbidden"
        )
        assert refused["details"] == {"needed": "admin", "fields": [field]}, refused
        batch = problem(
            writer.post("/v1/runs:batch", json={"runs": [start, start | {"guards": looser}]}),
            403,
            "forbidden",
        )
        assert batch["message"].startswith("runs[1].guards: ")
    # An admin may switch the gate off; the bypasser journaled is the token, the body's
    # name a note.
    admin = api.client(api.token("acme", ALL, name="ana"))
    r = admin.post(
        "/v1/runs", json=start | {"guards": {"gate": False, "gate_bypass_by": "mallory"}}
    )
    assert r.status_code == 202, r.text
    queued = api.h.app.events(engine_id(r.json()["run_id"]))[0]
    assert queued.payload["guards"] == {
        "gate": False,
        "gate_bypass_by": "ana",
        "gate_bypass_note": "mallory",
    }
    r = admin.post("/v1/runs", json=start | {"guards": {"gate": False}})
    assert (
        api.h.app.events(engine_id(r.json()["run_id"]))[0].payload["guards"]["gate_bypass_by"]
        == "ana"
    )


# -- a database from before run ids were scoped ---------------------------------------------


def unapply_scoping(db_url: str) -> None:
    """Take the database back to the schema before migration 015 (SQLite) / 016
    (PostgreSQL): what an existing installation has when it upgrades."""
    statements = [
        "DROP TABLE tenant_legacy_ids",
        "ALTER TABLE api_tokens DROP COLUMN expires_at",
        "ALTER TABLE approvals DROP COLUMN note",
    ]
    if db_url.startswith("sqlite:///"):
        import sqlite3

        conn = sqlite3.connect(db_url[len("sqlite:///") :])
        with conn:
            for sql in statements:
                conn.execute(sql)
            conn.execute("DELETE FROM schema_migrations WHERE version = 15")
        conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as pg:
            for sql in statements:
                pg.execute(sql)
            pg.execute("DELETE FROM schema_migrations WHERE version = 16")


async def old_database(db_url: str) -> None:
    """Runs as the API wrote them before ids were scoped: each tenant's under its raw id."""
    store = make_store(db_url)
    await store.open()
    try:

        def chain(run_id: str, tenant: str, n: int, **kw: Any) -> NewRun:
            return NewRun(
                run_id, "chain", "1", {"args": [], "kwargs": {"n": n}}, tenant_id=tenant, **kw
            )

        await store.create_run(chain("order-1", "acme", 1))
        await store.create_run(chain("parent-1", "acme", 2))
        await store.create_run(
            chain("parent-1/1", "acme", 3, parent_run_id="parent-1", parent_step_id="1:child")
        )
        await store.create_run(chain("shared", "globex", 4))
        await store.create_run(chain("mine", "default", 5))
    finally:
        await store.close()
    unapply_scoping(db_url)


@pytest.fixture
def upgraded(h: Harness) -> Iterator[Api]:
    h.app.portal.call(old_database(h.db_url))
    app = crash_app.build(h.db_url)  # opening it applies the migration
    try:
        with serving(app, workers=0) as base:
            a = Api(base, h, [])
            a.client(a.token("acme", name="acme-ops"))
            a.client(a.token("globex", name="globex-ops"))
            a.client(a.token("default", name="default-ops"))
            try:
                yield a
            finally:
                for client in a.clients:
                    client.close()
    finally:
        app.shutdown()


def test_an_old_database_keeps_its_runs_reachable_and_in_nobody_elses_way(upgraded: Api) -> None:
    api, default = upgraded, upgraded.clients[2]
    h = api.h
    # acme's old runs, under their old ids, on every read.
    old = api.acme.get("/v1/runs/order-1")
    assert old.status_code == 200 and old.json()["input"] == {"n": 1}
    assert [c["run_id"] for c in api.acme.get("/v1/runs/parent-1").json()["children"]] == [
        "parent-1/1"
    ]
    assert api.acme.get("/v1/runs/parent-1/1").json()["parent_run_id"] == "parent-1"
    assert [
        r["run_id"] for r in api.acme.get("/v1/runs", params={"parent": "parent-1"}).json()["runs"]
    ] == ["parent-1/1"]
    assert {e["run_id"] for e in api.acme.get("/v1/runs/order-1/events").json()["events"]} == {
        "order-1"
    }
    # ... and to a start: the same body is the same run, another is refused unquoted.
    again = api.acme.post(
        "/v1/runs", json={"workflow": "chain", "input": {"n": 1}, "run_id": "order-1"}
    )
    assert again.status_code == 200 and again.json()["run_id"] == "order-1"
    refused = problem(
        api.acme.post(
            "/v1/runs", json={"workflow": "chain", "input": {"n": 9}, "run_id": "order-1"}
        ),
        422,
        "invalid_input",
    )
    assert "another input" in refused["message"]
    # globex starting acme's old id, and default starting it or globex's: fresh runs,
    # answered as fresh ids are.
    for client, run_id in [
        (api.other, "order-1"),
        (default, "order-1"),
        (default, "shared"),
        (api.acme, "shared"),
    ]:
        r = client.post("/v1/runs", json={"workflow": "listener", "input": {}, "run_id": run_id})
        assert (r.status_code, r.json()) == (202, {"run_id": run_id, "status": "queued"})
        assert client.get(f"/v1/runs/{run_id}").json()["workflow"] == "listener"
    assert api.other.get("/v1/runs/shared").json()["input"] == {"n": 4}  # its old one
    assert default.get("/v1/runs/mine").json()["input"] == {"n": 5}
    assert api.other.get("/v1/runs/parent-1").status_code == 404
    # The old rows are as they were; the new ones are in their tenants' namespaces.
    ids = {r.run_id: r.tenant_id for r in h.app.runs()}
    assert ids == {
        "order-1": "acme",
        "parent-1": "acme",
        "parent-1/1": "acme",
        "shared": "globex",
        "mine": "default",
        "globex~order-1": "globex",
        "default~order-1": "default",
        "default~shared": "default",
        "acme~shared": "acme",
    }
    assert h.app.get("order-1").input == {"args": [], "kwargs": {"n": 1}}
    # A new id of a tenant with old rows goes to its namespace; a batch finds old rows too.
    batch = api.acme.post(
        "/v1/runs:batch",
        json={
            "runs": [
                {"workflow": "chain", "input": {"n": 1}, "run_id": "order-1"},
                {"workflow": "chain", "input": {"n": 1}, "run_id": "order-2"},
            ]
        },
    )
    assert [(x["run_id"], x["created"]) for x in batch.json()["runs"]] == [
        ("order-1", False),
        ("order-2", True),
    ]
    assert h.app.get("acme~order-2").tenant_id == "acme"


async def test_the_migration_lists_the_tenants_with_old_rows(db_url: str) -> None:
    await old_database(db_url)
    store = make_store(db_url)
    await store.open()
    try:
        rows = await store._read(lambda tx: tx.all("tenant_legacy_ids", {}))
        assert sorted(r["tenant_id"] for r in rows) == ["acme", "globex"]
    finally:
        await store.close()


def test_a_fresh_database_looks_nothing_up_for_a_start(api: Api) -> None:
    # No old rows: the engine's id is computed, and a start is the one statement it was.
    from ratchet.store import tenants

    assert api.h.app.portal.call(tenants.legacy_tenants(api.h.app.store)) == frozenset()
    assert tenants.candidates("acme", "x-1", frozenset()) == ("acme~x-1",)
    assert tenants.candidates("default", "x-1", frozenset()) == ("x-1",)
    r = api.acme.post("/v1/runs", json={"workflow": "chain", "input": {"n": 1}, "run_id": "x-1"})
    assert r.status_code == 202 and api.h.app.get("acme~x-1").tenant_id == "acme"
