"""Queues through a real server, on both backends: GET /v1/queues and PATCH
/v1/queues/{name} (admin tokens of the default tenant only: queues are fleet-wide), a
change that every worker process obeys at its next claim, concurrency_key on starts (a
tenant's own), and bad input refused with nothing written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import queues_app
from proc import Harness
from serving import serving
from test_queues import intervals, most_at_once, wait_done
from test_server import Api, problem

pytestmark = pytest.mark.crash


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> Iterator[Api]:
    h = Harness(db_url, tmp_path, queues_app)
    server = queues_app.build(db_url)
    try:
        with serving(server, workers=0) as base:
            a = Api(base, h, [])
            a.client(a.token("default", ("admin",)))  # the operator
            a.client(a.token("acme", ("runs:read", "runs:write", "admin")))
            a.client(a.token("default", ("runs:read", "runs:write")))
            try:
                yield a
            finally:
                for client in a.clients:
                    client.close()
    finally:
        server.shutdown()
        h.close()


def test_queues_are_listed_and_changed_by_the_operator_and_workers_obey(api: Api) -> None:
    operator, _, writer = api.clients
    listed = operator.get("/v1/queues")
    assert listed.status_code == 200, listed.text
    by_name = {q["name"]: q for q in listed.json()}
    assert by_name["limited"] | {"depth": 0, "in_flight": 0} == {
        "name": "limited",
        "depth": 0,
        "in_flight": 0,
        "concurrency": 2,
        "per_key_concurrency": None,
        "rate": None,
        "hold_while_parked": False,
        "set_by": "code",
    }
    assert by_name["rated"]["rate"] == {"limit": 2, "per_s": 1.0}
    assert by_name["open"]["concurrency"] is None

    changed = operator.patch("/v1/queues/limited", json={"concurrency": 1})
    assert changed.status_code == 200, changed.text
    assert changed.json()["concurrency"] == 1 and changed.json()["set_by"] == "api"

    h = api.h
    for i in range(2):
        h.spawn(f"w{i}", concurrency=4).wait_started()
    started = [
        writer.post("/v1/runs", json={"workflow": "limited", "input": {"dwell": 0.2}})
        for _ in range(4)
    ]
    assert {r.status_code for r in started} == {202}
    ids = [r.json()["run_id"] for r in started]
    wait_done(h, ids)
    assert most_at_once(list(intervals(h).values())) == 1
    assert {h.app.get(r).queue for r in ids} == {"limited"}  # the workflow's queue


def test_only_the_default_tenants_admin_reads_or_changes_queues(api: Api) -> None:
    operator, tenant_admin, writer = api.clients
    problem(tenant_admin.get("/v1/queues"), 403, "forbidden")
    problem(tenant_admin.patch("/v1/queues/limited", json={"concurrency": 1}), 403, "forbidden")
    problem(writer.get("/v1/queues"), 403, "forbidden")
    problem(writer.patch("/v1/queues/limited", json={"concurrency": 1}), 403, "forbidden")
    [limited] = [q for q in operator.get("/v1/queues").json() if q["name"] == "limited"]
    assert limited["concurrency"] == 2 and limited["set_by"] == "code"


def test_bad_limits_and_unknown_queues_are_refused_writing_nothing(api: Api) -> None:
    operator = api.clients[0]
    before = operator.get("/v1/queues").json()
    for body in (
        {"concurrency": -1},
        {"concurrency": 0},
        {"per_key_concurrency": 1.5},
        {"rate": {"limit": 0, "per_s": 1}},
        {"rate": {"limit": 3, "per_s": 0}},
        {"concurency": 3},
        {"concurrency": 3, "hold_while_parked": None},
        {},
    ):
        r = operator.patch("/v1/queues/limited", json=body)
        assert r.status_code == 422, (body, r.text)
    problem(operator.patch("/v1/queues/nowhere", json={"concurrency": 3}), 404, "not_found")
    assert operator.get("/v1/queues").json() == before


def test_concurrency_keys_are_the_tenants_own(api: Api) -> None:
    _, tenant_admin, writer = api.clients
    h = api.h
    body = {"workflow": "keyed", "input": {}, "concurrency_key": "k"}
    a = tenant_admin.post("/v1/runs", json=body)
    b = writer.post("/v1/runs", json=body)
    batch = writer.post(
        "/v1/runs:batch",
        json={"runs": [{"workflow": "keyed", "input": {}}], "concurrency_key": "k2"},
    )
    assert (a.status_code, b.status_code, batch.status_code) == (202, 202, 202), batch.text
    keys = h.app.portal.call(
        h.app.store._read(
            lambda tx: {r["concurrency_key"] for r in tx.all("runs_keys", {"queue": "keyed"})}
        )
    )
    assert keys == {"acme/k", "k", "k2"}
    # Each caller reads back the key it gave, never another tenant's prefix.
    shown = tenant_admin.get(f"/v1/runs/{a.json()['run_id']}").json()
    assert shown["concurrency_key"] == "k"
    assert h.app.get(b.json()["run_id"]).concurrency_key == "k"


def _signed_in(api: Api, secret: str) -> httpx.Client:
    client = httpx.Client(base_url=api.base, timeout=30)
    api.clients.append(client)
    r = client.post("/signin", data={"token": secret, "next": "/queues"})
    assert r.status_code == 303, r.text  # signed in, sent on
    return client


def test_the_dashboard_shows_the_queues_to_the_operator_alone(api: Api) -> None:
    h = api.h
    h.app.start("limited", dwell=0.0)
    operator = _signed_in(api, api.token("default", ("admin",)))
    page = operator.get("/queues")
    assert page.status_code == 200, page.text
    html = page.text
    assert '<tr data-queue="limited">' in html and '<tr data-queue="rated">' in html
    row = html.split('<tr data-queue="limited">')[1].split("</tr>")[0]
    cells = [c.split(">", 1)[1] for c in row.split("</td>")[:-1]]
    assert [c.strip() for c in cells] == [
        "limited",
        "1",
        "0 / 2",
        "2",
        "–",
        "–",
        "free their slot",
        "code",
    ]
    assert 'href="/queues"' in operator.get("/runs").text

    other = _signed_in(api, api.token("acme", ("runs:read", "runs:write", "admin")))
    refused = other.get("/queues")
    assert refused.status_code == 403 and "limited" not in refused.text
    assert 'href="/queues"' not in other.get("/runs").text
