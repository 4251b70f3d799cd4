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

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "accounts.yaml"

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


def _approved_then(reader: str, output: Any = None) -> dict[str, Any]:
    """A draft a person approves; ``send`` on the yes branch, ``tell`` on the no branch, both
    joined at ``done``, an output node rendering ``reader``."""
    doc: dict[str, Any] = {
        "name": "mail",
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "draft", "type": "tool", "data": {"tool": "write", "args": {}}},
            {"id": "ask", "type": "approval", "data": {"ask": "{{ nodes.draft.output }}"}},
            {"id": "send", "type": "tool", "data": {"tool": "write", "args": {}}},
            {"id": "tell", "type": "tool", "data": {"tool": "write", "args": {}}},
            {"id": "done", "type": "output", "data": {"value": reader}},
        ],
        "edges": [
            {"from": "start", "to": "draft"},
            {"from": "draft", "to": "ask"},
            {"from": "ask", "to": "send", "when": "output.approved"},
            {"from": "ask", "to": "tell", "when": "not output.approved"},
            {"from": "send", "to": "done"},
            {"from": "tell", "to": "done"},
        ],
    }
    if output is not None:
        doc["output"] = output
    return doc


def test_a_template_reading_a_node_of_another_branch_is_refused_naming_both(
    make_app: Any,
) -> None:
    graph, problems = validate(_approved_then("{{ nodes.send.output }}"))
    assert graph is None
    [p] = problems
    assert (p.node, p.field) == ("done", "nodes[5].data.value")
    assert "reads nodes.send, and node 'send' may not have run when 'done' runs" in p.message
    # The graph's output, rendered when the walk ends, whichever branch it took.
    _, problems = validate(_approved_then("{{ nodes.ask.output }}", "{{ nodes.tell.output }}"))
    [p] = problems
    assert (p.node, p.field) == (None, "output")
    assert "node 'tell' is not on every way through the graph" in p.message
    # At registration: refused before anything is written, the reader and the node named.
    app = make_app()

    @app.tool
    def write() -> str:
        return "text"

    with pytest.raises(GraphInvalid, match=r"node 'done': nodes\[5\].data.value: .*'send'"):
        app.graph(_approved_then("{{ nodes.send.output }}"))
    assert app.portal.call(app.store.list_graphs()) == []


def test_reads_of_nodes_that_surely_ran_pass() -> None:
    for reader in [
        "{{ nodes.ask.output.approved }}",  # before the branches
        "{{ nodes.draft.output }}",
        "{{ nodes.send.output if nodes.send is defined else nodes.tell.output }}",  # tests
        "{{ nodes.send.output if 'send' in nodes else 'no' }}",
    ]:
        assert validate(_approved_then(reader, "{{ nodes.done.output }}"))[1] == [], reader
    # Both sides of a parallel node run: a node after them reads either.
    doc = {
        "name": "fan",
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "fan", "type": "parallel"},
            {"id": "left", "type": "tool", "data": {"tool": "write"}},
            {"id": "right", "type": "tool", "data": {"tool": "write"}},
            {"id": "both", "type": "join"},
            {"id": "after", "type": "output", "data": {"value": "{{ nodes.left.output }}"}},
        ],
        "edges": [
            {"from": "start", "to": "fan"},
            {"from": "fan", "to": "left"},
            {"from": "fan", "to": "right"},
            {"from": "left", "to": "both"},
            {"from": "right", "to": "both"},
            {"from": "both", "to": "after"},
        ],
        "output": "{{ nodes.right.output }}",
    }
    assert validate(doc)[1] == []
    # ...but not each other: they run together.
    doc["nodes"][3]["data"]["args"] = {"x": "{{ nodes.left.output }}"}  # type: ignore[index]
    [p] = validate(doc)[1]
    assert (p.node, p.field) == ("right", "nodes[3].data.args.x")
    # The graphs the tests and the examples run.
    from graph_app import ROUTES

    assert validate(ROUTES)[1] == []
    assert validate(yaml.safe_load(EXAMPLE.read_text()))[1] == []


def test_each_branch_read_is_its_own_nodes_problem() -> None:
    doc = _approved_then("{{ nodes.tell.output }}", "{{ nodes.send.output }}")
    doc["nodes"][4]["data"]["args"] = {"s": "{{ nodes.send.output }}"}  # tell reads send
    doc["edges"][2]["when"] = "nodes.tell.output"  # ask's edge reads what comes after it
    _, problems = validate(doc)
    assert sorted((str(p.node), p.field) for p in problems) == [
        ("None", "output"),
        ("ask", "edges[2].when"),
        ("done", "nodes[5].data.value"),
        ("tell", "nodes[4].data.args.s"),
    ]
    assert all(f"'{p.node}' runs" in p.message for p in problems if p.node is not None)


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
