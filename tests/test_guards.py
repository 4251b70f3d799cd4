"""Guards on SQLite and PostgreSQL: a crafted workflow for each guard trips it, the anomaly
is journaled once, and each action is applied (record goes on, pause parks on an approval
"continue?" a person decides, fail ends the run with the guard's code); budgets stop a model
call before the local provider receives it; overrides at start replace the workflow's
thresholds, and bad ones are refused before anything is written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from crash_app import LLM_SECRET
from waiting import wait_for

import ratchet
from ratchet.engine.stats import STATS
from ratchet.llm.server import LocalProvider
from ratchet.model import EventKind

pytestmark = pytest.mark.usefixtures("collect_clients")
MODEL = "gpt-4.1-mini"


def anomalies(app: ratchet.Ratchet, run_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in app.events(run_id) if e.kind == EventKind.ANOMALY_DETECTED]


def failed(app: ratchet.Ratchet, run_id: str) -> dict[str, Any]:
    wait_for(lambda: app.get(run_id).status == "failed", what="the run failed")
    return next(e.payload for e in app.events(run_id) if e.kind == EventKind.RUN_FAILED)


def looping_app(make_app: Callable[..., ratchet.Ratchet], **guards: Any) -> ratchet.Ratchet:
    app = make_app()

    @app.step
    async def poll(job: str) -> str:
        return "pending"

    @app.workflow(guards=ratchet.Guards(**guards))
    async def waiter(n: int) -> int:
        for _ in range(n):
            await poll("job-1")
        return n

    return app


# -- runaway_loop, excessive_steps: record, pause, fail -------------------------------------


def test_runaway_loop_is_recorded_once_and_the_run_goes_on(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    # record is no longer the default (fail is): asked for here, with 4 repeats.
    app = looping_app(make_app, runaway_repeats=4, actions={"runaway_loop": "record"})
    app.launch()
    before = STATS.anomalies["runaway_loop"]
    run_id = app.start("waiter", 9)
    assert app.result(run_id, timeout_s=30) == 9
    [found] = anomalies(app, run_id)
    assert found["kind"] == "runaway_loop" and found["action"] == "record"
    assert (found["key"], found["repeats"], found["step"]) == ("runaway_loop:1:poll", 4, "poll")
    at = next(e for e in app.events(run_id) if e.kind == EventKind.ANOMALY_DETECTED)
    assert at.step_id == "4:poll"  # the fourth identical call in a row
    assert STATS.anomalies["runaway_loop"] == before + 1
    from prometheus_client.exposition import generate_latest

    from ratchet.api.metrics import Metrics

    scraped = generate_latest(Metrics().registry).decode()  # what /metrics serves
    assert f'ratchet_anomalies_total{{kind="runaway_loop"}} {before + 1}.0' in scraped


def test_different_arguments_or_results_are_no_runaway_loop(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.step
    async def fetch(page: int) -> int:
        return page

    @app.workflow
    async def pager() -> int:
        return sum([await fetch(i) for i in range(20)])

    app.launch()
    run_id = app.start(pager)
    assert app.result(run_id, timeout_s=30) == 190
    assert anomalies(app, run_id) == []


def test_runaway_loop_pause_parks_until_a_person_says_continue(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = looping_app(make_app, runaway_repeats=3, actions={"runaway_loop": "pause"})
    app.launch()
    run_id = app.start("waiter", 5)
    [asked] = wait_for(lambda: app.approvals(run_id), what="the guard's approval")
    assert asked.name == "guard:runaway_loop" and asked.data["question"] == "continue?"
    assert asked.data["anomaly"]["kind"] == "runaway_loop"
    wait_for(lambda: app.get(run_id).status == "waiting", what="the run parked")
    app.approve(run_id, asked.step_id, by="ops")
    assert app.result(run_id, timeout_s=30) == 5
    assert [a["key"] for a in anomalies(app, run_id)] == ["runaway_loop:1:poll"]


def test_runaway_loop_pause_declined_fails_the_run_with_the_guards_code(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = looping_app(make_app, runaway_repeats=3, actions={"runaway_loop": "pause"})
    app.launch()
    run_id = app.start("waiter", 5)
    [asked] = wait_for(lambda: app.approvals(run_id), what="the guard's approval")
    app.reject(run_id, asked.step_id, by="ops", comment="it never converges")
    end = failed(app, run_id)
    assert end["reason"] == "runaway_loop"
    assert "ops declined to continue: it never converges" in end["error"]
    assert len(anomalies(app, run_id)) == 1
    assert [d.reason for d in app.dead_letters()] == ["runaway_loop"]


def test_a_pause_without_a_decision_within_pause_timeout_s_fails_the_run(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = looping_app(make_app, runaway_repeats=3, actions={"runaway_loop": "pause"})
    app.launch()
    run_id = app.start("waiter", 5, guards={"pause_timeout_s": 0.5})
    end = failed(app, run_id)
    assert end["reason"] == "runaway_loop"
    assert end["error"].endswith(
        "no decision on approval 'guard:runaway_loop' arrived within 0.5s"
    ), end["error"]
    [anomaly] = anomalies(app, run_id)
    events = app.events(run_id)
    [timed_out] = [e for e in events if e.kind == EventKind.STEP_FAILED]
    assert timed_out.step_id == anomaly["approval_step_id"] == "4:approval:guard:runaway_loop"
    assert timed_out.payload["error_type"] == "ApprovalTimeout"
    assert [e.step_id for e in events if e.kind == EventKind.STEP_COMPLETED] == [
        "1:poll",
        "2:poll",
        "3:poll",
    ]  # nothing ran past the pause
    assert app.approvals(run_id) == []
    with pytest.raises(ratchet.InvalidInput, match="pause_timeout_s must be a positive"):
        ratchet.Guards(pause_timeout_s=0)


def test_runaway_loop_fail_ends_the_run_before_the_next_step(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = looping_app(make_app, runaway_repeats=3, actions={"runaway_loop": "fail"})
    app.launch()
    run_id = app.start("waiter", 10)
    end = failed(app, run_id)
    assert end["reason"] == "runaway_loop"
    steps = {e.step_id for e in app.events(run_id) if e.kind == EventKind.STEP_COMPLETED}
    assert steps == {"1:poll", "2:poll", "3:poll"}
    with pytest.raises(ratchet.RunFailed, match="ran 3 times in a row"):
        app.result(run_id)


def test_a_batch_loop_of_1200_distinct_steps_passes_the_default_guards(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.step
    async def handle(item: int) -> int:
        return item % 7  # answers repeat; the calls (their arguments) do not

    @app.workflow  # the default Guards
    async def batch(n: int) -> int:
        return sum([await handle(i) for i in range(n)])

    app.launch()
    run_id = app.start(batch, 1200)
    assert app.result(run_id, timeout_s=120) == sum(i % 7 for i in range(1200))
    assert anomalies(app, run_id) == []
    completed = [e for e in app.events(run_id) if e.kind == EventKind.STEP_COMPLETED]
    assert len(completed) == 1200


def test_a_runaway_agent_repeating_the_same_call_fails_by_default(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.tool
    async def search(query: str) -> str:
        """The same answer, whatever the agent does with it."""
        return "no results"

    @app.workflow  # the default Guards
    async def stuck(query: str) -> str:
        while True:  # an agent that keeps asking the same thing
            await search(query)

    app.launch()
    run_id = app.start(stuck, "ratchet")
    end = failed(app, run_id)
    assert end["reason"] == "runaway_loop"
    [found] = anomalies(app, run_id)
    assert (found["key"], found["repeats"], found["action"]) == (
        "runaway_loop:1:search",
        10,
        "fail",
    )
    started = [e.step_id for e in app.events(run_id) if e.kind == EventKind.STEP_STARTED]
    assert started == [f"{i}:search" for i in range(1, 11)]  # stopped at the tenth, not 10,000


def test_excessive_steps_fails_by_default_and_records_when_told(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = looping_app(make_app, max_steps=5, runaway_repeats=None)
    app.launch()
    run_id = app.start("waiter", 8)
    end = failed(app, run_id)
    assert end["reason"] == "excessive_steps"
    [found] = anomalies(app, run_id)
    assert (found["steps"], found["max_steps"], found["action"]) == (6, 5, "fail")
    assert not any(
        e.step_id == "6:poll" for e in app.events(run_id) if e.kind == EventKind.STEP_STARTED
    )
    # Per run, at start: recorded, and the run goes on to its end.
    again = app.start("waiter", 8, guards={"actions": {"excessive_steps": "record"}})
    assert app.result(again, timeout_s=30) == 8
    assert [a["key"] for a in anomalies(app, again)] == ["excessive_steps"]


# -- retry_storm: in a run, and across a workflow's runs ------------------------------------


def storm_app(make_app: Callable[..., ratchet.Ratchet], **guards: Any) -> ratchet.Ratchet:
    app = make_app()

    @app.step(retry=ratchet.Retry(max_attempts=5, backoff_ms=1, retry_on=["tool"]))
    async def flaky(fail_times: int) -> str:
        if ratchet.current_step().attempt <= fail_times:
            raise ratchet.ToolError("provider overloaded")
        return "ok"

    @app.workflow(guards=ratchet.Guards(**guards))
    async def stormy(fail_times: int) -> str:
        return await flaky(fail_times)

    return app


def test_retry_storm_in_one_run(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = storm_app(make_app, retry_storm_run=2)
    app.launch()
    run_id = app.start("stormy", 4)
    assert app.result(run_id, timeout_s=30) == "ok"
    [found] = anomalies(app, run_id)
    assert (found["kind"], found["scope"], found["retries"], found["limit"]) == (
        "retry_storm",
        "run",
        3,
        2,
    )


def test_retry_storm_across_the_workflows_runs_is_counted_in_the_database(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = storm_app(make_app, retry_storm_workflow=4)
    app.launch()
    first = app.start("stormy", 3)  # three retries: within the limit
    assert app.result(first, timeout_s=30) == "ok"
    assert anomalies(app, first) == []
    # Another worker's process would see the same count: it is read from the journal.
    second = app.start("stormy", 3)
    assert app.result(second, timeout_s=30) == "ok"
    [found] = anomalies(app, second)
    assert (found["scope"], found["workflow"], found["retries"]) == ("workflow", "stormy", 5)


# -- budgets: before the call --------------------------------------------------------------


def llm_app(make_app: Callable[..., ratchet.Ratchet], base: str, **guards: Any) -> ratchet.Ratchet:
    app = make_app()
    oai = ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET))

    @app.workflow(guards=ratchet.Guards(**guards))
    async def ask(questions: list[str], max_tokens: list[int] | None = None) -> list[str]:
        out = []
        for q, limit in zip(questions, max_tokens or [64] * len(questions), strict=True):
            reply = await oai.chat.completions.create(
                model=MODEL, max_tokens=limit, messages=[{"role": "user", "content": q}]
            )
            out.append(reply.choices[0].message.content or "")
        return out

    return app


def test_a_token_budget_stops_the_call_before_the_provider_sees_it(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    app = llm_app(make_app, base, budget_tokens=200)
    app.launch()
    run_id = app.start("ask", ["first question", "second question"], max_tokens=[50, 500])
    end = failed(app, run_id)
    assert end["reason"] == "budget_exceeded"
    assert len(server.requests()) == 1  # the first call fit; the second was never sent
    [found] = anomalies(app, run_id)
    assert (found["budget"], found["limit"], found["action"]) == ("tokens", 200, "fail")
    assert found["used"] > 0 and found["worst_case"] > 500
    started = [e.step_id for e in app.events(run_id) if e.kind == EventKind.STEP_STARTED]
    assert started == ["1:openai.chat.completions.create"]


def test_a_usd_budget_counts_the_worst_case_price(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    app = llm_app(make_app, base)
    app.launch()
    # 4096 output tokens of gpt-4.1-mini cost more than a tenth of a cent.
    run_id = app.start("ask", ["hello"], max_tokens=[4096], guards={"budget_usd": 0.001})
    end = failed(app, run_id)
    assert end["reason"] == "budget_exceeded" and "usd budget" in end["error"]
    assert server.requests() == []


def test_steps_and_wall_time_budgets(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = looping_app(make_app, runaway_repeats=None)

    @app.workflow(guards=ratchet.Guards(budget_wall_s=0.2))
    async def dawdler() -> str:
        await ratchet.sleep(0.5)
        return await app.workflows["waiter"].fn(1) and "done"

    app.launch()
    run_id = app.start("waiter", 5, guards={"budget_steps": 2})
    assert failed(app, run_id)["reason"] == "budget_exceeded"
    assert anomalies(app, run_id)[0]["budget"] == "steps"
    # Under fail, the wall-time budget is the run's deadline: it ends the run in its sleep.
    run_id = app.start(dawdler)
    end = failed(app, run_id)
    assert end["reason"] == "timeout" and end["error"].startswith("RunTimeout: "), end
    [found] = anomalies(app, run_id)
    assert found["budget"] == "wall_s" and found["used"] >= 0.2
    assert not any(e.kind == EventKind.STEP_COMPLETED for e in app.events(run_id))
    with pytest.raises(ratchet.RunTimeout, match="budget_wall_s 0.2s"):
        app.result(run_id)


# -- spikes against the workflow's history --------------------------------------------------


def test_token_and_cost_spikes_against_the_median_of_the_last_runs(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    _, base = provider
    app = llm_app(make_app, base, spike_history=3)
    app.launch()
    for i in range(3):  # no spike is declared before three runs exist
        run_id = app.start("ask", [f"question {i}"])
        app.result(run_id, timeout_s=30)
        assert anomalies(app, run_id) == []
    huge = "why " * 2000
    run_id = app.start("ask", [huge])
    app.result(run_id, timeout_s=30)
    found = {a["kind"]: a for a in anomalies(app, run_id)}
    assert set(found) == {"token_spike", "cost_spike"}
    assert found["token_spike"]["key"] == "token_spike:1:openai.chat.completions.create"
    assert found["token_spike"]["tokens"] > 5 * found["token_spike"]["median"]
    assert found["cost_spike"]["runs"] == 3
    # Ordinary again: nothing.
    run_id = app.start("ask", ["question 9"])
    app.result(run_id, timeout_s=30)
    assert anomalies(app, run_id) == []


def test_a_short_history_is_read_once_a_run_not_at_every_llm_call(
    make_app: Callable[..., ratchet.Ratchet],
    provider: tuple[LocalProvider, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, base = provider
    app = llm_app(make_app, base, spike_history=3)
    store = app.store
    real = store.llm_history
    reads: list[str] = []

    async def counting(workflow: str, limit: int) -> Any:
        reads.append(workflow)
        return await real(workflow, limit)

    monkeypatch.setattr(store, "llm_history", counting)
    app.launch()
    for i in range(2):
        app.result(app.start("ask", [f"{i}: first", f"{i}: second", f"{i}: third"]), timeout_s=30)
    # Three LLM calls a run, one read a run: the history (short of three runs) is kept
    # until a run of the workflow finishes, then read again at the next call.
    assert reads == ["ask", "ask"]


# -- overrides at start, and bad input --------------------------------------------------------


def test_overrides_at_start_are_journaled_and_bad_ones_write_nothing(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    # record: the run goes on past the override's anomaly (the default action is fail).
    app = looping_app(make_app, actions={"runaway_loop": "record"})
    app.launch()
    run_id = app.start("waiter", 6, guards={"runaway_repeats": 2})
    assert app.result(run_id, timeout_s=30) == 6
    queued = app.events(run_id)[0]
    assert queued.payload["guards"] == {"runaway_repeats": 2}
    assert anomalies(app, run_id)[0]["repeats"] == 2
    for bad, message in [
        ({"max_stepz": 3}, "unknown field 'max_stepz'"),
        ({"max_steps": 0}, "max_steps must be an integer >= 1"),
        ({"actions": {"runaway_loop": "panic"}}, "must be one of record"),
        ({"gate": False}, "needs gate_bypass_by"),
        ("tight", "expected an object"),
    ]:
        with pytest.raises(ratchet.InvalidInput, match=message):
            app.start("waiter", 1, guards=bad)  # type: ignore[arg-type]
    assert app.count_runs() == 1
    with pytest.raises(ratchet.InvalidInput, match="spike_factor must be a positive number"):
        ratchet.Guards(spike_factor=-1)


def test_graph_guards_and_a_loop_past_its_max_iterations(
    make_app: Callable[..., ratchet.Ratchet], tmp_path: Path
) -> None:
    app = make_app()

    @app.tool
    async def check(n: int) -> str:
        """Always not ready."""
        return "not ready"

    graph = {
        "name": "spinner",
        # record (the default is fail): the streak's anomaly, then the loop's own.
        "guards": {"runaway_repeats": 3, "actions": {"runaway_loop": "record"}},
        "nodes": [
            {"id": "start", "type": "trigger"},
            {
                "id": "spin",
                "type": "loop",
                "data": {"body": ["probe"], "max_iterations": 5, "until": "loop.index > 100"},
            },
            {"id": "probe", "type": "tool", "data": {"tool": "check", "args": {"n": 1}}},
        ],
        "edges": [{"from": "start", "to": "spin"}, {"from": "spin", "to": "probe"}],
    }
    app.graph(graph)
    app.launch()
    run_id = app.start("spinner", {})
    wait_for(lambda: app.get(run_id).status == "failed", what="the graph run failed")
    found = anomalies(app, run_id)
    assert [(a["kind"], a["key"]) for a in found] == [
        ("runaway_loop", "runaway_loop:1:spin#0/probe"),
        ("runaway_loop", "runaway_loop:spin"),
    ]
    assert found[1]["max_iterations"] == 5
    with pytest.raises(ratchet.InvalidInput, match="guards: max_steps must be"):
        app.graph({**graph, "guards": {"max_steps": -1}})


def test_ratchet_start_takes_guard_overrides(db_url: str) -> None:
    from typer.testing import CliRunner

    from ratchet.cli import cli

    app = ratchet.Ratchet(db_url)
    try:
        app.graph({"name": "tiny", "nodes": [{"id": "start", "type": "trigger"}]})
        runner = CliRunner()
        ok = runner.invoke(
            cli,
            [
                "start",
                "tiny",
                "--input",
                "{}",
                "--db",
                db_url,
                "--guards",
                '{"max_steps": 9, "budget_usd": 0.5}',
            ],
        )
        assert ok.exit_code == 0, ok.output
        run_id = ok.stdout.strip()
        assert app.events(run_id)[0].payload["guards"] == {"budget_usd": 0.5, "max_steps": 9}
        bad = runner.invoke(
            cli, ["start", "tiny", "--db", db_url, "--guards", '{"budget_usd": "free"}']
        )
        assert bad.exit_code == 2 and "budget_usd must be a positive number" in bad.stderr
        assert runner.invoke(cli, ["start", "tiny", "--db", db_url, "--guards", "{"]).exit_code == 2
        assert app.count_runs() == 1
    finally:
        app.shutdown()


def test_a_calls_streak_key_is_its_canonical_json_whatever_its_arguments() -> None:
    # The runaway-loop streak compares calls by their canonical JSON; plain strings and
    # integers are written out directly, and must give exactly what dumps gives.
    import enum

    from ratchet.engine.guards.evidence import call_text
    from ratchet.model import dumps

    class Colour(enum.IntEnum):
        RED = 1

    cases: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {}),
        ((1, "a"), {}),
        ((-7, 10**30), {"b": 'x"yé\n\t', "a": 2}),
        (("x-0.0", "1e+16"), {}),
        ((True, None, 1.0), {}),
        ((Colour.RED,), {"c": [1]}),
        (("\u2028", "\x00"), {"z": "", "é": 0}),
    ]
    for args, kwargs in cases:
        assert call_text(args, kwargs) == dumps([args, kwargs]), (args, kwargs)
    with pytest.raises(ValueError):
        call_text((float("nan"),), {})
