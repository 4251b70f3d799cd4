"""Graph workflows on SQLite and PostgreSQL: a registered graph runs on the one engine
(every side-effecting node a journaled step), a re-drive re-invokes nothing, a run keeps
the graph version it started with, loops key their steps by iteration, conditions branch,
parallel nodes run at once, subagents are child runs found again, and approvals park."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import ratchet
from ratchet.model import EventKind

CALLS: dict[str, int] = {}
FAIL_ONCE: set[str] = set()  # tag labels whose next call fails (non-retryable)


def graph(
    name: str, nodes: list[dict[str, Any]], edges: list[tuple[str, ...]], **more: Any
) -> dict[str, Any]:
    es = [{"from": e[0], "to": e[1], **({"when": e[2]} if len(e) > 2 else {})} for e in edges]
    return {"name": name, "nodes": nodes, "edges": es, **more}


@pytest.fixture
def app(make_app: Callable[..., ratchet.Ratchet]) -> ratchet.Ratchet:
    app = make_app()
    CALLS.clear()
    FAIL_ONCE.clear()

    @app.tool
    async def score(account: str) -> dict[str, Any]:
        CALLS[f"score:{account}"] = CALLS.get(f"score:{account}", 0) + 1
        return {"account": account, "score": len(account)}

    @app.tool
    def tag(label: str) -> str:
        CALLS[f"tag:{label}"] = CALLS.get(f"tag:{label}", 0) + 1
        if label in FAIL_ONCE:
            FAIL_ONCE.discard(label)
            raise ValueError(f"tag {label} failed once")
        return label.upper()

    @app.workflow
    async def helper(n: int) -> int:
        return n * 2

    return app


def step_ids(app: ratchet.Ratchet, run_id: str) -> list[str]:
    return [
        e.step_id for e in app.events(run_id) if e.kind == EventKind.STEP_COMPLETED and e.step_id
    ]


def test_a_graph_runs_its_nodes_as_steps_and_a_redrive_reinvokes_nothing(
    app: ratchet.Ratchet,
) -> None:
    from ratchet.engine.control import Control
    from ratchet.engine.driver import drive
    from ratchet.graphs.registry import AppWorkflows
    from ratchet.model import ClaimedRun, Lease

    doc = graph(
        "scoring",
        [
            {"id": "start", "type": "trigger"},
            {
                "id": "first",
                "type": "tool",
                "data": {"tool": "score", "args": {"account": "{{ input.account }}"}},
            },
            {
                "id": "big",
                "type": "condition",
                "data": {"expression": "nodes.first.output.score > 3"},
            },
            {"id": "loud", "type": "tool", "data": {"tool": "tag", "args": {"label": "big"}}},
            {"id": "quiet", "type": "tool", "data": {"tool": "tag", "args": {"label": "small"}}},
            {"id": "done", "type": "join"},
        ],
        [
            ("start", "first"),
            ("first", "big"),
            ("big", "loud", "output"),
            ("big", "quiet", "not output"),
            ("loud", "done"),
            ("quiet", "done"),
        ],
        # loud is on one branch: the output tests for it (reading it alone is refused).
        output={
            "score": "{{ nodes.first.output.score }}",
            "tag": "{{ nodes.loud.output if nodes.loud is defined else nodes.quiet.output }}",
        },
    )
    version = app.graph(doc)
    assert app.graph(doc) == version  # the same content: the same version, one row
    FAIL_ONCE.add("big")  # the second tool node fails its first drive: the run fails there
    with app:
        app.launch()
        run_id = app.start("scoring", {"account": "acme"})
        with pytest.raises(ratchet.RunFailed, match="tag big failed once"):
            app.result(run_id, timeout_s=30)
        assert CALLS == {"score:acme": 1, "tag:big": 1}
        # A re-drive mid-graph (the dead-lettered run re-queued) resumes at the failed node:
        # the finished one is read back from the journal, not invoked.
        app.retry(run_id)
        assert app.result(run_id, timeout_s=30) == {"score": 4, "tag": "BIG"}
        assert CALLS == {"score:acme": 1, "tag:big": 2}
        rec = app.get(run_id)
        assert (rec.workflow, rec.workflow_version) == ("scoring", version)
        assert step_ids(app, run_id) == ["1:first", "2:loud"]

        # A re-drive of the finished graph (as a worker that took the run over would do)
        # writes nothing and invokes nothing.
        before = app.events(run_id)
        claimed = ClaimedRun(app.get(run_id), Lease(run_id, "other", 99), "claim")
        outcome = app.portal.call(drive(app.store, claimed, AppWorkflows(app), Control()))
        assert outcome == "noop"
        assert app.events(run_id) == before
        assert CALLS == {"score:acme": 1, "tag:big": 2}


def test_loops_key_steps_by_iteration_and_parallel_nodes_run_together(app: ratchet.Ratchet) -> None:
    doc = graph(
        "fanout",
        [
            {"id": "start", "type": "trigger"},
            {
                "id": "each",
                "type": "loop",
                "data": {"over": "{{ input.accounts }}", "item": "account", "body": ["s"]},
            },
            {
                "id": "s",
                "type": "tool",
                "data": {"tool": "score", "args": {"account": "{{ account }}"}},
            },
            {"id": "split", "type": "parallel"},
            {"id": "a", "type": "tool", "data": {"tool": "tag", "args": {"label": "a"}}},
            {"id": "b", "type": "tool", "data": {"tool": "tag", "args": {"label": "b"}}},
            {"id": "both", "type": "join"},
            {
                "id": "until",
                "type": "loop",
                "data": {"until": "loop.index >= 1", "body": ["t"], "max_iterations": 5},
            },
            {"id": "t", "type": "tool", "data": {"tool": "tag", "args": {"label": "u"}}},
        ],
        [
            ("start", "each"),
            ("each", "s"),
            ("each", "split"),
            ("split", "a"),
            ("split", "b"),
            ("a", "both"),
            ("b", "both"),
            ("both", "until"),
            ("until", "t"),
        ],
        output={
            "scores": "{{ nodes.each.output | map(attribute='score') | list }}",
            "until": "{{ nodes.until.output }}",
            "both": "{{ nodes.both.output }}",
        },
    )
    app.graph(doc)
    with app:
        app.launch()
        run_id = app.start("fanout", {"accounts": ["ab", "abc"]})
        assert app.result(run_id, timeout_s=30) == {
            "scores": [2, 3],
            "until": ["U", "U"],
            "both": {"a": "A", "b": "B"},
        }
        assert step_ids(app, run_id) == [
            "1:each#0/s",
            "2:each#1/s",
            "3:a",
            "4:b",
            "5:until#0/t",
            "6:until#1/t",
        ]


def test_subagents_are_child_runs_and_approvals_follow_their_edges(app: ratchet.Ratchet) -> None:
    app.graph(
        graph(
            "child",
            [
                {"id": "start", "type": "trigger"},
                {
                    "id": "s",
                    "type": "tool",
                    "data": {"tool": "score", "args": {"account": "{{ input.name }}"}},
                },
            ],
            [("start", "s")],
            output="{{ nodes.s.output.score }}",
        )
    )
    app.graph(
        graph(
            "parent",
            [
                {"id": "start", "type": "trigger"},
                {
                    "id": "kid",
                    "type": "subagent",
                    "data": {"graph": "child", "input": {"name": "{{ input.name }}"}},
                },
                {
                    "id": "code",
                    "type": "subagent",
                    "data": {"workflow": "helper", "input": {"n": "{{ nodes.kid.output }}"}},
                },
                {
                    "id": "ok",
                    "type": "approval",
                    "timeout_s": 60,
                    "data": {"ask": {"doubled": "{{ nodes.code.output }}"}},
                },
                {
                    "id": "yes",
                    "type": "output",
                    "data": {"value": "approved by {{ nodes.ok.output.by }}"},
                },
                {"id": "no", "type": "output", "data": {"value": "refused"}},
            ],
            [
                ("start", "kid"),
                ("kid", "code"),
                ("code", "ok"),
                ("ok", "yes", "output.outcome == 'approved'"),
                ("ok", "no", "output.outcome != 'approved'"),
            ],
        )
    )
    with app:
        app.launch()
        run_id = app.start("parent", {"name": "abcd"})
        from waiting import wait_for

        asked = wait_for(lambda: app.approvals(run_id), what="the approval")
        assert asked[0].data == {"doubled": 8}
        app.approve(run_id, asked[0].step_id, by="ana")
        assert app.result(run_id, timeout_s=30) == "approved by ana"
        children = [r for r in app.runs() if r.parent_run_id == run_id]
        assert sorted(r.workflow for r in children) == ["child", "helper"]


def test_a_run_keeps_the_graph_version_it_started_with(app: ratchet.Ratchet) -> None:
    def doc(label: str) -> dict[str, Any]:
        return graph(
            "pinned",
            [
                {"id": "start", "type": "trigger"},
                {"id": "t", "type": "tool", "data": {"tool": "tag", "args": {"label": label}}},
            ],
            [("start", "t")],
        )

    v1 = app.graph(doc("one"))
    first = app.start("pinned")
    v2 = app.graph(doc("two"))
    assert v1 != v2
    second = app.start("pinned")
    with app:
        app.launch()
        assert app.result(first, timeout_s=30) == "ONE"
        assert app.result(second, timeout_s=30) == "TWO"
    assert app.get(first).workflow_version == v1


def test_a_graph_input_is_checked_before_anything_is_written(app: ratchet.Ratchet) -> None:
    app.graph(
        graph(
            "typed",
            [{"id": "start", "type": "trigger"}],
            [],
            inputs={"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}},
        )
    )
    with pytest.raises(ratchet.InvalidInput, match=r"input\.n must be integer"):
        app.start("typed", {"n": "x"})
    with pytest.raises(ratchet.InvalidInput, match=r"input\.n is required"):
        app.start("typed", {})
    # The refusal lists what could have started: code workflows and registered graphs.
    with pytest.raises(ratchet.UnknownWorkflow, match="no registered graph.*graphs: .*typed"):
        app.start("nothing", {})
    assert app.runs() == []
