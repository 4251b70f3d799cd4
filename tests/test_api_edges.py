"""The HTTP API's rough edges, against a real server on both backends: ``/v1/workflows``
lists graphs registered from the command line; JSON is taken as written (strict, no
coercion), a body that is not JSON is refused naming its line and column, messages speak
JSON and cut what they echo; 400 and 413 answer in the one error shape; a signal answers
with the run's status after it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from proc import Harness
from test_cli import ok
from test_server import TENANTS, Api, api_of, engine_id, problem

from ratchet.web.limits import MAX_BODY


@pytest.fixture
def api(h: Harness) -> Iterator[Api]:
    with api_of(h, TENANTS[:1]) as a:
        yield a


def graph_file(tmp_path: Path, greeting: str) -> Path:
    path = tmp_path / f"hello-{greeting}.json"
    path.write_text(
        json.dumps(
            {
                "name": "hello",
                "nodes": [
                    {"id": "start", "type": "trigger"},
                    {"id": "out", "type": "output", "data": {"value": greeting}},
                ],
                "edges": [{"from": "start", "to": "out"}],
            }
        )
    )
    return path


def test_workflows_lists_the_graphs_registered_from_the_command_line(
    api: Api, tmp_path: Path
) -> None:
    db = api.h.db_url
    before = {w["name"] for w in api.acme.get("/v1/workflows").json()}
    assert "hello" not in before and "chain" in before
    first = ok("--db", db, "graph", "register", str(graph_file(tmp_path, "hi")))
    second = ok("--db", db, "graph", "register", str(graph_file(tmp_path, "hey")))
    version = second.stdout.split("version ")[1].strip()
    listed = {w["name"]: w for w in api.acme.get("/v1/workflows").json()}
    # The version a start takes: the newest; and every version, newest first.
    assert listed["hello"] == {
        "name": "hello",
        "kind": "graph",
        "version": version,
        "parameters": ["input"],
        "versions": [version, first.stdout.split("version ")[1].strip()],
    }
    assert listed["chain"]["kind"] == "code"
    started = api.acme.post("/v1/runs", json={"workflow": "hello", "input": {}})
    assert started.status_code == 202, started.text
    assert api.h.app.get(engine_id(started.json()["run_id"])).workflow_version == version


def test_json_input_is_taken_as_written_and_messages_speak_json(api: Api) -> None:
    app = api.h.app
    for n, said in [(True, "true"), ("3", '"3"'), (2.5, "2.5"), (None, "null")]:
        refused = problem(
            api.acme.post("/v1/runs", json={"workflow": "chain", "input": {"n": n}}),
            422,
            "invalid_input",
        )
        message = refused["message"]
        assert message.startswith(
            f"invalid argument 'n' of workflow chain: expected int, got {said}: "
        ), message
        assert "<class" not in message and "True" not in message, message
        batch = problem(
            api.acme.post(
                "/v1/runs:batch",
                json={
                    "runs": [
                        {"workflow": "chain", "input": {"n": 1}},
                        {"workflow": "chain", "input": {"n": n}},
                    ]
                },
            ),
            422,
            "invalid_input",
        )
        assert batch["details"][0]["field"] == "runs[1].input", batch
    # What a message repeats of a refused value is cut short.
    long = problem(
        api.acme.post("/v1/runs", json={"workflow": "chain", "input": {"n": "x" * 50_000}}),
        422,
        "invalid_input",
    )
    assert '"xxxx' in long["message"] and "…" in long["message"], long
    assert len(long["message"]) < 300, len(long["message"])
    guards = problem(
        api.acme.post(
            "/v1/runs",
            json={"workflow": "chain", "input": {}, "guards": {"max_steps": "y" * 50_000}},
        ),
        422,
        "invalid_input",
    )
    assert len(guards["message"]) < 300, len(guards["message"])
    # The request bodies are strict too: "30" is no number of seconds.
    token = problem(
        api.acme.post("/v1/tokens", json={"scopes": ["runs:read"], "expires_in": "30"}),
        422,
        "invalid_input",
    )
    assert token["details"][0]["field"] == "expires_in", token
    assert app.runs() == []  # none of it wrote a run
    # What fits is taken.
    assert (
        api.acme.post("/v1/runs", json={"workflow": "chain", "input": {"n": 3}}).status_code == 202
    )


def test_a_body_that_is_not_json_is_refused_naming_its_line_and_column(api: Api) -> None:
    text = '{\n  "workflow": "chain",\n  "input": {"n": 1,}\n}'
    with pytest.raises(json.JSONDecodeError) as where:
        json.loads(text)
    refused = problem(
        api.acme.post("/v1/runs", content=text, headers={"Content-Type": "application/json"}),
        422,
        "invalid_input",
    )
    line, column = where.value.lineno, where.value.colno
    assert (line, column) == (3, 20)
    assert refused["message"] == (
        f"invalid JSON at line {line}, column {column}: {where.value.msg}"
    ), refused
    assert refused["details"] == [
        {"field": "body", "message": refused["message"], "line": line, "column": column}
    ]
    assert api.h.app.runs() == []


def test_400_and_413_answer_in_the_one_shape(api: Api) -> None:
    unreadable = problem(
        api.acme.post(
            "/v1/runs",
            content=b'{"workflow": "ch\xffain"}',
            headers={"Content-Type": "application/json"},
        ),
        400,
        "bad_request",
    )
    assert unreadable["message"] == "the body is not UTF-8 text: byte 16 cannot be decoded"
    big = {"workflow": "chain", "input": {"pad": "x" * MAX_BODY}}
    declared = problem(api.acme.post("/v1/runs", json=big), 413, "payload_too_large")
    chunked = problem(
        api.acme.post(
            "/v1/runs",
            content=(b"x" * 65536 for _ in range(20)),
            headers={"Content-Type": "application/json"},
        ),
        413,
        "payload_too_large",
    )
    assert (
        declared
        == chunked
        == {
            "error": "payload_too_large",
            "message": f"request body over {MAX_BODY} bytes",
            "details": {"limit": MAX_BODY},
        }
    )
    spec = httpx.get(f"{api.base}/openapi.json").json()
    responses = spec["paths"]["/v1/runs"]["post"]["responses"]
    assert {"400", "413", "422"} <= set(responses), sorted(responses)
    assert api.h.app.runs() == []


def test_a_signal_answers_with_the_status_after_it(api: Api) -> None:
    h = api.h
    run_id = api.start("listener", {})
    h.spawn("w", lease_ttl=3.0)
    h.wait_parked(engine_id(run_id), "signal:go")
    other = api.acme.post(f"/v1/runs/{run_id}/signals/later", json={"data": 1})
    assert other.status_code == 202 and other.json()["status"] == "waiting", other.text
    woke = api.acme.post(f"/v1/runs/{run_id}/signals/go", json={"data": 2})
    assert woke.status_code == 202, woke.text
    # Queued again (or already taken by the worker): no longer the waiting it was.
    assert woke.json()["status"] in ("queued", "running", "succeeded"), woke.text
