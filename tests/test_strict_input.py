"""Strict input at the API, on both backends and a real server: a decision is true or false
and nothing else; names have their documented length limits; numbers out of range, NaN and
NUL in paths, query strings and headers answer 422 in the one error shape, never 500; and
``/metrics`` answers 503, as ``/readyz`` does, while the database is unreachable."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import PG_URL
from proc import Harness
from serving import serving
from test_cli import invoke
from test_readyz import migrate
from test_server import TENANTS, Api, api_of, engine_id, problem

import ratchet


@pytest.fixture
def api(h: Harness) -> Iterator[Api]:
    with api_of(h, TENANTS[:1]) as a:
        yield a


def test_a_decision_is_a_boolean_and_nothing_else(api: Api) -> None:
    h = api.h
    run_id = api.start("approver", {"amount": 3})
    h.spawn("w", lease_ttl=3.0)
    h.wait_parked(engine_id(run_id), "approval:")
    step = h.app.approvals(engine_id(run_id))[0].step_id
    for approved in ["yes", "true", 1, 0, None, "1"]:
        refused = problem(
            api.acme.post(f"/v1/runs/{run_id}/approvals/{step}", json={"approved": approved}),
            422,
            "invalid_input",
        )
        assert refused["details"][0]["field"] == "approved", refused
    assert h.app.approvals(engine_id(run_id))[0].status == "pending"  # nothing decided
    ok = api.acme.post(f"/v1/runs/{run_id}/approvals/{step}", json={"approved": False})
    assert ok.status_code == 200 and ok.json()["approved"] is False


def test_names_have_length_limits(api: Api) -> None:
    start = {"workflow": "chain", "input": {"n": 1}}
    for body, field in [
        (start | {"workflow": "w" * 201}, "workflow"),
        (start | {"run_id": "r" * 201}, "run_id"),
        (start | {"queue": "q" * 201}, "queue"),
    ]:
        refused = problem(api.acme.post("/v1/runs", json=body), 422, "invalid_input")
        assert refused["details"][0]["field"] == field, refused
        batch = problem(
            api.acme.post("/v1/runs:batch", json={"runs": [start, body]}), 422, "invalid_input"
        )
        assert batch["details"][0]["field"] == f"runs[1].{field}", batch
    assert api.acme.post("/v1/runs", json=start | {"run_id": "r" * 200}).status_code == 202
    run_id = api.start("listener", {})
    problem(api.acme.post(f"/v1/runs/{run_id}/signals/{'s' * 201}", json={}), 422, "invalid_input")
    problem(
        api.acme.post(f"/v1/runs/{run_id}/approvals/{'a' * 1001}", json={"approved": True}),
        422,
        "invalid_input",
    )
    problem(api.acme.get(f"/v1/runs/{'r' * 1001}"), 422, "invalid_input")
    problem(api.acme.get(f"/v1/runs/{'r' * 1000}"), 404, "not_found")
    problem(api.acme.get("/v1/runs", params={"workflow": "w" * 201}), 422, "invalid_input")
    assert api.h.app.runs(limit=1000) != []
    with pytest.raises(ratchet.InvalidInput, match="over the limit of 200"):
        api.h.app.start("chain", n=1, queue="q" * 201)


def test_a_tenant_has_at_most_64_characters(api: Api) -> None:
    db = api.h.db_url
    longest, over = "t" * 64, "t" * 65
    # From the command line: 64 characters make a token; 65 are refused, naming the limit,
    # and nothing is written.
    refused = invoke("tokens", "create", "--tenant", over, "--db", db)
    assert refused.exit_code == 2 and "invalid tenant" in refused.output, refused.output
    assert "1-64" in refused.output, refused.output
    made = invoke(
        "tokens", "create", "--tenant", longest, "--scopes", "runs:read,runs:write", "--db", db
    )
    assert made.exit_code == 0, made.output
    listed = json.loads(invoke("tokens", "list", "--json", "--db", db).output)
    assert sorted(t["tenant"] for t in listed) == ["acme", longest]
    # From Python, as the CLI and the tests make tokens.
    with pytest.raises(ratchet.InvalidInput, match="1-64"):
        api.token(over)
    # A token of the longest tenant works, with the longest run id, in a namespace of its own.
    longest_client = api.client(made.output.strip().splitlines()[-1])
    run_id = "r" * 200
    started = longest_client.post(
        "/v1/runs", json={"workflow": "chain", "input": {"n": 1}, "run_id": run_id}
    )
    assert started.status_code == 202, started.text
    assert longest_client.get(f"/v1/runs/{run_id}").json()["run_id"] == run_id
    problem(api.acme.get(f"/v1/runs/{run_id}"), 404, "not_found")
    # Over the API a token is made for its maker's tenant: a tenant in the body is not taken.
    for tenant in (over, longest):
        other = api.acme.post("/v1/tokens", json={"scopes": ["runs:read"], "tenant": tenant})
        assert other.status_code == 201 and other.json()["tenant"] == "acme", other.text
    assert len(json.loads(invoke("tokens", "list", "--json", "--db", db).output)) == 4


def _named(name: str) -> Callable[[], Awaitable[int]]:
    async def fn() -> int:
        return 1

    fn.__name__ = fn.__qualname__ = name
    return fn


def test_a_step_name_declared_in_code_has_at_most_200_characters(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    # Refused where it is declared, naming the step and the limit: a name given or a
    # function's own, for a step or a tool; no tool is registered.
    for over in ("s" * 201, "s" * 5000):
        with pytest.raises(ratchet.InvalidInput) as refused:
            app.step(name=over)(_named("fine"))
        said = str(refused.value)
        assert said.startswith("step 'sss") and "over the limit of 200" in said, said
        assert f"{len(over)} characters" in said and len(said) < 300, said
    with pytest.raises(ratchet.InvalidInput, match="^step 'fff.*201 characters, over the limit"):
        app.step(_named("f" * 201))
    with pytest.raises(ratchet.InvalidInput, match="^tool 'ttt.*201 characters, over the limit"):
        app.tool(name="t" * 201)(_named("fine"))
    with pytest.raises(ratchet.InvalidInput, match="^tool 'ggg.*201 characters, over the limit"):
        app.tool(_named("g" * 201))
    assert app.tools == {}
    # 200 characters are a step: run, journaled and read back under its step id.
    longest = "s" * 200
    step = app.step(name=longest)(_named("fine"))
    tool = app.tool(_named("t" * 200))

    @app.workflow
    async def long_named() -> int:
        return int(await step()) + int(await tool())

    app.launch()
    run_id = app.start(long_named)
    assert app.result(run_id, timeout_s=30) == 2
    started = [e.step_id for e in app.events(run_id) if e.kind == "step_started"]
    assert started == [f"1:{longest}", f"2:{'t' * 200}"]


@pytest.mark.parametrize(
    "path, params, headers",
    [
        ("/v1/runs/{id}/events", {"after_seq": 2**63}, {}),
        ("/v1/runs/{id}/events", {"after_seq": 10**30}, {}),
        ("/v1/runs/{id}/events", {"after_seq": "nan"}, {}),
        ("/v1/runs/{id}/events", {}, {"Accept": "text/event-stream", "Last-Event-ID": "9" * 25}),
        (
            "/v1/runs/{id}/events",
            {},
            {"Accept": "text/event-stream", "Last-Event-ID": "9223372036854775808"},
        ),
        ("/v1/runs/{id}/events", {}, {"Accept": "text/event-stream", "Last-Event-ID": "-1"}),
        ("/v1/runs/{id}/state", {"at_seq": 2**64}, {}),
        ("/v1/runs/{id}/waterfall", {"at_seq": 10**30}, {}),
        ("/v1/runs", {"created_after": "nan"}, {}),
        ("/v1/runs", {"created_after": "inf"}, {}),
        ("/v1/runs", {"created_before": "-inf"}, {}),
        ("/v1/runs", {"created_after": 1e300}, {}),
        ("/v1/runs", {"created_before": -1e300}, {}),
        ("/v1/runs/{id}/result", {"wait": "nan"}, {}),
        ("/v1/runs", {"workflow": "a\x00b"}, {}),
        ("/v1/runs", {"parent": "p\x00"}, {}),
        ("/v1/runs/{id}/step", {"step_id": "1:\x00"}, {}),
        ("/v1/runs/a%00b", {}, {}),
        ("/v1/runs/a%00b/events", {}, {}),
        ("/v1/runs/a%09b", {}, {}),
    ],
)
def test_out_of_range_numbers_nan_and_nul_answer_422(
    api: Api, path: str, params: dict[str, Any], headers: dict[str, str]
) -> None:
    run_id = api.start("chain", {"n": 1})
    r = api.acme.get(path.replace("{id}", run_id), params=params, headers=headers)
    problem(r, 422, "invalid_input")


def test_the_largest_numbers_in_range_are_answered(api: Api) -> None:
    run_id = api.start("chain", {"n": 1})
    page = api.acme.get(f"/v1/runs/{run_id}/events", params={"after_seq": 2**63 - 1})
    assert page.status_code == 200 and page.json()["events"] == []
    state = api.acme.get(f"/v1/runs/{run_id}/state", params={"at_seq": 2**63 - 1})
    assert state.status_code == 200 and state.json()["last_seq"] == 1
    listed = api.acme.get(
        "/v1/runs", params={"created_after": -62135596800, "created_before": 253402300799}
    )
    assert listed.status_code == 200 and len(listed.json()["runs"]) == 1
    # A cursor carrying NaN or a NUL is refused as a bad cursor.
    import base64

    for bad in ([float("nan"), "x"], [1.0, "x\x00"]):
        cursor = base64.urlsafe_b64encode(json.dumps(bad).encode()).decode()
        problem(api.acme.get("/v1/runs", params={"cursor": cursor}), 422, "invalid_input")


# -- /metrics and /readyz while the database is unreachable --------------------------------


@pytest.fixture
def served(db_url: str) -> Iterator[httpx.Client]:
    app = ratchet.Ratchet(db_url)
    try:
        with (
            serving(app, ready_timeout_s=2.0) as base,
            httpx.Client(base_url=base, timeout=30) as client,
        ):
            yield client
    finally:
        app.shutdown()


def unavailable(client: httpx.Client, path: str) -> str:
    body = problem(client.get(path), 503, "unavailable")
    return str(body["message"])


async def test_metrics_and_readyz_answer_503_while_the_database_is_unreachable(
    served: httpx.Client, db_url: str
) -> None:
    assert served.get("/metrics").status_code == 200
    if db_url.startswith("sqlite:///"):
        path = Path(db_url[len("sqlite:///") :])
        aside = path.with_name("aside.db")
        path.rename(aside)
        assert "cannot be found" in unavailable(served, "/metrics")
        assert "cannot be found" in unavailable(served, "/readyz")
        aside.rename(path)
    else:
        schema = db_url.rsplit("search_path%3D", 1)[1]  # conftest's schema of this test
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
            assert "not ready" in unavailable(served, "/metrics")
            assert "not ready" in unavailable(served, "/readyz")
            admin.execute(f'CREATE SCHEMA "{schema}"')
        await migrate(db_url)
    assert served.get("/metrics").status_code == 200
    assert served.get("/readyz").status_code == 200
