"""Run tags, on SQLite and PostgreSQL: kept with the run from its start (one, a batch, a
child, which takes its parent's), journaled in its run_queued, part of what an idempotent
start compares, refused with a message naming the tag when they break a rule (nothing
written), and matched by ``app.runs`` / ``count_runs`` with the workflow filter, all of the
tags asked for at once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import ratchet
from ratchet.model import NewRun
from ratchet.store import Store, make_store, tokens


def _app(make_app: Callable[..., ratchet.Ratchet]) -> tuple[ratchet.Ratchet, Any, Any]:
    app = make_app()

    @app.step
    async def double(x: int) -> int:
        return 2 * x

    @app.workflow(name="doubler")
    async def doubler(x: int) -> int:
        return await double(x)

    @app.workflow(name="parent")
    async def parent(x: int) -> int:
        return int(await ratchet.child(doubler, x)) + 1

    return app, doubler, parent


ACME = {"customer": "acme", "env": "prod"}


def test_tags_are_kept_journaled_and_filter_the_listing(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, doubler, parent = _app(make_app)
    a = app.start(doubler, 1, tags=ACME)
    b = app.start(doubler, 2, tags={"customer": "acme", "env": "staging"})
    c = app.start(parent, 3, tags={"customer": "globex"})
    d = app.start(doubler, 4)
    assert app.get(a).tags == ACME and app.get(d).tags == {}
    assert app.events(a)[0].payload["tags"] == ACME
    assert "tags" not in app.events(d)[0].payload  # an untagged run's journal as before

    def ids(**filters: Any) -> list[str]:
        return sorted(r.run_id for r in app.runs(**filters))

    assert ids(tags={"customer": "acme"}) == sorted([a, b])
    assert ids(tags={"customer": "acme", "env": "prod"}) == [a]  # all of them
    assert ids(tags={"customer": "acme", "env": "nope"}) == []
    assert ids(tags={"customer": "ACME"}) == []  # exact values
    assert ids(workflow="doubler") == sorted([a, b, d])
    assert ids(workflow="parent", tags={"customer": "globex"}) == [c]
    assert ids(workflow="doubler", tags={"customer": "globex"}) == []
    assert ids(status="queued", tags={"customer": "acme"}) == sorted([a, b])
    assert ids(status="succeeded", tags={"customer": "acme"}) == []
    assert [r.run_id for r in app.runs(limit=1, tags={"customer": "acme"})] == [b]  # newest
    assert app.count_runs(tags={"customer": "acme"}) == 2
    assert app.count_runs("queued", workflow="doubler") == 3
    assert app.count_runs(workflow="parent", tags={"customer": "acme"}) == 0
    with pytest.raises(ratchet.InvalidInput, match="invalid tag key 'bad key'"):
        app.runs(tags={"bad key": "x"})
    with pytest.raises(ratchet.InvalidInput, match="workflow filter"):
        app.count_runs(workflow="x" * 201)


def test_a_child_run_carries_its_parents_tags(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app, _, parent = _app(make_app)
    run_id = app.start(parent, 5, tags={"customer": "globex"})
    app.launch()
    assert app.result(run_id, timeout_s=30) == 11
    [child] = [r for r in app.runs(workflow="doubler")]
    assert child.parent_run_id == run_id and child.tags == {"customer": "globex"}
    assert app.events(child.run_id)[0].payload["tags"] == {"customer": "globex"}
    assert sorted(r.run_id for r in app.runs(tags={"customer": "globex"})) == sorted(
        [run_id, child.run_id]
    )


def test_start_many_takes_default_tags_and_an_items_own(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, doubler, _ = _app(make_app)
    ids = app.start_many(
        doubler,
        [{"x": 1}, ratchet.Start(2, tags={"customer": "globex"}), ratchet.Start(3, tags={})],
        tags={"customer": "acme"},
    )
    assert [app.get(i).tags for i in ids] == [{"customer": "acme"}, {"customer": "globex"}, {}]
    assert [r.run_id for r in app.runs(tags={"customer": "globex"})] == [ids[1]]
    assert repr(ratchet.Start(2, tags={"k": "v"})) == "Start(2, tags={'k': 'v'})"


BAD = [
    ({"bad key": "x"}, "invalid tag key 'bad key'"),
    ({"-x": "y"}, "invalid tag key '-x'"),
    ({"k" * 65: "y"}, "65 characters, over the limit of 64"),
    ({"customer": 7}, "invalid tag 'customer': its value must be a string, got int"),
    ({"customer": "v" * 257}, "invalid tag 'customer': its value is 257 characters"),
    ({"customer": "a\nb"}, "control character"),
    ({f"k{i}": "v" for i in range(21)}, "21 of them, over the limit of 20"),
    (["customer", "acme"], "expected a mapping"),
]


@pytest.mark.parametrize(("tags", "message"), BAD)
def test_bad_tags_are_refused_naming_the_tag_and_nothing_is_written(
    make_app: Callable[..., ratchet.Ratchet], tags: Any, message: str
) -> None:
    app, doubler, _ = _app(make_app)
    with pytest.raises(ratchet.InvalidInput, match=message) as caught:
        app.start(doubler, 1, tags=tags)
    assert caught.value.field == "tags"
    with pytest.raises(ratchet.BatchItemInvalid, match=r"item 1 \(tags\): ") as batch:
        app.start_many(doubler, [{"x": 1}, ratchet.Start(2, tags=tags)])
    assert batch.value.field == "tags"
    assert app.count_runs() == 0


def test_a_restart_under_the_same_id_must_carry_the_same_tags(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, doubler, _ = _app(make_app)
    assert app.start(doubler, 1, run_id="r-1", tags=ACME) == "r-1"
    assert app.start(doubler, 1, run_id="r-1", tags=dict(reversed(ACME.items()))) == "r-1"
    with pytest.raises(ratchet.RunIdConflict, match=r"already exists with tags .*acme"):
        app.start(doubler, 1, run_id="r-1", tags={"customer": "globex"})
    with pytest.raises(ratchet.RunIdConflict, match="tags"):
        app.start(doubler, 1, run_id="r-1")  # none is not the same tags either
    with pytest.raises(ratchet.BatchItemInvalid, match="repeats item 0 .* or tags"):
        app.start_many(
            doubler, [ratchet.Start(2, run_id="b", tags=ACME), ratchet.Start(2, run_id="b")]
        )
    assert app.get("r-1").tags == ACME and app.count_runs() == 1


async def test_the_store_keeps_and_matches_tags_of_single_and_batch_starts(store: Store) -> None:
    def new(run_id: str, tenant: str = "default", **tags: str) -> NewRun:
        return NewRun(run_id, "wf", "1", {"args": [], "kwargs": {}}, tenant_id=tenant, tags=tags)

    await store.create_run(new("one", customer="acme"))
    await store.create_runs(
        [new("two", customer="acme", tier="gold"), new("three", customer="globex")]
    )
    await store.create_runs([new("acme~four", "acme", customer="acme")])
    rec = await store.get_run("two")
    assert rec is not None and rec.tags == {"customer": "acme", "tier": "gold"}
    listed = await store.list_runs(tags={"customer": "acme"})
    assert sorted(r.run_id for r in listed) == ["acme~four", "one", "two"]
    assert await store.count_runs(tags={"customer": "acme", "tier": "gold"}) == 1
    assert await store.count_runs(workflow="wf", tags={"tier": "silver"}) == 0
    # The API's listing: one tenant's runs only.
    page = await tokens.runs_page(store, "acme", tags={"customer": "acme"})
    assert [r.run_id for r in page] == ["acme~four"]
    page = await tokens.runs_page(store, "default", tags={"customer": "acme", "tier": "gold"})
    assert [r.run_id for r in page] == ["two"]


# -- a database from before tags ----------------------------------------------------------------


def unapply_tags(db_url: str) -> None:
    """Take the database back to the schema before migration 018: what an existing
    installation has when it upgrades."""
    if db_url.startswith("sqlite:///"):
        conn = sqlite3.connect(db_url[len("sqlite:///") :])
        with conn:
            conn.execute("DROP TRIGGER runs_tags_insert")
            conn.execute("DROP TRIGGER runs_tags_delete")
            conn.execute("DROP TABLE run_tags")
            conn.execute("ALTER TABLE runs DROP COLUMN tags")
            conn.execute("DELETE FROM schema_migrations WHERE version = 18")
        conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as pg:
            pg.execute("DROP INDEX runs_tags")
            pg.execute("ALTER TABLE runs DROP COLUMN tags")
            pg.execute("DELETE FROM schema_migrations WHERE version = 18")


def test_an_existing_database_gains_tags_and_its_runs_have_none(db_url: str) -> None:
    async def before() -> None:
        store = make_store(db_url)
        await store.open()
        try:
            await store.create_run(NewRun("old-1", "wf", "1", {"args": [], "kwargs": {}}))
        finally:
            await store.close()

    asyncio.run(before())
    unapply_tags(db_url)

    async def after() -> None:
        store = make_store(db_url)
        await store.open()  # applies 018
        try:
            old = await store.get_run("old-1")
            assert old is not None and old.tags == {}
            tagged = NewRun("new-1", "wf", "1", {"args": [], "kwargs": {}}, tags={"k": "v"})
            await store.create_run(tagged)
            assert [r.run_id for r in await store.list_runs(tags={"k": "v"})] == ["new-1"]
            assert await store.count_runs(workflow="wf") == 2
        finally:
            await store.close()

    asyncio.run(after())


# -- ratchet runs ---------------------------------------------------------------------------


def test_ratchet_runs_filters_by_tag_and_workflow(
    make_app: Callable[..., ratchet.Ratchet], db_url: str
) -> None:
    from test_cli import ok, refused

    app, doubler, parent = _app(make_app)
    a = app.start(doubler, 1, tags=ACME)
    b = app.start(doubler, 2, tags={"customer": "acme"})
    c = app.start(parent, 3, tags={"customer": "globex"})

    def listed(*args: str) -> list[str]:
        out = ok("--db", db_url, "runs", "--json", *args).stdout
        return sorted(r["run_id"] for r in json.loads(out))

    assert listed("--tag", "customer=acme") == sorted([a, b])
    assert listed("--tag", "customer=acme", "--tag", "env=prod") == [a]
    assert listed("--workflow", "parent") == [c]
    assert listed("--workflow", "doubler", "--tag", "customer=globex") == []
    rows = json.loads(ok("--db", db_url, "runs", "--json", "--tag", "env=prod").stdout)
    assert rows[0]["tags"] == ACME
    table = ok("--db", db_url, "runs", "--tag", "customer=globex").stdout
    assert c in table and "customer=globex" in table and a not in table
    more = ok("--db", db_url, "runs", "--limit", "1", "--tag", "customer=acme").stdout
    assert "of workflow" not in more and "tagged customer=acme" in more
    empty = ok("--db", db_url, "runs", "--workflow", "nope").stdout
    assert "no runs of workflow nope" in empty
    assert "expected key=value" in refused("--db", db_url, "runs", "--tag", "customer")
    assert "invalid tag key 'a b'" in refused("--db", db_url, "runs", "--tag", "a b=c")
    assert "given twice" in refused("--db", db_url, "runs", "--tag", "k=1", "--tag", "k=2")


def test_an_isolated_run_sees_its_tags_in_the_sandbox() -> None:
    # The sandbox's harness rebuilds the run's record from what the host sends: the tags
    # cross with it, so a child the isolated run starts is tagged as its parent.
    from ratchet.model import RunRecord, RunStatus
    from ratchet.sandbox.remote import record_from

    rec = RunRecord(
        "r-1", "wf", "1", {}, RunStatus.RUNNING, None, None, None, None, "default", 0, None,
        None, 1.0, 2.0, tags={"customer": "acme"},
    )  # fmt: skip
    assert record_from(rec.as_dict()) == rec
