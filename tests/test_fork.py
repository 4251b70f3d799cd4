"""Forks, resumes and diffs, on SQLite and PostgreSQL, against the local model provider over
real HTTP: a fork replays the source's completed steps before its fork point at no cost (no
model call, no step code), runs from the fork point on (with its edited output, or other
input), keeps its lineage, its tenant and its budgets, verifies as a receipt, and can be
forked again; refused forks write nothing; a cancelled run resumes from its last completed
step; two runs diff step by step. The HTTP API answers the same, tenant by tenant."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from clirun import data_dir as data_dir
from crash_app import LLM_SECRET
from serving import serving
from waiting import wait_for

import ratchet
from ratchet.errors import InvalidInput, NotCancelled, UnknownRun, UnknownStep, UnknownWorkflow
from ratchet.llm.server import LocalProvider
from ratchet.llm.worst_case import worst_case
from ratchet.model import EventKind, NewRun, fold, idempotency_key, request_of
from ratchet.receipts.verify import verify
from ratchet.store import tokens
from ratchet.store.forks import fork_journal

pytestmark = pytest.mark.usefixtures("collect_clients", "data_dir")
MODEL = "gpt-4.1-mini"
CALL = "openai.chat.completions.create"


def ask_with(base: str) -> Callable[[str], Any]:
    oai = ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET))

    async def ask(question: str) -> str:
        reply = await oai.chat.completions.create(
            model=MODEL, max_tokens=1000, messages=[{"role": "user", "content": question}]
        )
        return reply.choices[0].message.content or ""

    return ask


def brief_app(
    make_app: Callable[..., ratchet.Ratchet], base: str
) -> tuple[ratchet.Ratchet, Counter[str]]:
    """A workflow of four steps: a step with a delivery, a model call, a plain step, a
    model call. Each plain step and the delivery count their invocations; the provider
    logs each model call."""
    app = make_app()
    ran: Counter[str] = Counter()
    ask = ask_with(base)

    def dispatch(key: str) -> dict[str, str]:
        ran["delivery"] += 1
        return {"key": key}

    @app.step()
    async def prepare(topic: str) -> str:
        ran["prepare"] += 1
        await ratchet.deliver(dispatch)  # a side effect, sent once
        return f"notes on {topic}"

    @app.step()
    async def summarize(draft: str, topic: str) -> str:
        ran["summarize"] += 1
        if topic == "fail":
            raise ValueError("cannot summarize a failure")
        return f"summary of {len(draft)} characters"

    @app.workflow()
    async def brief(topic: str) -> dict[str, str]:
        notes = await prepare(topic)
        draft = await ask(f"draft: {notes}")
        summary = await summarize(draft, topic)
        final = await ask(f"polish: {summary}")
        return {"notes": notes, "summary": summary, "final": final}

    return app, ran


def keys(provider: LocalProvider) -> list[str | None]:
    """The Idempotency-Keys of the requests the provider received, in order."""
    return [r["idempotency_key"] for r in provider.requests()]


def done(app: ratchet.Ratchet, run_id: str) -> ratchet.RunRecord:
    return wait_for(
        lambda: (r := app.get(run_id)).status.terminal and r, 30, what=f"run {run_id} to end"
    )


def test_a_fork_replays_the_steps_before_its_fork_point_at_no_cost_and_runs_the_rest(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    app, ran = brief_app(make_app, base)
    app.launch()
    source = app.start("brief", "otters")
    out = app.result(source, timeout_s=30)
    assert len(server.requests()) == 2 and ran == {"prepare": 1, "delivery": 1, "summarize": 1}
    before = app.events(source)

    # At the third step, its output edited: steps 1 and 2 are copies, step 3 is journaled
    # with the edit, and only step 4 runs.
    fork = app.fork(source, "3:summarize", edit={"3:summarize": "EDITED"}, by="ana")
    forked = app.result(fork, timeout_s=30)
    assert forked["notes"] == out["notes"] and forked["summary"] == "EDITED"
    assert ran == {"prepare": 1, "delivery": 1, "summarize": 1}
    # One model call: the fork's fourth step, under the fork's own key, on the edit (the
    # provider's answer quotes its prompt).
    assert keys(server)[2:] == [idempotency_key(fork, f"4:{CALL}", 1)]
    assert "polish: EDITED" in forked["final"]
    rec = app.get(fork)
    assert (rec.forked_from, rec.forked_at) == (source, "3:summarize")
    assert rec.as_dict()["forked_from"] == source and app.get(source).forked_from is None
    assert (rec.workflow, rec.input, rec.tenant_id) == ("brief", app.get(source).input, "default")
    events = app.events(fork)
    assert events[0].kind == EventKind.RUN_QUEUED
    assert events[0].payload["forked_from"] == source and events[0].payload["by"] == "ana"
    copied = [e for e in events if e.payload.get("copied_from") == source]
    assert [e.step_id for e in copied] == ["1:prepare", f"2:{CALL}", "3:summarize"]
    assert all("idempotency_key" not in e.payload for e in copied)
    edited = next(e for e in events if e.payload.get("edited"))
    assert (edited.step_id, edited.payload["output"]) == ("3:summarize", "EDITED")
    # The copied model call keeps its usage: the fork's totals count it.
    assert fold(fork, events).llm.calls == 2
    assert app.events(source) == before  # the source is never changed
    assert app.receipts(fork) == [] and len(app.receipts(source)) == 1

    # Without an edit, the fork point runs again, and everything after it.
    again = app.fork(source, "3:summarize")
    assert app.result(again, timeout_s=30) == out
    assert ran == {"prepare": 1, "delivery": 1, "summarize": 2}
    assert keys(server)[3:] == [idempotency_key(again, f"4:{CALL}", 1)]


def test_an_edited_copied_step_and_other_input_reach_the_fork(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    app, ran = brief_app(make_app, base)
    app.launch()
    source = app.start("brief", "otters")
    app.result(source, timeout_s=30)

    # A copied step's output edited: the workflow reads the edit where it reads the step.
    fork = app.fork(source, "2:" + CALL, edit={"1:prepare": "secret notes"})
    out = app.result(fork, timeout_s=30)
    assert out["notes"] == "secret notes" and ran["prepare"] == 1
    assert keys(server)[2] == idempotency_key(fork, f"2:{CALL}", 1)

    # Other input: the copied steps keep their outputs, the steps from the fork point on
    # see the new input.
    other = app.fork(source, "1:prepare", input={"topic": "beavers"})
    assert app.result(other, timeout_s=30)["notes"] == "notes on beavers"
    assert app.get(other).input == {"args": [], "kwargs": {"topic": "beavers"}}


def test_a_fork_of_a_fork_works_and_its_receipt_verifies(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    app, ran = brief_app(make_app, base)
    app.launch()
    source = app.start("brief", "otters", concurrency_key="desk-7")
    app.result(source, timeout_s=30)
    first = app.fork(source, "3:summarize", edit={"3:summarize": "one"})
    app.result(first, timeout_s=30)
    second = app.fork(first, "4:" + CALL)
    assert app.result(second, timeout_s=30)["summary"] == "one"
    assert (app.get(second).forked_from, app.get(second).forked_at) == (first, f"4:{CALL}")
    # A fork counts against its queue's per-key limit as its source did.
    assert {app.get(r).concurrency_key for r in (source, first, second)} == {"desk-7"}
    assert len(server.requests()) == 4 and ran == {"prepare": 1, "delivery": 1, "summarize": 1}
    # The copy of a copy still names the run it was copied from.
    assert {e.payload.get("copied_from") for e in app.events(second) if e.step_id} >= {first}
    for run_id in (first, second):
        envelope = app.run_receipt(run_id)
        lines = [ratchet.model.dumps(e.export_dict()) for e in app.events(run_id)]
        assert verify(envelope, lines, app.signer.public).run_id == run_id


def count_all(app: ratchet.Ratchet) -> tuple[int, int]:
    runs = app.runs(limit=1000)
    return len(runs), sum(len(app.events(r.run_id)) for r in runs)


def test_a_refused_fork_writes_nothing(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    _, base = provider
    app, _ = brief_app(make_app, base)
    app.launch()
    source = app.start("brief", "otters")
    app.result(source, timeout_s=30)
    before = count_all(app)
    with pytest.raises(UnknownRun):
        app.fork("nope", "1:prepare")
    with pytest.raises(UnknownStep, match="has no step '9:prepare'"):
        app.fork(source, "9:prepare")
    with pytest.raises(InvalidInput, match="invalid fork point"):
        app.fork(source, "prepare")
    with pytest.raises(InvalidInput, match="comes after the fork point"):
        app.fork(source, "2:" + CALL, edit={"3:summarize": "late"})
    with pytest.raises(UnknownStep):
        app.fork(source, "2:" + CALL, edit={"1:other": "x"})
    with pytest.raises(InvalidInput, match="does not fit|expected"):
        app.fork(source, "1:prepare", input={"topic": "x", "extra": 1})
    with pytest.raises(InvalidInput, match="not JSON|serial"):
        app.fork(source, "1:prepare", edit={"1:prepare": object()})
    # An app without the workflow cannot fork its runs.
    stranger = make_app()
    with pytest.raises(UnknownWorkflow, match="neither a code workflow"):
        stranger.fork(source, "1:prepare")

    @stranger.workflow(name="brief", version="2")
    async def brief_v2(topic: str) -> str:
        return topic

    with pytest.raises(UnknownWorkflow, match="version 1, and this app has version 2"):
        stranger.fork(source, "1:prepare")
    assert count_all(app) == before


def test_a_fork_is_written_whole_or_not_at_all(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    _, base = provider
    app, _ = brief_app(make_app, base)
    app.launch()
    source = app.start("brief", "otters")
    app.result(source, timeout_s=30)
    events = app.events(source)
    state = fold(source, events)
    rec = app.get(source)
    new = NewRun(
        "half-a-fork", rec.workflow, rec.workflow_version, rec.input,
        forked_from=source, forked_at="3:summarize",
    )  # fmt: skip
    copied = {k: v for k, v in state.steps.items() if v.ordinal < 3}
    journal = fork_journal(new, events, copied, {})
    assert [e.seq for e in journal] == list(range(1, len(journal) + 1))
    # The last event written twice: the database refuses it, and the whole fork with it.
    with pytest.raises(ratchet.RatchetError):
        app.portal.call(app.store.create_fork(new, [*journal, journal[-1]]))
    assert app.portal.call(app.store.get_run("half-a-fork")) is None
    assert app.portal.call(app.store.load_events("half-a-fork")) == []
    # Written whole, it is a run like any other.
    assert app.portal.call(app.store.create_fork(new, journal)).forked_from == source
    assert app.result("half-a-fork", timeout_s=30)["summary"] == app.result(source)["summary"]


def test_steps_in_flight_before_the_fork_point_are_not_copied(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    ran: Counter[str] = Counter()
    release = threading.Event()

    @app.step()
    async def slow() -> str:
        ran["slow"] += 1
        while not release.is_set():
            await asyncio.sleep(0.01)
        return "slow"

    @app.step()
    async def fast() -> str:
        ran["fast"] += 1
        return "fast"

    @app.workflow()
    async def pair() -> list[str]:
        return list(await asyncio.gather(slow(), fast()))

    app.launch()
    source = app.start(pair)
    wait_for(
        lambda: (
            "2:fast" in fold(source, app.events(source)).steps
            and fold(source, app.events(source)).steps["2:fast"].status == "completed"
        ),
        what="the fast branch to complete",
    )
    # Step 1 is still running: a fork at step 2 does not copy it, and runs it itself.
    fork = app.fork(source, "2:fast", edit={"2:fast": "edited"})
    assert [e.step_id for e in app.events(fork) if e.step_id] == ["2:fast", "2:fast"]
    release.set()
    assert app.result(source, timeout_s=30) == ["slow", "fast"]
    assert app.result(fork, timeout_s=30) == ["slow", "edited"]
    assert ran == {"slow": 2, "fast": 1}


def test_a_graph_run_forks_with_other_input(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()
    calls: Counter[str] = Counter()

    @app.tool
    async def score(account: str) -> dict[str, Any]:
        calls[account] += 1
        return {"score": len(account)}

    first = {"tool": "score", "args": {"account": "{{ input.account }}"}}
    second = {"tool": "score", "args": {"account": "{{ input.account }}!"}}
    app.graph(
        {
            "name": "scores",
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "first", "type": "tool", "data": first},
                {"id": "second", "type": "tool", "data": second},
            ],
            "edges": [{"from": "start", "to": "first"}, {"from": "first", "to": "second"}],
            "output": {
                "a": "{{ nodes.first.output.score }}",
                "b": "{{ nodes.second.output.score }}",
            },
        }
    )
    app.launch()
    source = app.start("scores", {"account": "abc"})
    assert app.result(source, timeout_s=30) == {"a": 3, "b": 4}
    fork = app.fork(source, "2:second", input={"account": "z"})
    assert app.result(fork, timeout_s=30) == {"a": 3, "b": 2}
    assert calls == {"abc": 1, "abc!": 1, "z!": 1}
    with pytest.raises(InvalidInput, match="invalid input for graph scores|input"):
        app.fork(source, "2:second", input=["not", "an", "object"])


def test_a_fork_of_a_failed_run_at_its_failed_step_with_other_input_succeeds(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    app, ran = brief_app(make_app, base)
    app.launch()
    source = app.start("brief", "fail")  # summarize fails on this topic
    with pytest.raises(ratchet.RunFailed):
        app.result(source, timeout_s=30)
    failed = next(s for s in fold(source, app.events(source)).steps.values() if s.error)
    assert failed.step_id == "3:summarize"
    assert len(server.requests()) == 1 and ran == {"prepare": 1, "delivery": 1, "summarize": 1}
    # The failed step is the fork point: it runs again, on the edited input. The steps
    # before it are copies (the model is not asked for a draft again).
    fork = app.fork(source, failed.step_id, input={"topic": "otters"})
    out = app.result(fork, timeout_s=30)
    assert out["notes"] == "notes on fail" and out["summary"].startswith("summary of")
    assert ran == {"prepare": 1, "delivery": 1, "summarize": 2}
    assert keys(server)[1:] == [idempotency_key(fork, f"4:{CALL}", 1)]
    assert app.get(source).status == "failed"


def test_copied_model_calls_count_toward_the_forks_budget(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    app = make_app()
    ask = ask_with(base)

    @app.workflow()
    async def three() -> list[str]:
        return [await ask(f"question {i}") for i in (1, 2, 3)]

    app.launch()
    probe = app.start(three)
    app.result(probe, timeout_s=30)
    spent = [
        e.payload["llm"]["usage"] for e in app.events(probe) if e.kind == EventKind.STEP_COMPLETED
    ]
    t1, t2 = (u["input_tokens"] + u["output_tokens"] for u in spent[:2])
    worst = worst_case(
        (),
        {
            "model": MODEL,
            "max_tokens": 1000,
            "messages": [{"role": "user", "content": "question 3"}],
        },
    )[0]
    # Room for two calls and the third's worst case, less one token: the third trips.
    source = app.start(three, guards={"budget_tokens": t1 + t2 + worst - 1})
    assert done(app, source).status == "failed"
    assert next(d.reason for d in app.dead_letters() if d.run_id == source) == "budget_exceeded"
    calls = len(server.requests())
    # A fork at the second call starts with the first one's usage: the second is sent
    # again (it fits), and the third trips as in the source, never sent. Counted from zero,
    # the fork's two calls would fit.
    fork = app.fork(source, f"2:{CALL}")
    assert done(app, fork).status == "failed"
    assert next(d.reason for d in app.dead_letters() if d.run_id == fork) == "budget_exceeded"
    assert keys(server)[calls:] == [idempotency_key(fork, f"2:{CALL}", 1)]
    assert fold(fork, app.events(fork)).llm.calls == 2


def test_a_cancelled_run_resumes_from_its_last_completed_step(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    ran: Counter[str] = Counter()

    @app.step()
    async def work(n: int) -> int:
        ran[f"work{n}"] += 1
        return n * 10

    @app.workflow()
    async def waits() -> list[Any]:
        first = await work(1)
        go = await ratchet.wait_for_signal("go")
        return [first, go, await work(2)]

    app.launch()
    run_id = app.start(waits)
    wait_for(lambda: app.get(run_id).status == "waiting", what="the run to park")
    with pytest.raises(NotCancelled, match="not cancelled"):
        app.resume(run_id)
    assert app.cancel(run_id, by="ana") == "cancelled"
    head = len(app.events(run_id))
    assert app.resume(run_id, by="bob") == run_id
    queued = app.events(run_id)[head]
    assert (queued.kind, queued.payload) == (
        EventKind.RUN_QUEUED,
        {"reason": "resume", "by": "bob"},
    )
    wait_for(lambda: app.get(run_id).status == "waiting", what="the resumed run to park again")
    app.signal(run_id, "go", "now")
    assert app.result(run_id, timeout_s=30) == [10, "now", 20]
    assert ran == {"work1": 1, "work2": 1}
    with pytest.raises(NotCancelled, match="succeeded"):
        app.resume(run_id)
    with pytest.raises(UnknownRun):
        app.resume("nope")


def test_two_runs_diff_step_by_step(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    _, base = provider
    app, _ = brief_app(make_app, base)
    app.launch()
    source = app.start("brief", "otters")
    app.result(source, timeout_s=30)
    fork = app.fork(source, "3:summarize", edit={"3:summarize": "EDITED"})
    app.result(fork, timeout_s=30)
    found = app.diff(source, fork)
    assert (found.a, found.b) == (source, fork)
    by_id = {s.step_id: s for s in found.steps}
    assert [s.step_id for s in found.steps] == [
        "1:prepare",
        f"2:{CALL}",
        "3:summarize",
        f"4:{CALL}",
    ]
    assert by_id["1:prepare"].status == by_id[f"2:{CALL}"].status == "same"
    assert by_id["3:summarize"].status == by_id[f"4:{CALL}"].status == "changed"
    side = by_id[f"2:{CALL}"]
    assert side.a is not None and side.b is not None
    assert side.a.input_tokens == side.b.input_tokens and side.a.input_tokens
    assert side.a.output == side.b.output and side.a.duration_ms is not None
    assert by_id["3:summarize"].b is not None and by_id["3:summarize"].b.output == "EDITED"
    assert by_id["1:prepare"].a is not None and by_id["1:prepare"].a.input_tokens is None
    as_dict = found.as_dict()
    assert set(as_dict) == {"a", "b", "steps"}
    assert set(as_dict["steps"][0]) == {"step_id", "status", "a", "b"}
    assert {"status", "output", "input_tokens", "output_tokens", "cost_usd", "duration_ms"} <= set(
        as_dict["steps"][0]["a"]
    )
    # A step only one run reached.
    short = app.fork(source, "1:prepare", input={"topic": "fail"})
    done(app, short)
    one_sided = {s.step_id: s.status for s in app.diff(short, source).steps}
    assert one_sided[f"4:{CALL}"] == "only_b" and one_sided["3:summarize"] == "changed"
    with pytest.raises(UnknownRun):
        app.diff(source, "nope")


@pytest.fixture
def api(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> Iterator[tuple[ratchet.Ratchet, dict[str, httpx.Client]]]:
    _, base = provider
    app, _ = brief_app(make_app, base)
    clients: dict[str, httpx.Client] = {}
    with serving(app, workers=0) as url:
        for tenant in ("acme", "globex"):
            _, secret = app.portal.call(
                tokens.create_token(app.store, tenant, ("runs:read", "runs:write"), tenant + "-ops")
            )
            clients[tenant] = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=30
            )
        try:
            yield app, clients
        finally:
            for c in clients.values():
                c.close()


def test_the_api_forks_resumes_and_diffs_the_callers_runs_only(
    api: tuple[ratchet.Ratchet, dict[str, httpx.Client]],
) -> None:
    app, c = api
    app.launch()
    acme, globex = c["acme"], c["globex"]
    r = acme.post(
        "/v1/runs", json={"workflow": "brief", "input": {"topic": "otters"}, "run_id": "b-1"}
    )
    assert r.status_code == 202, r.text
    done(app, "acme~b-1")

    r = acme.post("/v1/runs/b-1/fork", json={"at": "3:summarize", "edit": {"3:summarize": "X"}})
    assert r.status_code == 202, r.text
    body = r.json()
    assert set(body) == {"run_id", "forked_from", "forked_at"}
    assert (body["forked_from"], body["forked_at"]) == ("b-1", "3:summarize")
    fork = body["run_id"]
    assert "~" not in fork and app.get(f"acme~{fork}").tenant_id == "acme"
    assert done(app, f"acme~{fork}").output["summary"] == "X"
    shown = acme.get(f"/v1/runs/{fork}").json()
    assert (shown["forked_from"], shown["forked_at"]) == ("b-1", "3:summarize")
    assert acme.get("/v1/runs/b-1").json()["forked_from"] is None
    # The fork's journal reads like any run's: its state and its waterfall.
    for view in ("state", "waterfall", "events"):
        assert acme.get(f"/v1/runs/{fork}/{view}").status_code == 200, view

    diff = acme.get(f"/v1/runs/b-1/diff/{fork}")
    assert diff.status_code == 200, diff.text
    assert diff.json()["a"] == "b-1" and diff.json()["b"] == fork
    assert [s["status"] for s in diff.json()["steps"]] == ["same", "same", "changed", "changed"]

    # Another tenant reaches none of it: 404, exactly as for a missing run, nothing written.
    before = len(app.runs(limit=1000))
    for path in ("/v1/runs/b-1/fork", f"/v1/runs/{fork}/fork"):
        r = globex.post(path, json={"at": "1:prepare"})
        assert r.status_code == 404 and r.json()["error"] == "not_found", r.text
    assert globex.post("/v1/runs/b-1/resume").status_code == 404
    assert globex.get(f"/v1/runs/b-1/diff/{fork}").status_code == 404
    assert len(app.runs(limit=1000)) == before

    # Refusals name the problem.
    r = acme.post("/v1/runs/b-1/fork", json={"at": "9:nothing"})
    assert r.status_code == 422 and "has no step '9:nothing'" in r.json()["message"], r.text
    assert "acme~" not in r.text
    r = acme.post("/v1/runs/b-1/fork", json={"at": "1:prepare", "input": {"topic": 3}})
    assert r.status_code == 422, r.text
    r = acme.post("/v1/runs/b-1/resume")
    assert r.status_code == 409 and "not cancelled" in r.json()["message"], r.text
    assert len(app.runs(limit=1000)) == before


def test_the_api_resumes_a_cancelled_run(
    api: tuple[ratchet.Ratchet, dict[str, httpx.Client]],
) -> None:
    app, c = api  # no worker: the run stays queued, and is cancelled there
    r = c["acme"].post("/v1/runs", json={"workflow": "brief", "input": {"topic": "o"}})
    run_id = r.json()["run_id"]
    assert c["acme"].post(f"/v1/runs/{run_id}/cancel").json()["status"] == "cancelled"
    r = c["acme"].post(f"/v1/runs/{run_id}/resume")
    assert (r.status_code, r.json()) == (202, {"run_id": run_id}), r.text
    rec = app.get(f"acme~{run_id}")
    assert rec.status == "queued"
    assert app.events(rec.run_id)[-1].payload == {"reason": "resume", "by": "acme-ops"}
    assert c["globex"].post(f"/v1/runs/{run_id}/resume").status_code == 404
    app.launch()
    assert done(app, rec.run_id).status == "succeeded"


def test_a_forks_copied_model_calls_keep_their_requests_and_new_input_is_no_drift(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai = ratchet.llm.wrap(
        openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET),
        retry=ratchet.Retry(max_attempts=2, backoff_ms=10, retry_on=("llm",)),
    )
    app = make_app()

    @app.step()
    async def shout(text: str) -> str:
        return text.upper()

    @app.workflow()
    async def about(topic: str) -> str:
        reply = await oai.chat.completions.create(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": f"on {topic}"}]
        )
        return await shout(str(reply.choices[0].message.content))

    server.fail("429", times=1)  # the model call's first attempt fails: its retry's
    app.launch()  # step_started names the messages the first attempt journaled
    source = app.start("about", "otters")
    assert app.result(source, timeout_s=30) == "ECHO: ON OTTERS"
    sent = len(server.requests())
    # Other input: the copied model call was asked "on otters", the fork's code now asks
    # "on beavers" of it. The fork takes the copy as it was (no drift, no call) and the
    # copied request reads back whole from the fork's own journal.
    fork = app.fork(source, "2:shout", input={"topic": "beavers"})
    assert app.result(fork, timeout_s=30) == "ECHO: ON OTTERS"
    assert len(server.requests()) == sent
    events = app.events(fork)
    assert not [e for e in events if e.kind == EventKind.REQUEST_DRIFTED]
    call = f"1:{CALL}"
    copied = request_of(events, call)
    assert copied is not None and copied == request_of(app.events(source), call)
    assert copied["messages"] == [{"role": "user", "content": "on otters"}]
