"""Spend stops before it happens, on SQLite and PostgreSQL, against the local provider over
real HTTP: parallel model calls (a gather, a graph wave) reserve their worst case before
they are sent, so together they stay within a budget, and parallel steps stay within
max_steps; a retried run keeps its limits unless a person grants more (journaled with who
and how far); a failure whose outcome is unknown (a dropped connection, a client timeout)
is retried under the same Idempotency-Key and billed once, an answered one under a new key;
and a run's deadline ends it where it is, parked or not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import openai
import pytest
from crash_app import LLM_SECRET
from waiting import wait_for

import ratchet
from ratchet.llm.server import LocalProvider
from ratchet.llm.worst_case import worst_case
from ratchet.model import EventKind, fold, idempotency_key

pytestmark = pytest.mark.usefixtures("collect_clients")
MODEL = "gpt-4.1-mini"
CALL = "openai.chat.completions.create"


def worst(question: str, max_tokens: int = 1000) -> int:
    """The most :func:`ask` may spend: what a budget reserves for it."""
    return worst_case(
        (),
        {
            "model": MODEL,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": question}],
        },
    )[0]


# A call with max_tokens=1000 and a short prompt ("question 1") may spend this much at most;
# the local provider bills it a few tokens.
WORST = worst("question 1")


def client(base: str, **options: Any) -> Any:
    retry = options.pop("retry", None)
    timeout_s = options.pop("timeout_s", None)
    return ratchet.llm.wrap(
        openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET, **options),
        retry=retry,
        timeout_s=timeout_s,
    )


async def ask(oai: Any, question: str, max_tokens: int = 1000) -> str:
    reply = await oai.chat.completions.create(
        model=MODEL, max_tokens=max_tokens, messages=[{"role": "user", "content": question}]
    )
    return reply.choices[0].message.content or ""


def of_kind(app: ratchet.Ratchet, run_id: str, kind: str) -> list[ratchet.Event]:
    return [e for e in app.events(run_id) if e.kind == kind]


def ended(
    app: ratchet.Ratchet, run_id: str, status: str = "failed", timeout: float = 20.0
) -> ratchet.RunRecord:
    rec = wait_for(
        lambda: (r := app.get(run_id)).status.terminal and r, timeout, what=f"run {run_id} to end"
    )
    assert rec.status == status, (rec.status, rec.error)
    return rec


def dead_letter(app: ratchet.Ratchet, run_id: str) -> str:
    return next(d.reason for d in app.dead_letters() if d.run_id == run_id)


# -- calls in flight count --------------------------------------------------------------


@pytest.mark.parametrize(
    "budget", [{"budget_tokens": 2 * WORST + 50}, {"budget_usd": 0.0035}], ids=["tokens", "usd"]
)
def test_parallel_calls_together_stay_within_the_budget(
    make_app: Callable[..., ratchet.Ratchet],
    provider: tuple[LocalProvider, str],
    budget: dict[str, Any],
) -> None:
    server, base = provider
    oai = client(base)
    app = make_app()

    @app.workflow(guards=ratchet.Guards(**budget))
    async def fan_out() -> list[str]:
        return list(await asyncio.gather(*(ask(oai, f"question {i}") for i in range(4))))

    app.launch()
    run_id = app.start(fan_out)
    ended(app, run_id)
    assert dead_letter(app, run_id) == "budget_exceeded"
    # Two calls fit the budget with their worst case; the third, counting the two in
    # flight, would cross it and was never sent, nor was the fourth.
    started = [e for e in of_kind(app, run_id, EventKind.STEP_STARTED)]
    assert len(started) == 2 and all("reserve" in e.payload for e in started)
    assert len(server.requests()) <= 2
    [found] = [e.payload for e in of_kind(app, run_id, EventKind.ANOMALY_DETECTED)]
    assert found["kind"] == "budget_exceeded" and found["used"] == 0
    unit = "tokens" if "budget_tokens" in budget else "usd"
    held = sum(e.payload["reserve"][unit] for e in started)
    assert found["in_flight"] == pytest.approx(held, abs=1e-6)
    assert found["worst_case"] == pytest.approx(started[0].payload["reserve"][unit], rel=0.01)


def test_parallel_steps_stop_at_max_steps_and_at_the_steps_budget(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    ran: list[int] = []

    @app.step
    async def work(i: int) -> int:
        ran.append(i)
        return i

    @app.workflow(guards=ratchet.Guards(max_steps=3, runaway_repeats=None))
    async def wide() -> list[int]:
        return list(await asyncio.gather(*(work(i) for i in range(6))))

    @app.workflow(guards=ratchet.Guards(budget_steps=2, runaway_repeats=None))
    async def wider() -> list[int]:
        return list(await asyncio.gather(*(work(i) for i in range(6))))

    app.launch()
    runs = {}
    for wf, limit, reason in ((wide, 3, "excessive_steps"), (wider, 2, "budget_exceeded")):
        run_id = runs[reason] = app.start(wf)
        ended(app, run_id)
        assert dead_letter(app, run_id) == reason
        started = [e.step_id for e in of_kind(app, run_id, EventKind.STEP_STARTED)]
        assert started == [f"{i}:work" for i in range(1, limit + 1)], started
        assert len(of_kind(app, run_id, EventKind.ANOMALY_DETECTED)) == 1
    # A retry keeps max_steps too, unless a person lifts it.
    run_id = runs["excessive_steps"]
    app.retry(run_id)
    wait_for(lambda: len(of_kind(app, run_id, EventKind.RUN_FAILED)) == 2, what="again")
    keys = [e.payload["key"] for e in of_kind(app, run_id, EventKind.ANOMALY_DETECTED)]
    assert keys == ["excessive_steps", "excessive_steps@2"]
    app.retry(run_id, grant={"max_steps": None}, by="ana")
    assert app.result(run_id, timeout_s=30) == list(range(6))


def test_a_graph_wave_of_ai_steps_reserves_together(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    app = make_app()
    app.llm_client(openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET))
    wave = [f"ask{i}" for i in range(4)]
    app.graph(
        {
            "name": "wave",
            "guards": {"budget_tokens": 2 * WORST + 200},
            "nodes": [
                {"id": "start", "type": "trigger"},
                *(
                    {
                        "id": n,
                        "type": "ai-step",
                        "data": {"model": MODEL, "prompt": f"q {n}", "max_tokens": 1000},
                    }
                    for n in wave
                ),
            ],
            "edges": [{"from": "start", "to": n} for n in wave],
        }
    )
    app.launch()
    run_id = app.start("wave", {})
    ended(app, run_id)
    assert dead_letter(app, run_id) == "budget_exceeded"
    llm = [
        e for e in of_kind(app, run_id, EventKind.STEP_STARTED) if e.payload.get("kind") == "llm"
    ]
    assert len(llm) == 2 and len(server.requests()) <= 2


def test_a_call_whose_outcome_is_unknown_keeps_its_reservation(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai = client(base, retry=ratchet.Retry(max_attempts=3, backoff_ms=1500, retry_on=["llm"]))
    app = make_app()

    @app.step
    async def after_the_drop() -> None:
        # The first call was received, billed and dropped, and its retry is journaled: it
        # is between attempts now, waiting out its backoff.
        run_id = ratchet.current_step().run_id
        while not any(e.kind == EventKind.STEP_RETRYING for e in await app.events_async(run_id)):
            await asyncio.sleep(0.01)

    async def later() -> str:
        await after_the_drop()
        return await ask(oai, "second")

    @app.workflow(guards=ratchet.Guards(budget_tokens=WORST + 500))
    async def two() -> list[str]:
        return list(await asyncio.gather(ask(oai, "first"), later()))

    server.fail("drop", times=1)
    app.launch()
    run_id = app.start(two)
    ended(app, run_id)
    # The dropped call may have been billed: while it waits for its next attempt its worst
    # case still counts, and the second call is not sent.
    [found] = [e.payload for e in of_kind(app, run_id, EventKind.ANOMALY_DETECTED)]
    first = next(
        e for e in of_kind(app, run_id, EventKind.STEP_STARTED) if e.step_id == f"1:{CALL}"
    )
    assert found["in_flight"] == first.payload["reserve"]["tokens"] and found["used"] == 0
    [retrying] = of_kind(app, run_id, EventKind.STEP_RETRYING)
    assert retrying.payload["outcome_unknown"] is True
    assert [r["fault"] for r in server.requests()] == ["drop"]


# -- a retried run keeps its limits ------------------------------------------------------


def budget_app(
    make_app: Callable[..., ratchet.Ratchet], base: str, calls: int, **guards: Any
) -> ratchet.Ratchet:
    oai = client(base)
    app = make_app()

    @app.workflow(guards=ratchet.Guards(runaway_repeats=None, **guards))
    async def several() -> list[str]:
        return [await ask(oai, f"question {i}") for i in range(calls)]

    return app


def test_a_retried_run_stops_again_at_its_budget_unless_a_person_grants_more(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    # The first call fits; the second, on top of what the first spent, would not.
    app = budget_app(make_app, base, 3, budget_tokens=WORST + 1)
    app.launch()
    run_id = app.start("several")
    ended(app, run_id)
    assert len(server.requests()) == 1  # the second call would cross the budget
    # Retried as it was, it stops again at the same call: nothing more is sent.
    app.retry(run_id)
    wait_for(lambda: len(of_kind(app, run_id, EventKind.RUN_FAILED)) == 2, what="again")
    assert dead_letter(app, run_id) == "budget_exceeded"
    assert len(server.requests()) == 1
    keys = [e.payload["key"] for e in of_kind(app, run_id, EventKind.ANOMALY_DETECTED)]
    assert keys == ["budget_exceeded:tokens", "budget_exceeded:tokens@2"]

    # A grant needs who, and names a limit; a bad one writes nothing.
    with pytest.raises(ratchet.InvalidInput, match="needs by="):
        app.retry(run_id, grant={"budget_tokens": 10_000})
    with pytest.raises(ratchet.InvalidInput, match="'runaway_repeats' is not a limit"):
        app.retry(run_id, grant={"runaway_repeats": 10}, by="ana")
    with pytest.raises(ratchet.InvalidInput, match="budget_tokens must be an integer"):
        app.retry(run_id, grant={"budget_tokens": "lots"}, by="ana")
    assert app.get(run_id).status == "failed" and dead_letter(app, run_id)

    # Granted more, it goes on to the end, and the journal says who and how far.
    app.retry(run_id, grant={"budget_tokens": 3 * WORST}, by="ana")
    assert len(app.result(run_id, timeout_s=30)) == 3
    assert server.stats()["billed_calls"] == 3
    retried = [e.payload for e in of_kind(app, run_id, EventKind.RUN_QUEUED)][1:]
    assert retried == [
        {"reason": "retry"},
        {"reason": "retry", "by": "ana", "grant": {"budget_tokens": 3 * WORST}},
    ]
    assert fold(run_id, app.events(run_id)).grants == {"budget_tokens": 3 * WORST}


def test_approving_a_budget_pause_lets_the_run_go_as_far_as_the_approval_says(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    app = budget_app(
        make_app, base, 4, budget_tokens=WORST + 1, actions={"budget_exceeded": "pause"}
    )
    app.launch()
    run_id = app.start("several")

    def paused(n: int) -> ratchet.Approval:
        def probe() -> ratchet.Approval | None:
            pending = app.approvals(run_id)
            asked = of_kind(app, run_id, EventKind.ANOMALY_DETECTED)
            return pending[0] if pending and len(asked) == n else None

        return wait_for(probe, what=f"pause {n}")

    # Approved without a grant: the paused call goes, and the budget is raised to what it
    # needed, so the next call over it pauses again.
    first = paused(1)
    assert first.name == "guard:budget_exceeded"
    made = app.approve(run_id, first.step_id, by="ana")
    assert made.grant is not None and made.grant["budget_tokens"] > WORST
    # Approved with a grant: as far as the grant goes.
    second = paused(2)
    app.approve(run_id, second.step_id, by="bo", grant={"budget_tokens": 10 * WORST})
    assert len(app.result(run_id, timeout_s=30)) == 4
    assert server.stats()["billed_calls"] == 4
    decided = [
        (e.payload["by"], e.payload["grant"])
        for e in of_kind(app, run_id, EventKind.APPROVAL_DECIDED)
    ]
    assert decided == [("ana", made.grant), ("bo", {"budget_tokens": 10 * WORST})]
    keys = [e.payload["key"] for e in of_kind(app, run_id, EventKind.ANOMALY_DETECTED)]
    assert keys == ["budget_exceeded:tokens", "budget_exceeded:tokens@2"]


def test_a_grant_is_only_for_a_guards_pause_of_a_limit(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow
    async def asks() -> bool:
        return (await ratchet.approval("refund")).approved

    @app.workflow
    async def poses() -> bool:  # as a guard's pause of a budget
        anomaly = {
            "kind": "budget_exceeded",
            "limit_key": "budget_exceeded:tokens",
            "limit_field": "budget_tokens",
            "needed": 10**9,
        }
        return (await ratchet.approval("guard:budget_exceeded", data={"anomaly": anomaly})).approved

    app.launch()
    run_id = app.start(asks)
    [asked] = wait_for(lambda: app.approvals(run_id), what="the approval")
    with pytest.raises(ratchet.InvalidInput, match="takes no grant"):
        app.approve(run_id, asked.step_id, by="ana", grant={"budget_tokens": 5})
    assert app.approvals(run_id) == [asked]  # nothing was decided
    app.approve(run_id, asked.step_id, by="ana")
    assert app.result(run_id, timeout_s=30) is True
    # The guards' pauses are theirs: a workflow cannot ask one to have limits moved.
    posing = app.start(poses)
    rec = ended(app, posing)
    assert rec.error is not None and "'guard:budget_exceeded' is reserved" in rec.error


# -- keys follow the outcome ---------------------------------------------------------------


def one_call_app(make_app: Callable[..., ratchet.Ratchet], oai: Any) -> ratchet.Ratchet:
    app = make_app()

    @app.workflow
    async def once() -> str:
        return await ask(oai, "hi", max_tokens=64)

    return app


def keys_sent(app: ratchet.Ratchet, run_id: str) -> list[tuple[int | None, str]]:
    return [
        (e.attempt, e.payload["idempotency_key"])
        for e in of_kind(app, run_id, EventKind.STEP_STARTED)
    ]


def test_a_dropped_connection_is_retried_under_the_same_key_and_billed_once(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai = client(base, retry=ratchet.Retry(max_attempts=3, backoff_ms=50, retry_on=["llm"]))
    app = one_call_app(make_app, oai)
    server.fail("drop", times=1)
    app.launch()
    run_id = app.start("once")
    assert app.result(run_id, timeout_s=30) == "echo: hi"
    key = idempotency_key(run_id, f"1:{CALL}", 1)
    assert keys_sent(app, run_id) == [(1, key), (2, key)]
    [retrying] = of_kind(app, run_id, EventKind.STEP_RETRYING)
    assert retrying.payload["outcome_unknown"] is True
    # The provider saw the key twice, billed the first and answered the second from it.
    log = server.requests()
    assert [(r["idempotency_key"], r["fault"], r["billed"], r["replayed"]) for r in log] == [
        (key, "drop", True, False),
        (key, None, False, True),
    ]
    assert server.stats()["billed_calls"] == 1
    [done] = of_kind(app, run_id, EventKind.STEP_COMPLETED)
    assert done.payload["llm"]["usage"]["output_tokens"] == log[0]["output_tokens"]


@pytest.mark.parametrize("where", ["step", "sdk"])
def test_a_client_timeout_is_retried_under_the_same_key_and_billed_once(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str], where: str
) -> None:
    server, base = provider
    retry = ratchet.Retry(max_attempts=5, backoff_ms=700, retry_on=["llm", "timeout"])
    # The step's own timeout (wrap(timeout_s=...)) or the SDK's (APITimeoutError).
    oai = (
        client(base, retry=retry, timeout_s=0.4)
        if where == "step"
        else client(base, retry=retry, timeout=0.4)
    )
    app = one_call_app(make_app, oai)
    server.fail("slow", times=1, delay_s=1.0)
    app.launch()
    run_id = app.start("once")
    assert app.result(run_id, timeout_s=30) == "echo: hi"
    key = idempotency_key(run_id, f"1:{CALL}", 1)
    sent = keys_sent(app, run_id)
    assert len(sent) >= 2 and {k for _, k in sent} == {key}
    assert [a for a, _ in sent] == list(range(1, len(sent) + 1))
    assert all(r["idempotency_key"] == key for r in server.requests())
    assert server.stats()["billed_calls"] == 1


@pytest.mark.parametrize("status", ["429", "500"])
def test_an_answered_failure_is_retried_under_a_new_key(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str], status: str
) -> None:
    server, base = provider
    oai = client(base, retry=ratchet.Retry(max_attempts=3, backoff_ms=50, retry_on=["llm"]))
    app = one_call_app(make_app, oai)
    server.fail(status, times=1)
    app.launch()
    run_id = app.start("once")
    assert app.result(run_id, timeout_s=30) == "echo: hi"
    step = f"1:{CALL}"
    assert keys_sent(app, run_id) == [
        (1, idempotency_key(run_id, step, 1)),
        (2, idempotency_key(run_id, step, 2)),
    ]
    [retrying] = of_kind(app, run_id, EventKind.STEP_RETRYING)
    assert "outcome_unknown" not in retrying.payload
    assert [r["status"] for r in server.requests()] == [int(status), 200]


def test_unknown_outcomes_never_take_more_than_max_attempts_and_a_retry_keeps_the_key(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai = client(base, retry=ratchet.Retry(max_attempts=3, backoff_ms=20, retry_on=["llm"]))
    app = one_call_app(make_app, oai)
    server.fail("drop", times=3)
    app.launch()
    run_id = app.start("once")
    ended(app, run_id)
    key = idempotency_key(run_id, f"1:{CALL}", 1)
    assert keys_sent(app, run_id) == [(1, key), (2, key), (3, key)]
    [failed] = of_kind(app, run_id, EventKind.STEP_FAILED)
    assert failed.attempt == 3 and failed.payload["outcome_unknown"] is True
    # Retried by hand, the step's next attempt still sends the key the provider billed.
    app.retry(run_id)
    assert app.result(run_id, timeout_s=30) == "echo: hi"
    assert keys_sent(app, run_id)[-1] == (4, key)
    assert server.stats()["billed_calls"] == 1


# -- the run's deadline ------------------------------------------------------------------

DEADLINE_S = 3.5  # longer than a park's minimum (2 s): each run parks before it


def deadline_app(make_app: Callable[..., ratchet.Ratchet]) -> ratchet.Ratchet:
    app = make_app()

    @app.workflow
    async def child_waits() -> Any:
        return await ratchet.wait_for_signal("never")

    @app.workflow
    async def on_signal() -> Any:
        return await ratchet.wait_for_signal("go")

    @app.workflow(timeout_s=DEADLINE_S)
    async def on_approval() -> bool:
        return (await ratchet.approval("ok?")).approved

    @app.workflow(guards=ratchet.Guards(budget_wall_s=DEADLINE_S))
    async def on_sleep() -> str:
        await ratchet.sleep(3600)
        return "woke"

    @app.workflow
    async def on_child() -> Any:
        return await ratchet.child(child_waits)

    return app


@pytest.mark.parametrize("workflow", ["on_signal", "on_approval", "on_sleep", "on_child"])
def test_a_parked_run_fails_at_its_deadline_with_its_children_cancelled(
    make_app: Callable[..., ratchet.Ratchet], workflow: str
) -> None:
    app = deadline_app(make_app)
    app.launch()
    # timeout_s at start, on the workflow, or the wall-time budget under fail.
    timeout = DEADLINE_S if workflow in ("on_signal", "on_child") else None
    run_id = app.start(workflow, timeout_s=timeout)
    parked = wait_for(
        lambda: (r := app.get(run_id)).status == "waiting" and r, what="the run parked"
    )
    assert parked.not_before is not None  # its wake-up: the deadline, on the database's clock
    rec = ended(app, run_id)
    assert rec.error is not None and rec.error.startswith("RunTimeout: "), rec.error
    assert dead_letter(app, run_id) == "timeout"
    with pytest.raises(ratchet.RunTimeout):
        app.result(run_id)
    started_at = next(e.at for e in app.events(run_id) if e.kind == EventKind.RUN_STARTED)
    [end] = of_kind(app, run_id, EventKind.RUN_FAILED)
    assert end.at - started_at >= DEADLINE_S
    if workflow == "on_child":
        assert app.get(f"{run_id}/1").status == "cancelled"
    if workflow == "on_approval":
        assert app.approvals(run_id) == []
        with pytest.raises(ratchet.ApprovalNotPending):
            app.approve(run_id, "ok?", by="ana")


def test_a_deadline_interrupts_a_running_step_and_bad_ones_are_refused(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.step
    async def long() -> str:
        await asyncio.sleep(60)
        return "done"

    @app.workflow
    async def slow() -> str:
        return await long()

    app.launch()
    run_id = app.start(slow, timeout_s=0.5)
    rec = ended(app, run_id)
    assert rec.error == (
        f"RunTimeout: run {run_id} passed its deadline (timeout_s 0.5s from its first start)"
    )
    assert of_kind(app, run_id, EventKind.STEP_COMPLETED) == []
    bad: Any  # wrong on purpose: the runtime check is what is tested
    for bad in (0, -1, "soon", float("nan")):
        with pytest.raises(ratchet.InvalidInput, match="timeout_s must be a positive number"):
            app.start(slow, timeout_s=bad)
        with pytest.raises(ratchet.InvalidInput, match="timeout_s must be a positive number"):
            app.workflow(name=f"w{bad}", timeout_s=bad)(slow.fn)
    assert app.count_runs() == 1
