"""Letting a run go over its limits over HTTP and from the CLI, on SQLite and PostgreSQL:
retrying a dead-lettered run with a grant, and approving a guard's pause with one. Who
granted it is the request's token (its name), journaled with how far; a bad grant is a 422
(exit 2 from the CLI) and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from serving import serving
from typer.testing import CliRunner
from waiting import wait_for

import ratchet
from ratchet.cli import cli
from ratchet.model import EventKind
from ratchet.store import tokens


@pytest.fixture
def app(db_url: str) -> Iterator[ratchet.Ratchet]:
    app = ratchet.Ratchet(db_url, lease_ttl=3.0, recovery_interval=0.5)

    @app.step
    async def work(i: int) -> int:
        return i

    @app.workflow(guards=ratchet.Guards(budget_steps=2))
    async def steps(n: int) -> int:
        return sum([await work(i) for i in range(n)])

    yield app
    app.shutdown()


@pytest.fixture
def base(app: ratchet.Ratchet) -> Iterator[str]:
    with serving(app, workers=1) as url:
        yield url


def client_of(app: ratchet.Ratchet, base: str, scopes: tuple[str, ...], name: str) -> httpx.Client:
    """A client bearing a new token of the default tenant with ``scopes``, named ``name``."""
    _, secret = app.portal.call(tokens.create_token(app.store, "default", scopes, name=name))
    return httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {secret}"})


@pytest.fixture
def api(app: ratchet.Ratchet, base: str) -> Iterator[httpx.Client]:
    with client_of(app, base, ("runs:read", "runs:write", "admin"), "ana") as client:
        yield client


@pytest.fixture
def writer(app: ratchet.Ratchet, base: str) -> Iterator[httpx.Client]:
    """A token that may start and decide, but not move a run's limits (no admin)."""
    with client_of(app, base, ("runs:read", "runs:write"), "bo") as client:
        yield client


def dead(app: ratchet.Ratchet, run_id: str, times: int = 1) -> None:
    wait_for(
        lambda: (
            len([e for e in app.events(run_id) if e.kind == EventKind.RUN_FAILED]) == times
            and app.get(run_id).status == "failed"
        ),
        what="the run dead-lettered",
    )


def retries(app: ratchet.Ratchet, run_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in app.events(run_id) if e.kind == EventKind.RUN_QUEUED][1:]


def test_a_retry_over_http_grants_as_the_tokens_name(
    app: ratchet.Ratchet, api: httpx.Client
) -> None:
    run_id = api.post("/v1/runs", json={"workflow": "steps", "input": {"n": 4}}).json()["run_id"]
    dead(app, run_id)
    # As it was: it stops again at its budget.
    assert api.post(f"/v1/dead-letters/{run_id}/retry").status_code == 202
    dead(app, run_id, 2)
    bad = api.post(f"/v1/dead-letters/{run_id}/retry", json={"grant": {"max_steps": 0}})
    assert bad.status_code == 422 and "max_steps must be an integer" in bad.json()["message"]
    assert app.get(run_id).status == "failed" and len(retries(app, run_id)) == 1
    moved = api.post(f"/v1/dead-letters/{run_id}/retry", json={"grant": {"budget_steps": 10}})
    assert moved.status_code == 202, moved.text
    assert app.result(run_id, timeout_s=30) == 6
    assert retries(app, run_id) == [
        {"reason": "retry", "by": "ana"},
        {"reason": "retry", "by": "ana", "grant": {"budget_steps": 10}},
    ]


def test_approving_a_pause_over_http_says_how_far(app: ratchet.Ratchet, api: httpx.Client) -> None:
    run_id = api.post(
        "/v1/runs",
        json={
            "workflow": "steps",
            "input": {"n": 4},
            "guards": {"actions": {"budget_exceeded": "pause"}},
        },
    ).json()["run_id"]
    [asked] = wait_for(lambda: app.approvals(run_id), what="the pause")
    url = f"/v1/runs/{run_id}/approvals/{asked.step_id}"
    refused = api.post(url, json={"approved": False, "by": "ana", "grant": {"budget_steps": 9}})
    assert refused.status_code == 422 and "grants nothing" in refused.json()["message"]
    made = api.post(url, json={"approved": True, "by": "ana", "grant": {"budget_steps": 9}})
    assert made.status_code == 200 and made.json()["grant"] == {"budget_steps": 9}, made.text
    assert app.result(run_id, timeout_s=30) == 6
    [decided] = [e.payload for e in app.events(run_id) if e.kind == EventKind.APPROVAL_DECIDED]
    assert (decided["by"], decided["grant"]) == ("ana", {"budget_steps": 9})


