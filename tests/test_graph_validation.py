"""Graph validation names the node and field of every problem and writes nothing; the CLI
verbs validate, schema, register, list and start."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import ratchet
from ratchet.cli import cli
from ratchet.graphs import GraphInvalid, validate

BAD = {
    "name": "bad",
    "nodes": [
        {"id": "start", "type": "trigger"},
        {
            "id": "file",
            "type": "tool",
            "data": {"tool": "nope", "args": {"t": "{{ nodes.ghost.output }}"}},
        },
        {"id": "weird", "type": "sparkle"},
        {"id": "broken", "type": "ai-step", "data": {"model": "m", "prompt": "{{ input. }}"}},
        {"id": "a", "type": "join"},
        {"id": "b", "type": "join"},
        {"id": "lonely", "type": "output"},
    ],
    "edges": [
        {"from": "start", "to": "file"},
        {"from": "file", "to": "missing"},
        {"from": "start", "to": "broken"},
        {"from": "broken", "to": "a"},
        {"from": "a", "to": "b"},
        {"from": "b", "to": "a"},
    ],
}

EXPECTED = [
    ("file", "nodes[1].data.tool", "unknown tool 'nope'"),
    ("weird", "nodes[2].type", "unknown node type 'sparkle'"),
    ("file", "edges[1].to", "dangling edge: no node 'missing'"),
    ("file", "nodes[1].data.args.t", "there is no node 'ghost'"),
    ("broken", "nodes[3].data.prompt", "bad template"),
    ("a", "nodes[4]", "cycle outside a loop: a -> b -> a"),
    ("lonely", "nodes[6]", "unreachable node"),
]


def test_every_problem_names_its_node_and_field() -> None:
    graph, problems = validate(BAD, tools=["lookup"])
    assert graph is None
    for node, field, message in EXPECTED:
        assert any(
            p.node == node and p.field == field and message in p.message for p in problems
        ), (node, field, message, [str(p) for p in problems])
    assert len(problems) == len(EXPECTED)


def _isolated(*nodes: dict[str, Any], **top: object) -> dict[str, Any]:
    ids = ["start", *(n["id"] for n in nodes)]
    return {
        "name": "iso",
        "tier": "isolated",
        **top,
        "nodes": [{"id": "start", "type": "trigger"}, *nodes],
        "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
    }


def test_an_isolated_graph_refuses_each_node_a_sandbox_cannot_run() -> None:
    app = ratchet.Ratchet("sqlite:///unused.db")

    @app.tool(requires_approval=True)
    def wire(amount: int) -> int:
        return amount

    @app.tool
    def ok(n: int) -> int:
        return n

    doc = _isolated(
        {"id": "ask", "type": "approval"},
        {"id": "kid", "type": "subagent", "data": {"graph": "other"}},
        {"id": "post", "type": "connector", "data": {"url": "http://example.invalid"}},
        {"id": "think", "type": "ai-step", "data": {"model": "m", "prompt": "hi"}},
        {"id": "pay", "type": "tool", "data": {"tool": "wire", "args": {"amount": 1}}},
        {
            "id": "slow",
            "type": "tool",
            "data": {
                "tool": "ok",
                "args": {"n": 1},
                "retry": {"maxAttempts": 3, "backoffMs": 1500},
            },
        },
        {
            "id": "fine",
            "type": "tool",
            "data": {"tool": "ok", "args": {"n": 1}, "retry": {"maxAttempts": 2, "backoffMs": 100}},
        },
    )
    graph, problems = validate(doc, tools=app.tools)
    assert graph is None
    found = {p.node: (p.field, p.message) for p in problems}
    assert sorted(str(node) for node in found) == ["ask", "kid", "pay", "post", "slow", "think"]
    assert found["ask"][0] == "nodes[1].type"
    assert "approval nodes cannot run in an isolated graph" in found["ask"][1]
    assert "child run" in found["kid"][1] and "no network" in found["post"][1]
    assert "model provider" in found["think"][1] and "tool 'wire'" in found["pay"][1]
    assert found["slow"] == (
        "nodes[6].data.retry",
        "a backoff of 3s parks the run, which an isolated graph cannot: keep each backoff under 2s",
    )
    # The same nodes in-process are fine.
    assert validate({**doc, "tier": "process"}, tools=app.tools)[1] == []


def test_an_isolated_graph_checks_its_sandbox() -> None:
    tool = {"id": "t", "type": "tool", "data": {"tool": "ok"}}
    graph, _ = validate(
        _isolated(
            tool, sandbox={"memory_mb": 128, "network": "report-only", "mounts": ["/srv/data"]}
        )
    )
    assert graph is not None and graph.sandbox == ratchet.Sandbox(
        memory_mb=128, network="report-only", mounts=("/srv/data",)
    )
    assert validate(_isolated(tool))[0].sandbox == ratchet.Sandbox()  # type: ignore[union-attr]
    assert validate({**_isolated(tool), "tier": "process"})[0].sandbox is None  # type: ignore[union-attr]
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"sandbox": {"memory": 1}}, "sandbox", "unknown field(s) memory; expected cpus, "),
        ({"sandbox": {"network": "host"}}, "sandbox", "Sandbox network must be one of none"),
        ({"tier": "process", "sandbox": {}}, "sandbox", "a sandbox needs tier: isolated"),
        ({"tier": "vm"}, "tier", "Input should be 'process' or 'isolated'"),
    ]
    for top, field, message in cases:
        _, problems = validate({**_isolated(tool), **top})
        assert [p.field for p in problems] == [field], problems
        assert message in problems[0].message, problems


def test_an_invalid_graph_writes_nothing(make_app: object, db_url: str) -> None:
    app = ratchet.Ratchet(db_url)
    try:
        with pytest.raises(GraphInvalid) as e:
            app.graph(BAD)
        assert len(e.value.problems) == len(EXPECTED)  # the app has no tools: "nope" is unknown
        assert app.portal.call(app.store.list_graphs()) == []
        assert app.runs() == []
    finally:
        app.shutdown()


def test_cli_verbs(tmp_path: Path, db_url: str) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(BAD))
    out = runner.invoke(cli, ["graph", "validate", str(bad)])
    assert out.exit_code == 1
    for node, field, _ in EXPECTED[1:]:
        assert f"node {node!r}: {field}" in out.output
    out = runner.invoke(cli, ["--db", db_url, "graph", "register", str(bad)])
    assert out.exit_code == 1 and "not registered" in out.output
    schema = json.loads(runner.invoke(cli, ["graph", "schema"]).output)
    assert schema["title"] == "Ratchet graph" and "LoopNode" in schema["$defs"]
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps(
            {
                "name": "hello",
                "nodes": [
                    {"id": "start", "type": "trigger"},
                    {"id": "out", "type": "output", "data": {"value": "hi {{ input.who }}"}},
                ],
                "edges": [{"from": "start", "to": "out"}],
            }
        )
    )
    out = runner.invoke(cli, ["graph", "validate", str(good)])
    assert out.exit_code == 0 and "is valid" in out.output
    out = runner.invoke(cli, ["--db", db_url, "graph", "register", str(good)])
    assert out.exit_code == 0, out.output
    version = out.output.split("version ")[1].strip()
    listed = json.loads(runner.invoke(cli, ["--db", db_url, "graph", "list", "--json"]).output)
    assert [(g["name"], g["version"]) for g in listed] == [("hello", version)]
    out = runner.invoke(cli, ["--db", db_url, "start", "hello", "--input", '{"who": "ana"}'])
    assert out.exit_code == 0, out.output
    run_id = out.output.strip()
    # A worker of an app that knows nothing of the graph drives it from the database.
    app = ratchet.Ratchet(db_url)
    with app:
        app.launch()
        assert app.result(run_id, timeout_s=30) == "hi ana"
        assert app.get(run_id).workflow_version == version
