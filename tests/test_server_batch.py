"""``POST /v1/runs:batch`` against a real uvicorn, on both backends: ids in order, one
transaction (a bad item names ``runs[i].field`` and nothing is written), idempotent by run id
and by Idempotency-Key, tenants kept apart (each names its runs in its own namespace), and
the runs driven to the end by a worker
process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from proc import Harness
from test_server import Api, api_of, engine_id, problem


@pytest.fixture
def served(h: Harness) -> Iterator[Api]:
    """An API-only server on the harness's database, with clients of two tenants."""
    with api_of(h, (("acme", None), ("globex", None))) as a:
        yield a


def _runs(api: Api) -> set[str]:
    return {r.run_id for r in api.h.app.runs(limit=1000)}


def test_a_batch_starts_runs_in_order_and_a_worker_finishes_them(served: Api) -> None:
    api = served
    body = {
        "runs": [{"workflow": "chain", "input": {"n": 1 + i % 3}} for i in range(40)]
        + [{"workflow": "chain", "input": {"n": 2}, "run_id": "b-last"}]
    }
    r = api.acme.post("/v1/runs:batch", json=body)
    assert r.status_code == 202, r.text
    runs = r.json()["runs"]
    assert len(runs) == 41 and runs[-1] == {"run_id": "b-last", "status": "queued", "created": True}
    assert len({x["run_id"] for x in runs}) == 41
    assert [api.h.app.get(engine_id(x["run_id"])).input for x in runs[:3]] == [
        {"args": [], "kwargs": {"n": n}} for n in (1, 2, 3)
    ]
    api.h.spawn("w", lease_ttl=3.0, recovery_interval=0.5)
    for i, x in enumerate(runs):
        got = api.acme.get(f"/v1/runs/{x['run_id']}/result", params={"wait": 30}).json()
        n = 2 if i == 40 else 1 + i % 3
        assert got["status"] == "succeeded" and got["output"] == [
            f"out-{k}" for k in range(1, n + 1)
        ], got


def test_a_batch_is_idempotent_by_run_id_and_by_key(served: Api) -> None:
    api = served
    body = {
        "runs": [
            {"workflow": "chain", "input": {"n": 1}, "run_id": "i-1"},
            {"workflow": "chain", "input": {"n": 2}},
        ]
    }
    key = {"Idempotency-Key": "nightly-7"}
    first = api.acme.post("/v1/runs:batch", json=body, headers=key)
    again = api.acme.post("/v1/runs:batch", json=body, headers=key)
    assert (first.status_code, again.status_code) == (202, 200)
    assert [x["run_id"] for x in first.json()["runs"]] == [
        x["run_id"] for x in again.json()["runs"]
    ]
    assert [x["created"] for x in again.json()["runs"]] == [False, False]
    # The same key with a different body is refused, naming the item; nothing is written.
    changed = {
        "runs": [
            body["runs"][0],
            {"workflow": "chain", "input": {"n": 3}},
            {"workflow": "chain", "input": {"n": 4}},
        ]
    }
    before = _runs(api)
    refused = problem(
        api.acme.post("/v1/runs:batch", json=changed, headers=key), 422, "invalid_input"
    )
    assert refused["message"].startswith("runs[1].run_id: ") and refused["details"] == [
        {"field": "runs[1].run_id", "message": refused["message"].split(": ", 1)[1]}
    ]
    assert _runs(api) == before
    # Another tenant's same key is other runs, and its own "i-1" is another run: created as
    # if acme's did not exist, and acme's is untouched.
    other = api.other.post("/v1/runs:batch", json={"runs": [body["runs"][1]]}, headers=key)
    assert other.status_code == 202 and other.json()["runs"][0]["created"] is True
    mine = api.other.post(
        "/v1/runs:batch",
        json={
            "runs": [
                {"workflow": "chain", "input": {"n": 9}},
                body["runs"][0] | {"input": {"n": 5}},
            ]
        },
    )
    assert mine.status_code == 202, mine.text
    assert [x["created"] for x in mine.json()["runs"]] == [True, True]
    assert mine.json()["runs"][1]["run_id"] == "i-1"
    assert len(_runs(api)) == len(before) + 3
    assert api.other.get("/v1/runs/i-1").json()["input"] == {"n": 5}
    assert api.acme.get("/v1/runs/i-1").json()["input"] == {"n": 1}


def test_a_bad_item_is_named_and_nothing_is_written(served: Api) -> None:
    api = served
    good = {"workflow": "chain", "input": {"n": 1}}
    cases = [
        ({"workflow": "chain", "input": {"n": "many"}}, "runs[1].input"),
        ({"workflow": "nope", "input": {}}, "runs[1].workflow"),
        ({"workflow": "chain", "input": {}, "run_id": "no spaces"}, "runs[1].run_id"),
        ({"workflow": "chain", "input": {}, "guards": {"max_steps": "lots"}}, "runs[1].guards"),
        ({"input": {}}, "runs[1].workflow"),
    ]  # the schema's own check
    for bad, field in cases:
        refused = problem(
            api.acme.post("/v1/runs:batch", json={"runs": [good, bad, good]}), 422, "invalid_input"
        )
        assert refused["details"][0]["field"] == field, refused
    assert _runs(api) == set()
    empty = problem(api.acme.post("/v1/runs:batch", json={"runs": []}), 422, "invalid_input")
    assert empty["details"][0]["field"] == "runs"
    too_many = problem(
        api.acme.post("/v1/runs:batch", json={"runs": [good] * 10_001}), 422, "invalid_input"
    )
    assert too_many["details"][0]["field"] == "runs"
    assert _runs(api) == set()
