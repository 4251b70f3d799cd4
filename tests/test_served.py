"""A worker claims only runs of the workflow versions it has (a rolling deploy, or workers
of different apps on one database); the others wait, and `ratchet runs` says why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from typer.testing import CliRunner
from waiting import wait_for

import ratchet
from ratchet.cli import cli
from ratchet.model import NewRun, RunStatus
from ratchet.store import Store

TTL = 10.0


async def _new(store: Store, run_id: str, workflow: str, version: str) -> None:
    await store.create_run(NewRun(run_id, workflow, version, {"args": [], "kwargs": {}}))


async def test_claim_steal_and_reclaim_take_only_served_workflow_versions(store: Store) -> None:
    await _new(store, "wf-v2", "wf", "2")  # oldest first: a claim that took any would take it
    await _new(store, "other-v1", "other", "1")
    await _new(store, "wf-v1", "wf", "1")
    [got] = await store.claim("w1", TTL, 10, ["default"], [("wf", "1")])
    assert got.record.run_id == "wf-v1"
    assert await store.claim("w1", TTL, 10, ["default"], [("wf", "1")]) == []
    assert (await store.get_run("wf-v2")).status == RunStatus.QUEUED  # type: ignore[union-attr]

    assert await store.reclaim_own("w1", TTL, [("wf", "2")]) == []
    [again] = await store.reclaim_own("w1", TTL, [("wf", "1")])
    assert again.record.run_id == "wf-v1"

    both = [("wf", "2"), ("other", "1")]
    assert {c.record.run_id for c in await store.claim("w2", TTL, 10, ["default"], both)} == {
        "wf-v2",
        "other-v1",
    }
    store.clock.advance(TTL + 1)
    [stolen] = await store.steal_expired("w3", TTL, 20, ["default"], [("other", "1")])
    assert stolen.record.run_id == "other-v1"


@pytest.fixture
def apps(db_url: str) -> Iterator[list[ratchet.Ratchet]]:
    made: list[ratchet.Ratchet] = []
    yield made
    for app in made:
        app.shutdown()


def _app(
    db_url: str, version: str, made: list[ratchet.Ratchet]
) -> tuple[ratchet.Ratchet, ratchet.WorkflowDef]:
    app = ratchet.Ratchet(db_url, lease_ttl=3.0, recovery_interval=0.2)
    made.append(app)

    @app.workflow(name="greet", version=version)
    async def greet(name: str) -> str:
        return f"hello {name} from v{version}"

    return app, greet


def test_a_worker_leaves_runs_of_versions_it_lacks_queued(
    db_url: str, apps: list[ratchet.Ratchet]
) -> None:
    old, greet_v1 = _app(db_url, "1", apps)
    new, greet_v2 = _app(db_url, "2", apps)
    waiting = new.start(greet_v2, "ana")  # started first: the old worker meets it first
    done = old.start(greet_v1, "bo")
    old.launch()
    assert old.result(done, timeout_s=30) == "hello bo from v1"
    # The old worker has claimed past it: it neither ran it nor failed it.
    assert old.get(waiting).status == RunStatus.QUEUED
    assert [e.kind for e in old.events(waiting)] == ["run_queued"]

    listing = CliRunner().invoke(cli, ["--db", db_url, "runs"])
    assert listing.exit_code == 0, listing.output
    assert "note: 1 queued run: no live worker serves workflow greet v2" in listing.stdout

    new.launch()
    assert new.result(waiting, timeout_s=30) == "hello ana from v2"
    wait_for(
        lambda: "no live worker" not in CliRunner().invoke(cli, ["--db", db_url, "runs"]).stdout,
        what="the note to go",
    )
