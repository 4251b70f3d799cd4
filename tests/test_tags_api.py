"""Run tags through the HTTP API of a real server, on both backends: ``POST /v1/runs`` and
``/v1/runs:batch`` take ``tags`` (a code workflow's run or a graph's), every run read shows
them, ``GET /v1/runs?tag=k=v&workflow=...`` filters a tenant's own runs (repeat ``tag``:
all of them), and bad tags or filters are a 422 naming the problem, with nothing written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from proc import Harness
from test_server import Api, api_of, engine_id, problem


@pytest.fixture
def api(h: Harness) -> Iterator[Api]:
    with api_of(h) as a:
        yield a


def ids(api: Api, query: str, client: Any = None) -> list[str]:
    r = (client or api.acme).get(f"/v1/runs?{query}")
    assert r.status_code == 200, r.text
    return sorted(x["run_id"] for x in r.json()["runs"])


def test_runs_started_with_tags_are_shown_and_filtered_within_the_tenant(api: Api) -> None:
    start = {"workflow": "chain", "input": {"n": 1}}
    for run_id, tags in (
        ("a", {"customer": "acme", "env": "prod"}),
        ("b", {"customer": "acme", "env": "staging"}),
        ("c", {"customer": "globex"}),
    ):
        r = api.acme.post("/v1/runs", json=start | {"run_id": run_id, "tags": tags})
        assert r.status_code == 202, r.text
    r = api.acme.post("/v1/runs", json={"workflow": "listener", "run_id": "d", "tags": {"k": "v"}})
    assert r.status_code == 202, r.text
    # Another tenant's runs, tagged the same: never in acme's answers.
    assert api.other.post("/v1/runs", json=start | {"run_id": "a", "tags": {"customer": "acme"}})
    batch = api.other.post(
        "/v1/runs:batch", json={"runs": [start | {"run_id": "x", "tags": {"customer": "acme"}}]}
    )
    assert batch.status_code == 202, batch.text

    assert api.acme.get("/v1/runs/a").json()["tags"] == {"customer": "acme", "env": "prod"}
    assert api.h.app.get(engine_id("a")).tags == {"customer": "acme", "env": "prod"}
    assert ids(api, "tag=customer=acme") == ["a", "b"]
    assert ids(api, "tag=customer%3Dacme&tag=env=prod") == ["a"]  # all of them
    assert ids(api, "tag=customer=acme&workflow=chain&status=queued") == ["a", "b"]
    assert ids(api, "workflow=listener") == ["d"]
    assert ids(api, "workflow=listener&tag=customer=acme") == []
    assert ids(api, "tag=customer=acme", api.other) == ["a", "x"]
    assert ids(api, "tag=env=prod", api.other) == []
    page = api.acme.get("/v1/runs?tag=customer=acme&limit=1").json()
    assert [x["run_id"] for x in page["runs"]] == ["b"] and page["next_cursor"]
    more = api.acme.get(f"/v1/runs?tag=customer=acme&limit=1&cursor={page['next_cursor']}")
    assert [x["run_id"] for x in more.json()["runs"]] == ["a"]


def test_a_graph_run_started_through_the_api_keeps_its_tags(api: Api) -> None:
    api.h.app.graph({"name": "tagged", "nodes": [{"id": "start", "type": "trigger"}], "edges": []})
    r = api.acme.post(
        "/v1/runs",
        json={"workflow": "tagged", "input": {"q": 1}, "run_id": "g", "tags": {"team": "ops"}},
    )
    assert r.status_code == 202, r.text
    assert api.acme.get("/v1/runs/g").json()["tags"] == {"team": "ops"}
    assert ids(api, "tag=team=ops&workflow=tagged") == ["g"]


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ({"bad key": "x"}, "invalid tag key 'bad key'"),
        ({"customer": "v" * 257}, "invalid tag 'customer': its value is 257 characters"),
        ({f"k{i}": "v" for i in range(21)}, "21 of them, over the limit of 20"),
        ({"customer": 7}, "tags.customer"),
    ],
)
def test_bad_tags_are_refused_naming_them_and_nothing_is_written(
    api: Api, tags: Any, message: str
) -> None:
    body = {"workflow": "chain", "input": {"n": 1}, "run_id": "r", "tags": tags}
    assert message in problem(api.acme.post("/v1/runs", json=body), 422, "invalid_input")["message"]
    bad = api.acme.post("/v1/runs:batch", json={"runs": [{"workflow": "chain"}, body]})
    assert message in problem(bad, 422, "invalid_input")["message"]
    assert "runs.1.tags" in bad.text or "runs[1].tags" in bad.text
    assert api.h.app.count_runs() == 0


def test_a_restart_with_other_tags_is_a_conflict_that_quotes_nothing(api: Api) -> None:
    body = {"workflow": "chain", "input": {"n": 1}, "run_id": "r", "tags": {"customer": "acme"}}
    assert api.acme.post("/v1/runs", json=body).status_code == 202
    assert api.acme.post("/v1/runs", json=body).status_code == 200
    other = api.acme.post("/v1/runs", json=body | {"tags": {"customer": "globex"}})
    message = problem(other, 422, "invalid_input")["message"]
    assert "another tags" in message and "acme" not in message


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("tag=customer", "expected key=value"),
        ("tag=a%20b=c", "invalid tag key 'a b'"),
        ("tag=k=1&tag=k=2", "given twice with different values"),
        ("&".join(f"tag=k{i}=v" for i in range(21)), "over the limit of 20"),
    ],
)
def test_a_bad_tag_filter_is_refused_naming_it(api: Api, query: str, message: str) -> None:
    body = problem(api.acme.get(f"/v1/runs?{query}"), 422, "invalid_input")
    assert message in body["message"] and body["details"] == [{"field": "tag"}]
