"""Tokens that expire, and event streams that end with their token: ``ratchet tokens create
--expires``, ``expires_in`` over the API (``/v1/tokens``, an admin's of its own tenant), a
token refused once past its expiry, and an open SSE stream ended when its token is revoked
or expires, on both backends and a real server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from httpx_sse import connect_sse
from proc import Harness
from test_cli import invoke
from test_server import Api, api_of, engine_id, problem
from waiting import wait_for


@pytest.fixture
def api(h: Harness) -> Iterator[Api]:
    with api_of(h, heartbeat_s=0.2, token_check_s=0.2) as a:
        yield a


def test_tokens_create_expires_on_the_command_line(db_url: str) -> None:
    made = invoke(
        "tokens", "create", "--tenant", "acme", "--name", "ana", "--expires", "30d", "--db", db_url
    )
    assert made.exit_code == 0, made.output
    assert ", expires " in made.output
    (row,) = json.loads(invoke("tokens", "list", "--json", "--db", db_url).output)
    assert row["name"] == "ana"
    assert abs(row["expires_at"] - row["created_at"] - 30 * 86400) < 5
    bad = invoke("tokens", "create", "--tenant", "acme", "--expires", "soon", "--db", db_url)
    assert bad.exit_code == 2 and "invalid age 'soon'" in bad.output
    bad = invoke("tokens", "create", "--tenant", "acme", "--name", "\tx", "--db", db_url)
    assert bad.exit_code == 2 and "invalid token name" in bad.output


def test_an_admin_makes_lists_and_revokes_its_tenants_tokens_over_the_api(api: Api) -> None:
    made = api.acme.post(
        "/v1/tokens", json={"scopes": ["runs:read"], "name": "dash", "expires_in": 3600}
    )
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["tenant"] == "acme" and body["scopes"] == ["runs:read"]
    assert 3590 < body["expires_at"] - body["created_at"] <= 3600.5
    secret = body["token"]
    reader = api.client(secret)
    assert reader.get("/v1/runs").status_code == 200
    problem(reader.post("/v1/tokens", json={"scopes": ["admin"]}), 403, "forbidden")
    listed = api.acme.get("/v1/tokens").json()
    assert {t["name"] for t in listed} == {"acme-ops", "dash"}
    assert all("token" not in t for t in listed)  # never a secret again
    assert {t["name"] for t in api.other.get("/v1/tokens").json()} == {"globex-ops"}
    # Another tenant's token is unknown here, as its runs are.
    problem(api.other.post(f"/v1/tokens/{body['id']}/revoke"), 404, "not_found")
    assert reader.get("/v1/runs").status_code == 200
    revoked = api.acme.post(f"/v1/tokens/{body['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    problem(reader.get("/v1/runs"), 401, "unauthorized")
    for bad in [
        {"scopes": ["runs:delete"]},
        {"scopes": []},
        {"scopes": ["admin"], "expires_in": -1},
        {"scopes": ["admin"], "expires_in": 1e12},
        {"scopes": ["admin"], "name": "x" * 101},
    ]:
        problem(api.acme.post("/v1/tokens", json=bad), 422, "invalid_input")


def test_a_token_is_refused_once_it_has_expired(api: Api) -> None:
    secret = api.token("acme", ("runs:read",), expires_in=1.0)
    client = api.client(secret)
    assert client.get("/v1/runs").status_code == 200
    wait_for(
        lambda: client.get("/v1/runs").status_code == 401, timeout=15, what="the token to expire"
    )
    problem(client.get("/v1/runs"), 401, "unauthorized")


def test_an_open_stream_ends_when_its_token_is_revoked_or_expires(api: Api) -> None:
    h = api.h
    run_id = api.start("listener", {})
    h.spawn("w", lease_ttl=3.0)
    h.wait_parked(engine_id(run_id), "signal:go")  # parked: its stream would go on for ever
    headers = {"Accept": "text/event-stream"}

    # Revoked over the API while the stream is open: the stream ends.
    made = api.acme.post("/v1/tokens", json={"scopes": ["runs:read"]}).json()
    with connect_sse(
        api.client(made["token"]), "GET", f"/v1/runs/{run_id}/events", headers=headers
    ) as source:
        events = source.iter_sse()
        assert next(events).event == "run_queued"
        assert api.acme.post(f"/v1/tokens/{made['id']}/revoke").status_code == 200
        revoked_at = time.monotonic()
        rest = [sse.event for sse in events if sse.data]
    assert time.monotonic() - revoked_at < 10
    assert "run_succeeded" not in rest

    # A token that expires while its stream is open: the stream ends at the expiry.
    secret = api.token("acme", ("runs:read",), expires_in=1.5)
    opened = time.monotonic()
    with connect_sse(
        api.client(secret), "GET", f"/v1/runs/{run_id}/events", headers=headers
    ) as source:
        seen = [sse.event for sse in source.iter_sse() if sse.data]
    assert seen[:1] == ["run_queued"] and "run_succeeded" not in seen
    assert 1.0 <= time.monotonic() - opened < 10
    assert h.app.get(engine_id(run_id)).status == "waiting"  # the run goes on

    # The dashboard's live list on a revoked token ends too.
    made = api.acme.post("/v1/tokens", json={"scopes": ["runs:read"]}).json()
    with (
        httpx.Client(
            base_url=api.base, timeout=30, headers={"Authorization": f"Bearer {made['token']}"}
        ) as client,
        client.stream("GET", "/ui/runs/live") as live,
    ):
        lines = live.iter_lines()
        assert api.acme.post(f"/v1/tokens/{made['id']}/revoke").status_code == 200
        tail = list(lines)
    assert ": the token was revoked or has expired" in tail
