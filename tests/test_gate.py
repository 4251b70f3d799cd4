"""The confidence gate on SQLite and PostgreSQL, over real HTTP to the local provider: a
passing answer journals ``confidence_evaluated``; one below the threshold parks on an
approval whose approval journals ``confidence_gate_bypassed {by, reason}``, retries with
another model, fails, or branches in a graph; a run started with the gate off journals the
bypass; the score comes from a field, the judge (an LLM step of its own) or logprobs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from crash_app import LLM_SECRET
from waiting import wait_for

import ratchet
from ratchet.llm.gate import Gate, logprob_score
from ratchet.llm.server import LocalProvider, serve
from ratchet.model import EventKind

pytestmark = pytest.mark.usefixtures("collect_clients")
CALL = "1:openai.chat.completions.create"
# The cheap model is unsure, the big one sure; the judge (asked to rate) says 0.85.
SCRIPT = {
    "rules": [
        {"match": {"contains": "Rate from 0 to 1"}, "reply": {"text": "0.85"}},
        {"match": {"model": "gpt-4.1"}, "reply": {"json": {"answer": "42", "confidence": 0.95}}},
        {"match": {}, "reply": {"json": {"answer": "41?", "confidence": 0.3}}},
    ]
}


@pytest.fixture
def base() -> Iterator[str]:
    with serve(LocalProvider(SCRIPT)) as url:
        yield url


def gated_app(
    make_app: Callable[..., ratchet.Ratchet], base: str, gate: Gate, **guards: Any
) -> ratchet.Ratchet:
    app = make_app()
    oai = ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET))

    @app.workflow(guards=ratchet.Guards(**guards) if guards else None)
    async def answer(model: str = "gpt-4.1-mini") -> str:
        reply = await oai.chat.completions.create(
            model=model,
            max_tokens=64,
            ratchet_gate=gate,
            messages=[{"role": "user", "content": "What is six times seven?"}],
        )
        return reply.choices[0].message.content or ""

    app.launch()
    return app


def gate_events(app: ratchet.Ratchet, run_id: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    kinds = {EventKind.CONFIDENCE_EVALUATED, EventKind.CONFIDENCE_GATE_BYPASSED}
    return [(e.kind, e.step_id, e.payload) for e in app.events(run_id) if e.kind in kinds]


def test_a_passing_answer_is_journaled_and_returned(
    make_app: Callable[..., ratchet.Ratchet], base: str
) -> None:
    app = gated_app(make_app, base, Gate(threshold=0.9))
    run_id = app.start("answer", model="gpt-4.1")
    assert '"confidence":0.95' in app.result(run_id, timeout_s=30).replace(" ", "")
    assert gate_events(app, run_id) == [
        (
            EventKind.CONFIDENCE_EVALUATED,
            CALL,
            {
                "key": CALL,
                "score": 0.95,
                "threshold": 0.9,
                "passed": True,
                "source": "field:confidence",
            },
        )
    ]


def test_below_the_threshold_parks_on_an_approval_and_approving_is_a_bypass(
    make_app: Callable[..., ratchet.Ratchet], base: str
) -> None:
    app = gated_app(make_app, base, Gate(threshold=0.8))
    run_id = app.start("answer")
    [asked] = wait_for(lambda: app.approvals(run_id), what="the gate's approval")
    assert asked.name == f"gate:{CALL}"
    assert (asked.data["score"], asked.data["threshold"]) == (0.3, 0.8)
    wait_for(lambda: app.get(run_id).status == "waiting", what="the run parked")
    app.approve(run_id, asked.step_id, by="ops", comment="checked by hand")
    assert "41?" in app.result(run_id, timeout_s=30)
    # The drive after the decision replayed the evaluation from the journal: once each.
    assert gate_events(app, run_id) == [
        (
            EventKind.CONFIDENCE_EVALUATED,
            CALL,
            {
                "key": CALL,
                "score": 0.3,
                "threshold": 0.8,
                "passed": False,
                "source": "field:confidence",
            },
        ),
        (
            EventKind.CONFIDENCE_GATE_BYPASSED,
            CALL,
            {"key": f"override:{CALL}", "by": "ops", "reason": "checked by hand"},
        ),
    ]


def test_a_rejected_answer_fails_the_run(
    make_app: Callable[..., ratchet.Ratchet], base: str
) -> None:
    app = gated_app(make_app, base, Gate(threshold=0.8))
    run_id = app.start("answer")
    [asked] = wait_for(lambda: app.approvals(run_id), what="the gate's approval")
    app.reject(run_id, asked.step_id, by="ops")
    with pytest.raises(ratchet.RunFailed, match="ops rejected the answer"):
        app.result(run_id, timeout_s=30)


def test_fail_and_retry_with_another_model(
    make_app: Callable[..., ratchet.Ratchet], base: str
) -> None:
    app = gated_app(make_app, base, Gate(threshold=0.8, on_below="fail"))
    run_id = app.start("answer")
    with pytest.raises(
        ratchet.RunFailed,
        match="GateRejected: step 1:openai.chat.completions"
        ".create: confidence 0.3 from field:confidence",
    ):
        app.result(run_id, timeout_s=30)
    app.shutdown()

    app = gated_app(make_app, base, Gate(threshold=0.8, on_below="retry", retry_model="gpt-4.1"))
    run_id = app.start("answer")
    assert "42" in app.result(run_id, timeout_s=30)
    verdicts = [(step, p["score"], p["passed"]) for _, step, p in gate_events(app, run_id)]
    assert verdicts == [(CALL, 0.3, False), ("2:openai.chat.completions.create", 0.95, True)]
    models = [e.payload["model"] for e in app.events(run_id) if e.kind == EventKind.STEP_STARTED]
    assert models == ["gpt-4.1-mini", "gpt-4.1"]


def test_a_judge_is_an_llm_step_of_its_own(
    make_app: Callable[..., ratchet.Ratchet], base: str
) -> None:
    app = gated_app(make_app, base, Gate(threshold=0.8, source="judge"))
    run_id = app.start("answer")
    app.result(run_id, timeout_s=30)
    [(_, step, verdict)] = gate_events(app, run_id)
    assert (step, verdict["score"], verdict["passed"], verdict["source"]) == (
        CALL,
        0.85,
        True,
        "judge",
    )
    completed = [e.step_id for e in app.events(run_id) if e.kind == EventKind.STEP_COMPLETED]
    assert completed == [CALL, "2:openai.chat.completions.create"]


def test_logprobs_where_the_provider_gives_them() -> None:
    body = {
        "choices": [
            {
                "message": {"content": "42"},
                "logprobs": {
                    "content": [{"token": "4", "logprob": -0.1}, {"token": "2", "logprob": -0.3}]
                },
            }
        ]
    }
    assert logprob_score(body) == pytest.approx(0.8187, abs=1e-4)  # exp(-0.2)
    assert logprob_score({"choices": [{"message": {"content": "42"}, "logprobs": None}]}) is None


def test_the_local_providers_answer_has_no_logprobs_so_it_does_not_pass(
    make_app: Callable[..., ratchet.Ratchet], base: str
) -> None:
    app = gated_app(make_app, base, Gate(threshold=0.5, source="logprobs", on_below="fail"))
    run_id = app.start("answer", model="gpt-4.1")
    with pytest.raises(ratchet.RunFailed, match="confidence unknown from logprobs"):
        app.result(run_id, timeout_s=30)
    assert gate_events(app, run_id)[0][2]["score"] is None


def test_a_run_started_with_the_gate_off_journals_the_bypass(
    make_app: Callable[..., ratchet.Ratchet], base: str
) -> None:
    app = gated_app(make_app, base, Gate(threshold=0.8, on_below="fail"))
    run_id = app.start(
        "answer",
        guards={"gate": False, "gate_bypass_by": "alice", "gate_bypass_reason": "incident 7"},
    )
    assert "41?" in app.result(run_id, timeout_s=30)
    assert gate_events(app, run_id) == [
        (
            EventKind.CONFIDENCE_GATE_BYPASSED,
            CALL,
            {"key": CALL, "by": "alice", "reason": "incident 7"},
        )
    ]


def test_bad_gates_are_refused_before_anything_runs() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"threshold": 2}, "threshold must be a number from 0 to 1"),
        ({"threshold": 0.5, "source": "vibes"}, "source must be"),
        ({"threshold": 0.5, "on_below": "retry"}, "needs retry_model"),
        ({"threshold": 0.5, "on_below": "shrug"}, "on_below must be"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ratchet.InvalidInput, match=message):
            Gate(**kwargs)
    with pytest.raises(ratchet.InvalidInput, match="unknown field colour"):
        Gate.from_json({"threshold": 0.5, "colour": "red"})


def test_a_graph_ai_step_gate_branches_on_its_verdict(
    make_app: Callable[..., ratchet.Ratchet], base: str
) -> None:
    app = make_app()
    app.llm_client(openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET))
    app.graph(
        {
            "name": "gated",
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "ask",
                    "type": "ai-step",
                    "data": {
                        "model": "gpt-4.1-mini",
                        "prompt": "What is six times seven?",
                        "output_schema": {"type": "object"},
                        "gate": {"threshold": 0.8, "on_below": "branch"},
                    },
                },
                {"id": "sure", "type": "output", "data": {"value": "took it"}},
                {"id": "unsure", "type": "output", "data": {"value": "asked a person"}},
            ],
            "edges": [
                {"from": "start", "to": "ask"},
                {"from": "ask", "to": "sure", "when": "output.confidence.passed"},
                {"from": "ask", "to": "unsure", "when": "not output.confidence.passed"},
            ],
        }
    )
    with pytest.raises(ratchet.InvalidInput, match="on_below must be one of"):
        app.graph(
            {
                "name": "bad",
                "nodes": [
                    {"id": "start", "type": "trigger"},
                    {
                        "id": "ask",
                        "type": "ai-step",
                        "data": {
                            "model": "m",
                            "prompt": "p",
                            "gate": {"threshold": 0.8, "on_below": "pray"},
                        },
                    },
                ],
                "edges": [{"from": "start", "to": "ask"}],
            }
        )
    app.launch()
    run_id = app.start("gated", {})
    assert app.result(run_id, timeout_s=30) == "asked a person"
    [(kind, step, verdict)] = gate_events(app, run_id)
    assert (kind, step, verdict["score"], verdict["passed"]) == (
        EventKind.CONFIDENCE_EVALUATED,
        "1:ask",
        0.3,
        False,
    )
