"""Approvals on SQLite and PostgreSQL: a run parks on ``ratchet.approval`` until a person
decides (``app.approve`` / ``app.reject``, the CLI verbs), the decision is recorded once
(a second one, even at the same moment, is refused), a timeout raises, a child's approval
is listed under its top-level run, a critical tool waits for one before it runs, and
approvals survive SIGKILLed worker processes."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from proc import Harness
from typer.testing import CliRunner, Result
from waiting import wait_for

import ratchet
from ratchet.cli import cli
from ratchet.model import EventKind

CALLS: dict[str, int] = {}


def kinds(events: list[ratchet.Event], step_id: str) -> list[str]:
    return [e.kind for e in events if e.step_id == step_id]


def pending(app: ratchet.Ratchet, run_id: str | None = None) -> list[ratchet.Approval]:
    return wait_for(lambda: app.approvals(run_id), what="a pending approval")


@pytest.fixture
def app(make_app: Callable[..., ratchet.Ratchet]) -> ratchet.Ratchet:
    app = make_app()
    CALLS.clear()

    @app.workflow
    async def refund(amount: int, timeout_s: float | None = None) -> dict[str, Any]:
        try:
            d = await ratchet.approval("refund", data={"amount": amount}, timeout_s=timeout_s)
        except ratchet.ApprovalTimeout as e:
            return {"timed_out": str(e)}
        assert isinstance(d, ratchet.Decision)
        return {"approved": d.approved, "by": d.by, "comment": d.comment, "at": d.at.isoformat()}

    @app.workflow
    async def strict(timeout_s: float) -> bool:
        return (await ratchet.approval("strict", timeout_s=timeout_s)).approved

    @app.workflow
    async def payout(amount: int) -> dict[str, Any]:
        d = await ratchet.approval("payout", data={"amount": amount})
        return {"approved": d.approved, "by": d.by}

    @app.workflow
    async def payout_parent(amount: int) -> list[Any]:
        return ["before", await ratchet.child(payout, amount), "after"]

    @app.workflow
    async def twice() -> list[bool]:
        a, b = await asyncio.gather(ratchet.approval("ok"), ratchet.approval("ok"))
        return [a.approved, b.approved]

    @app.tool(risk="critical")
    async def wire(account: str, cents: int) -> str:
        """Send money."""
        CALLS["wire"] = CALLS.get("wire", 0) + 1
        return f"sent {cents} to {account}"

    @app.tool(requires_approval=True)
    def delete_user(user: str) -> str:
        CALLS["delete_user"] = CALLS.get("delete_user", 0) + 1
        return f"deleted {user}"

    @app.workflow
    async def banker(account: str, cents: int) -> str:
        try:
            return await wire(account, cents)
        except ratchet.ApprovalRejected as e:
            return f"refused: {e.error}"

    @app.workflow
    async def janitor(user: str) -> str:
        return await delete_user(user)

    app.launch()
    return app


# -- deciding -------------------------------------------------------------------------------


def test_approve_wakes_the_run_with_the_decision_journaled_as_the_steps_completion(
    app: ratchet.Ratchet,
) -> None:
    run_id = app.start("refund", 40, 3600)  # by position: timeout_s= is the run's deadline
    [asked] = pending(app)
    assert (asked.run_id, asked.step_id, asked.name, asked.data) == (
        run_id,
        "1:approval:refund",
        "refund",
        {"amount": 40},
    )
    assert asked.root_run_id == run_id and asked.parent_run_id is None
    assert asked.deadline is not None and asked.deadline - asked.asked_at == pytest.approx(
        3600, abs=5
    )

    decision = app.approve(run_id, "1:approval:refund", by="ana", comment="fine")
    assert (decision.approved, decision.by, decision.comment) == (True, "ana", "fine")
    assert decision.at.tzinfo is not None
    out = app.result(run_id, timeout_s=30)
    assert out == {"approved": True, "by": "ana", "comment": "fine", "at": decision.at.isoformat()}
    assert app.approvals() == []

    events = app.events(run_id)
    step = "1:approval:refund"
    assert kinds(events, step) == ["step_waiting", "approval_decided", "step_completed"]
    waiting = next(e for e in events if e.kind == EventKind.STEP_WAITING)
    assert waiting.payload["reason"] == "approval"
    assert waiting.payload["name"] == "refund"
    assert waiting.payload["data"] == {"amount": 40}
    assert waiting.payload["timeout_s"] == 3600
    decided = next(e for e in events if e.kind == EventKind.APPROVAL_DECIDED)
    assert decided.payload == {
        "name": "refund",
        "approved": True,
        "by": "ana",
        "comment": "fine",
        "at": decision.at.isoformat(),
    }
    completed = next(e for e in events if e.kind == EventKind.STEP_COMPLETED)
    assert ratchet.Decision.from_dict(completed.payload["output"]) == decision


def test_reject_by_name_returns_a_rejection(app: ratchet.Ratchet) -> None:
    run_id = app.start("refund", 9000)
    pending(app)
    decision = app.reject(run_id, "refund", by="bob")
    assert decision.approved is False and decision.comment is None
    assert app.result(run_id, timeout_s=30)["approved"] is False
    assert app.result(run_id)["by"] == "bob"


def test_a_decision_is_recorded_once_and_a_second_is_refused_naming_the_first(
    app: ratchet.Ratchet,
) -> None:
    run_id = app.start("refund", 1)
    pending(app)
    app.approve(run_id, "refund", by="ana", comment="ok")
    app.result(run_id, timeout_s=30)
    before = app.events(run_id)
    with pytest.raises(ratchet.ApprovalAlreadyDecided) as e:
        app.reject(run_id, "refund", by="bob")
    message = str(e.value)
    assert "already approved by ana" in message and "'ok'" in message
    assert datetime.now(UTC).strftime("%Y-%m-%d") in message  # when
    assert isinstance(e.value, ratchet.ApprovalNotPending)
    assert app.events(run_id) == before
    assert app.result(run_id)["by"] == "ana"


def test_concurrent_decisions_exactly_one_wins(
    app: ratchet.Ratchet, make_app: Callable[..., ratchet.Ratchet]
) -> None:
    run_id = app.start("refund", 5)
    pending(app)
    clients = [make_app() for _ in range(6)]
    for c in clients:
        _ = c.store  # connected before the start line
    barrier = threading.Barrier(len(clients))
    won: list[str] = []
    refused: list[str] = []

    def decide(i: int, client: ratchet.Ratchet) -> None:
        barrier.wait()
        try:
            if i % 2:
                client.reject(run_id, "refund", by=f"person-{i}")
            else:
                client.approve(run_id, "refund", by=f"person-{i}")
            won.append(f"person-{i}")
        except ratchet.ApprovalAlreadyDecided as e:
            refused.append(str(e))

    threads = [threading.Thread(target=decide, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == len(clients) - 1
    out = app.result(run_id, timeout_s=30)
    assert out["by"] == won[0]
    assert all(f"by {won[0]} " in r for r in refused)
    events = app.events(run_id)
    assert [e.payload["by"] for e in events if e.kind == EventKind.APPROVAL_DECIDED] == won


def test_deciding_what_is_not_pending_is_refused_and_writes_nothing(app: ratchet.Ratchet) -> None:
    with pytest.raises(ratchet.UnknownRun):
        app.approve("no-such-run", "refund", by="ana")
    run_id = app.start("refund", 5)
    pending(app)
    with pytest.raises(ratchet.UnknownApproval, match="no approval 'nope'"):
        app.approve(run_id, "nope", by="ana")
    with pytest.raises(ratchet.InvalidInput, match="by"):
        app.approve(run_id, "refund", by="")
    before = app.events(run_id)
    app.cancel(run_id)
    wait_for(lambda: app.get(run_id).status.terminal, what="the run cancelled")
    after_cancel = app.events(run_id)
    with pytest.raises(ratchet.ApprovalNotPending, match="already cancelled"):
        app.approve(run_id, "refund", by="ana")
    assert app.events(run_id) == after_cancel and len(after_cancel) == len(before) + 1
    assert app.approvals() == []


def test_a_timeout_raises_approval_timeout_journaled_like_a_signal_timeout(
    app: ratchet.Ratchet,
) -> None:
    run_id = app.start("refund", 5, 0.3)
    out = app.result(run_id, timeout_s=30)
    assert out == {"timed_out": "no decision on approval 'refund' arrived within 0.3s"}
    events = app.events(run_id)
    assert kinds(events, "1:approval:refund") == ["step_waiting", "step_failed"]
    failed = next(e for e in events if e.kind == EventKind.STEP_FAILED)
    assert failed.payload["error_type"] == "ApprovalTimeout"
    with pytest.raises(ratchet.ApprovalNotPending, match="timed out"):
        app.approve(run_id, "refund", by="late")


def test_a_parked_approval_times_out_and_a_retried_run_asks_it_again(app: ratchet.Ratchet) -> None:
    run_id = app.start("strict", 3600)
    wait_for(lambda: app.get(run_id).status == "waiting", what="the run parked")
    app.clock.advance(3601)  # the deadline passes: its timer wakes the run
    with pytest.raises(ratchet.RunFailed, match="ApprovalTimeout"):
        app.result(run_id, timeout_s=30)
    assert [d.reason for d in app.dead_letters()] == ["step_failed"]
    assert app.approvals() == []
    app.retry(run_id)  # asked afresh, with a new deadline an hour away
    [asked] = pending(app)
    assert (asked.step_id, asked.attempt, asked.status) == ("1:approval:strict", 2, "pending")
    app.approve(run_id, "strict", by="ana")
    assert app.result(run_id, timeout_s=30) is True
    waits = [e for e in app.events(run_id) if e.kind == EventKind.STEP_WAITING]
    assert [e.attempt for e in waits] == [1, 2]


def test_an_ambiguous_name_is_refused_and_step_ids_decide(app: ratchet.Ratchet) -> None:
    run_id = app.start("twice")
    wait_for(lambda: len(app.approvals(run_id)) == 2, what="two approvals")
    with pytest.raises(ratchet.InvalidInput, match="1:approval:ok, 2:approval:ok"):
        app.approve(run_id, "ok", by="ana")
    app.approve(run_id, "2:approval:ok", by="ana")
    app.reject(run_id, "ok", by="ana")  # one pending left of that name: no longer ambiguous
    assert app.result(run_id, timeout_s=30) == [False, True]


# -- nested ---------------------------------------------------------------------------------


def test_a_childs_approval_is_listed_under_its_parent_and_deciding_it_ends_both(
    app: ratchet.Ratchet,
) -> None:
    parent = app.start("payout_parent", 70)
    [asked] = pending(app, parent)  # found through the parent's id
    child = f"{parent}/1"
    assert (asked.run_id, asked.root_run_id, asked.parent_run_id) == (child, parent, parent)
    assert asked.data == {"amount": 70}
    assert app.approvals(child) == [asked]
    # The parent waits for its child in memory a moment, then parks.
    wait_for(lambda: app.get(parent).status == "waiting", what="the parent parked")
    app.approve(child, "payout", by="cfo")
    assert app.result(parent, timeout_s=30) == ["before", {"approved": True, "by": "cfo"}, "after"]


# -- tools ----------------------------------------------------------------------------------


def test_a_critical_tool_parks_for_an_approval_of_its_arguments_before_it_runs(
    app: ratchet.Ratchet,
) -> None:
    run_id = app.start("banker", "acct-1", 500)
    [asked] = pending(app)
    assert (asked.step_id, asked.name, asked.data) == (
        "1:approval:wire",
        "wire",
        {"account": "acct-1", "cents": 500},
    )
    assert CALLS == {}
    app.approve(run_id, "wire", by="ana")
    assert app.result(run_id, timeout_s=30) == "sent 500 to acct-1"
    assert CALLS == {"wire": 1}
    events = app.events(run_id)
    assert [e.step_id for e in events if e.kind == EventKind.STEP_COMPLETED] == [
        "1:approval:wire",
        "2:wire",
    ]


def test_a_rejected_tool_fails_unrun_with_approval_rejected(app: ratchet.Ratchet) -> None:
    run_id = app.start("banker", "acct-2", 9)
    pending(app)
    app.reject(run_id, "wire", by="bob", comment="not today")
    out = app.result(run_id, timeout_s=30)
    assert out.startswith("refused: approval 'wire' (1:approval:wire) was rejected by bob")
    assert out.endswith(": not today; the step did not run")
    assert CALLS == {}
    failed = [e for e in app.events(run_id) if e.kind == EventKind.STEP_FAILED]
    assert [(e.step_id, e.payload["error_type"]) for e in failed] == [
        ("2:wire", "ApprovalRejected")
    ]

    other = app.start("janitor", "u-1")  # requires_approval=True, uncaught
    pending(app)
    app.reject(other, "delete_user", by="bob")
    with pytest.raises(ratchet.RunFailed, match="ApprovalRejected|was rejected by bob"):
        app.result(other, timeout_s=30)
    assert CALLS == {}


# -- the CLI --------------------------------------------------------------------------------


def invoke(db_url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--db", db_url, *args])


def test_cli_lists_approves_and_refuses_a_second_decision(
    app: ratchet.Ratchet, db_url: str
) -> None:
    run_id = app.start("payout_parent", 12)
    pending(app)
    child = f"{run_id}/1"
    listed = invoke(db_url, "approvals", "--json")
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.stdout)
    assert (row["run_id"], row["step_id"], row["name"], row["data"], row["root_run_id"]) == (
        child,
        "1:approval:payout",
        "payout",
        {"amount": 12},
        run_id,
    )
    assert isinstance(row["since"], float)
    table = invoke(db_url, "approvals")
    assert table.exit_code == 0 and child in table.stdout and run_id in table.stdout

    done = invoke(db_url, "approve", child, "payout", "--by", "ana", "--comment", "ok")
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == f"run {child}: approval 'payout' approved by ana (ok)"
    again = invoke(db_url, "reject", child, "1:approval:payout", "--by", "bob")
    assert again.exit_code == 2
    [line] = again.stderr.splitlines()
    assert line.startswith("error: approval 'payout'") and "already approved by ana" in line
    assert app.result(run_id, timeout_s=30)[1] == {"approved": True, "by": "ana"}
    assert json.loads(invoke(db_url, "approvals", "--json").stdout) == []
    empty = invoke(db_url, "approvals")
    assert empty.stdout.strip() == "no approvals are pending"


def test_cli_reject_and_unknown_approval(app: ratchet.Ratchet, db_url: str) -> None:
    run_id = app.start("refund", 3)
    pending(app)
    missing = invoke(db_url, "approve", run_id, "nope", "--by", "ana")
    assert missing.exit_code == 2 and "no approval 'nope'" in missing.stderr
    done = invoke(db_url, "reject", run_id, "refund", "--by", "bob")
    assert done.exit_code == 0, done.output
    assert app.result(run_id, timeout_s=30)["approved"] is False


# -- processes --------------------------------------------------------------------------------


@pytest.mark.crash
def test_an_approval_survives_a_killed_worker_and_is_decided_with_no_worker_running(
    h: Harness,
) -> None:
    run_id = h.app.start("approver", 250)
    a = h.spawn("a")
    h.wait_parked(run_id, "approval:2:approval:refund")
    a.kill()
    [asked] = h.app.approvals()
    assert (asked.run_id, asked.name, asked.data) == (run_id, "refund", {"amount": 250})
    h.app.approve(run_id, "refund", by="ana")
    assert h.app.get(run_id).status == "queued"
    h.spawn("b")
    h.wait_status(run_id, "succeeded")
    assert h.app.result(run_id) == ["out-1", True, "ana", "out-3"]
    assert h.calls() == {"1:work": 1, "3:work": 1}
    events = h.app.events(run_id)
    assert kinds(events, "2:approval:refund") == [
        "step_waiting",
        "approval_decided",
        "step_completed",
    ]
    with pytest.raises(ratchet.ApprovalAlreadyDecided):
        h.app.reject(run_id, "refund", by="bob")


@pytest.mark.crash
def test_a_nested_approval_survives_killed_workers_and_resumes_child_then_parent(
    h: Harness,
) -> None:
    parent = h.app.start("payout_parent", 80)
    a = h.spawn("a")
    child = f"{parent}/2"
    pending(h.app, parent)
    h.wait_parked(child, "approval:1:approval:payout")
    h.wait_parked(parent, "child:")
    a.kill()
    [asked] = h.app.approvals(parent)
    assert (asked.run_id, asked.root_run_id) == (child, parent)
    h.app.approve(child, "payout", by="cfo")
    h.spawn("b")
    h.wait_status(parent, "succeeded")
    assert h.app.result(parent) == ["out-1", {"approved": True, "by": "cfo"}, "out-3"]
    assert h.calls() == {"1:work": 1, "3:work": 1}


# -- the agent loop -------------------------------------------------------------------------


def test_the_agent_loop_sees_a_rejected_critical_tool_as_the_tools_error(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    import openai

    from ratchet.llm.server import LocalProvider, serve

    script = {
        "rules": [
            {
                "match": {"last_role": "user"},
                "reply": {"tool_calls": [{"name": "wire", "arguments": {"cents": 700}}]},
            },
            {"match": {"last_role": "tool"}, "reply": {"text": "The transfer was refused."}},
        ]
    }
    provider = LocalProvider(script=script)
    with serve(provider) as base:
        app = make_app()
        ran: list[int] = []

        @app.tool(risk="critical")
        async def wire(cents: int) -> str:
            """Send money."""
            ran.append(cents)
            return "sent"

        @app.workflow()
        async def ask(text: str) -> list[Any]:
            # Made and closed by each drive, on the worker's loop.
            async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="local") as client:
                agent = ratchet.Agent(
                    model="gpt-4.1-mini", tools=[wire], client=ratchet.llm.wrap(client)
                )
                result = await agent.run(text)
            return [result.output, result.messages[-2]["content"]]

        app.launch()
        run_id = app.start(ask, "send 7 dollars")
        [asked] = pending(app)
        assert (asked.name, asked.data) == ("wire", {"cents": 700})
        app.reject(run_id, "wire", by="bob", comment="no")
        answer, tool_said = app.result(run_id, timeout_s=30)
        assert answer == "The transfer was refused."
        assert tool_said.startswith("error: approval 'wire' (2:approval:wire) was rejected by bob")
        assert ran == []