def test_a_grant_from_a_token_without_admin_is_refused_403_and_changes_nothing(
    app: ratchet.Ratchet, api: httpx.Client, writer: httpx.Client
) -> None:
    # A milder action than the workflow's is an admin's to choose at start, too.
    run_id = api.post(
        "/v1/runs",
        json={
            "workflow": "steps",
            "input": {"n": 4},
            "guards": {"actions": {"budget_exceeded": "pause"}},
        },
    ).json()["run_id"]
    [asked] = wait_for(lambda: app.approvals(run_id), what="the pause")
    url = f"/v1/runs/{run_id}/approvals/{asked.step_id}"
    for decision in (True, False):
        refused = writer.post(url, json={"approved": decision, "grant": {"budget_steps": 9}})
        assert refused.status_code == 403, refused.text
        body = refused.json()
        assert body["error"] == "forbidden" and "admin" in body["message"], body
        assert body["details"] == {"needed": "admin", "scopes": ["runs:read", "runs:write"]}
    # Nothing was decided: the pause still waits for a person, and no grant is journaled.
    [still] = app.approvals(run_id)
    assert still.status == "pending" and app.get(run_id).status == "waiting"
    assert [e for e in app.events(run_id) if e.kind == EventKind.APPROVAL_DECIDED] == []
    # An admin's grant goes through.
    made = api.post(url, json={"approved": True, "grant": {"budget_steps": 9}})
    assert made.status_code == 200, made.text
    assert app.result(run_id, timeout_s=30) == 6

    # A dead letter's retry is an admin's, with a grant or without: nothing is re-queued.
    dead_id = writer.post("/v1/runs", json={"workflow": "steps", "input": {"n": 4}}).json()[
        "run_id"
    ]
    dead(app, dead_id)
    for body in ({"grant": {"budget_steps": 10}}, None):
        refused = writer.post(f"/v1/dead-letters/{dead_id}/retry", json=body)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "forbidden"
    assert app.get(dead_id).status == "failed" and retries(app, dead_id) == []
    moved = api.post(f"/v1/dead-letters/{dead_id}/retry", json={"grant": {"budget_steps": 10}})
    assert moved.status_code == 202, moved.text
    assert app.result(dead_id, timeout_s=30) == 6


def test_the_cli_retries_and_approves_with_a_grant(app: ratchet.Ratchet, db_url: str) -> None:
    app.launch()
    run_id = app.start("steps", 4)
    dead(app, run_id)

    def cli_run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["--db", db_url, *args])

    refused = cli_run("retry", run_id, "--grant", '{"budget_steps": 10}')
    assert refused.exit_code == 2 and "needs by=" in refused.stderr, refused.output
    refused = cli_run("retry", run_id, "--grant", "ten", "--by", "bo")
    assert refused.exit_code == 2 and "--grant is not JSON" in refused.stderr, refused.output
    done = cli_run("retry", run_id, "--grant", '{"budget_steps": 10}', "--by", "bo")
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == (
        f'run {run_id}: re-queued (status: queued), granted {{"budget_steps":10}} by bo'
    )
    assert app.result(run_id, timeout_s=30) == 6

    paused = app.start("steps", 4, guards={"actions": {"budget_exceeded": "pause"}})
    [asked] = wait_for(lambda: app.approvals(paused), what="the pause")
    done = cli_run("approve", paused, asked.step_id, "--by", "bo", "--grant", '{"budget_steps": 9}')
    assert done.exit_code == 0, done.output
    assert done.stdout.strip().endswith('approved by bo, granted {"budget_steps":9}')
    assert app.result(paused, timeout_s=30) == 6
