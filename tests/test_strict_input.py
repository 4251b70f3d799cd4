"""Strict input at the API, on both backends and a real server: a decision is true or false
and nothing else; names have their documented length limits; numbers out of range, NaN and
NUL in paths, query strings and headers answer 422 in the one error shape, never 500; and
``/metrics`` answers 503, as ``/readyz`` does, while the database is unreachable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import PG_URL
from proc import Harness
from serving import serving
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
    import json

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
