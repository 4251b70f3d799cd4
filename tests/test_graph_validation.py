"""Graph validation names the node and field of every problem and writes nothing; the CLI
verbs validate, schema, register, list and start."""

from __future__ import annotations

import json
from pathlib import Path

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
        {"id": "file", "type": "tool", "data": {"tool": "nope",
                                                "args": {"t": "{{ nodes.ghost.output }}"}}},
        {"id": "weird", "type": "sparkle"},
        {"id": "broken", "type": "ai-step", "data": {"model": "m", "prompt": "{{ input. }}"}},
        {"id": "a", "type": "join"},
        {"id": "b", "type": "join"},
        {"id": "lonely", "type": "output"},
    ],
    "edges": [{"from": "start", "to": "file"}, {"from": "file", "to": "missing"},
              {"from": "start", "to": "broken"}, {"from": "broken", "to": "a"},
              {"from": "a", "to": "b"}, {"from": "b", "to": "a"}],
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
        assert any(p.node == node and p.field == field and message in p.message
                   for p in problems), (node, field, message, [str(p) for p in problems])
    assert len(problems) == len(EXPECTED)


def test_an_invalid_graph_writes_nothing(make_app: object, db_url: str) -> None:
    app = ratchet.Ratchet(db_url)
    try:
        with pytest.raises(GraphInvalid) as e:
            app.graph(BAD)
        assert len(e.value.problems) == len(EXPECTED)  # the app has no tools: "nope" is unknown
        assert app._portal.call(app.store.list_graphs()) == []
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
    good.write_text(json.dumps({"name": "hello", "nodes": [
        {"id": "start", "type": "trigger"},
        {"id": "out", "type": "output", "data": {"value": "hi {{ input.who }}"}}],
        "edges": [{"from": "start", "to": "out"}]}))
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
