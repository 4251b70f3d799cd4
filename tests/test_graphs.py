"""Graph workflows on SQLite and PostgreSQL: a registered graph runs on the one engine
(every side-effecting node a journaled step), a re-drive re-invokes nothing, a run keeps
the graph version it started with, loops key their steps by iteration, conditions branch,
parallel nodes run at once, subagents are child runs found again, and approvals park."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import ratchet
from ratchet.model import EventKind

CALLS: dict[str, int] = {}


def graph(name: str, nodes: list[dict[str, Any]], edges: list[tuple[str, ...]],
          **more: Any) -> dict[str, Any]:
    es = [{"from": e[0], "to": e[1], **({"when": e[2]} if len(e) > 2 else {})} for e in edges]
    return {"name": name, "nodes": nodes, "edges": es, **more}


@pytest.fixture
def app(make_app: Callable[..., ratchet.Ratchet]) -> ratchet.Ratchet:
    app = make_app()
    CALLS.clear()

    @app.tool
    async def score(account: str) -> dict[str, Any]:
        CALLS[f"score:{account}"] = CALLS.get(f"score:{account}", 0) + 1
        return {"account": account, "score": len(account)}

    @app.tool
    def tag(label: str) -> str:
        CALLS[f"tag:{label}"] = CALLS.get(f"tag:{label}", 0) + 1
        return label.upper()

    @app.workflow
    async def helper(n: int) -> int:
        return n * 2

    return app


def step_ids(app: ratchet.Ratchet, run_id: str) -> list[str]:
    return [e.step_id for e in app.events(run_id)
            if e.kind == EventKind.STEP_COMPLETED and e.step_id]


def test_a_graph_runs_its_nodes_as_steps_and_a_redrive_reinvokes_nothing(
        app: ratchet.Ratchet) -> None:
    doc = graph("scoring", [
        {"id": "start", "type": "trigger"},
        {"id": "first", "type": "tool", "data": {"tool": "score",
                                                 "args": {"account": "{{ input.account }}"}}},
        {"id": "big", "type": "condition",
         "data": {"expression": "nodes.first.output.score > 3"}},
        {"id": "loud", "type": "tool", "data": {"tool": "tag", "args": {"label": "big"}}},
        {"id": "quiet", "type": "tool", "data": {"tool": "tag", "args": {"label": "small"}}},
        {"id": "done", "type": "join"},
    ], [("start", "first"), ("first", "big"), ("big", "loud", "output"),
        ("big", "quiet", "not output"), ("loud", "done"), ("quiet", "done")],
        output={"score": "{{ nodes.first.output.score }}",
                "tag": "{{ nodes.loud.output }}"})
    version = app.graph(doc)
    assert app.graph(doc) == version  # the same content: the same version, one row
    with app:
        app.launch()
        run_id = app.start("scoring", {"account": "acme"})
        assert app.result(run_id, timeout_s=30) == {"score": 4, "tag": "BIG"}
        rec = app.get(run_id)
        assert (rec.workflow, rec.workflow_version) == ("scoring", version)
        assert step_ids(app, run_id) == ["1:first", "2:loud"]
        assert CALLS == {"score:acme": 1, "tag:big": 1}
