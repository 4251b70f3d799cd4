"""Spend stops before it happens when an agent fans out, on SQLite and PostgreSQL, against
the local provider over real HTTP: a Pydantic AI agent whose model asks for several tool
calls in one response, each tool asking a wrapped model of its own, stays within the run's
budget, counted in the requests the provider received and the tokens it billed."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest
from crash_app import LLM_SECRET
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from test_spend import MODEL, WORST, ask, client, dead_letter, ended, of_kind

import ratchet
from ratchet.integrations.pydantic_ai import RatchetDurability
from ratchet.llm.server import LocalProvider, serve
from ratchet.model import EventKind, fold

pytestmark = pytest.mark.usefixtures("collect_clients")
TOPICS = 4
PLAN = "plan the research"
# The agent's first request: the prompt, the tool's schema and max_tokens=50 (its settings).
AGENT_MAX_TOKENS = 50
RESEARCH_TOKENS = 900  # billed for each tool's call (of max_tokens=1000)
SCRIPT = {
    "rules": [
        # The agent's model fans out: one response, four calls of the tool.
        {
            "match": {"contains": PLAN, "last_role": "user"},
            "reply": {
                "tool_calls": [
                    {"name": "research", "arguments": {"topic": f"topic {i}"}}
                    for i in range(TOPICS)
                ]
            },
        },
        {"match": {"last_role": "tool"}, "reply": {"text": "all researched"}},
        # A tool's own question: an answer that bills most of its max_tokens, so that
        # calls one after another fill the budget as calls in flight do.
        {
            "match": {"contains": "research topic", "last_role": "user"},
            "reply": {"text": "notes", "output_tokens": RESEARCH_TOKENS},
        },
    ]
}


def test_an_agents_tool_fan_out_stays_within_the_budget(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    server = LocalProvider(script=SCRIPT)
    with serve(server) as base:
        oai = client(base)
        model = OpenAIChatModel(
            MODEL,
            provider=OpenAIProvider(
                openai_client=openai.AsyncOpenAI(
                    base_url=base + "/v1", api_key=LLM_SECRET, max_retries=0
                )
            ),
        )
        agent = Agent(model, name="planner", capabilities=[RatchetDurability()])
        asked: list[str] = []

        @agent.tool_plain
        async def research(topic: str) -> str:
            """Research a topic with a model of its own."""
            asked.append(topic)
            return await ask(oai, f"research {topic}")

        # Room for the agent's first request and two of the tools' calls, whether they run
        # at once (two worst cases in flight) or one after another (two answers billed),
        # not for a third.
        budget = 2 * WORST + 300
        app = make_app()

        @app.workflow(guards=ratchet.Guards(budget_tokens=budget))
        async def plan() -> str:
            result = await agent.run(PLAN, model_settings={"max_tokens": AGENT_MAX_TOKENS})
            return result.output

        app.launch()
        run_id = app.start(plan)
        ended(app, run_id)
        assert dead_letter(app, run_id) == "budget_exceeded"
        sent = server.requests()
        # The agent's first request and two research calls reached the provider, not the
        # third nor the agent's next request; the tokens billed stay within the budget.
        assert len(sent) == 3, [(r["input_tokens"], r["output_tokens"]) for r in sent]
        billed = sum(r["input_tokens"] + r["output_tokens"] for r in sent if r["billed"])
        assert billed <= budget
        [found] = [e.payload for e in of_kind(app, run_id, EventKind.ANOMALY_DETECTED)]
        assert found["kind"] == "budget_exceeded"
        assert len(asked) <= 3  # the tool whose call was refused may have started


def test_a_plain_steps_two_model_calls_stay_within_the_budget_and_count(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    """A plain ``@app.step`` that asks a wrapped client twice: the first call fits the
    budget, the second would cross it and is never sent; the run fails budget_exceeded and
    the call that was sent is counted with the step's end."""
    server = LocalProvider(script=SCRIPT)
    with serve(server) as base:
        oai = client(base)
        app = make_app()

        @app.step
        async def research_twice() -> str:
            first = await ask(oai, "research topic a")
            return first + await ask(oai, "research topic b")

        @app.workflow(guards=ratchet.Guards(budget_tokens=WORST + 300))
        async def twice() -> str:
            return await research_twice()

        app.launch()
        run_id = app.start(twice)
        ended(app, run_id)
        assert dead_letter(app, run_id) == "budget_exceeded"
        assert len(server.requests()) == 1
        [failed] = of_kind(app, run_id, EventKind.STEP_FAILED)
        assert failed.payload["error_type"] == "GuardTripped"
        assert failed.payload["llm"]["calls"] == 1
        assert failed.payload["llm"]["usage"]["output_tokens"] == RESEARCH_TOKENS
        assert fold(run_id, app.events(run_id)).llm.calls == 1


def test_nested_usage_is_in_the_run_totals_and_read_back_from_the_journal(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    """Calls inside a step are in the run's totals, folded from the journal as a re-drive
    folds it."""
    server = LocalProvider(script=SCRIPT)
    with serve(server) as base:
        oai = client(base)
        app = make_app()

        @app.step
        async def research_twice() -> str:
            first = await ask(oai, "research topic a")
            return first + await ask(oai, "research topic b")

        @app.workflow(guards=ratchet.Guards(budget_tokens=10 * WORST))
        async def twice() -> str:
            return await research_twice()

        app.launch()
        run_id = app.start(twice)
        ended(app, run_id, "succeeded")
        sent = server.requests()
        assert len(sent) == 2
        billed = sum(r["input_tokens"] + r["output_tokens"] for r in sent)
        [done] = of_kind(app, run_id, EventKind.STEP_COMPLETED)
        assert done.payload["llm"]["nested"] and done.payload["llm"]["calls"] == 2
        state = fold(run_id, app.events(run_id))
        assert state.llm.calls == 2 and state.llm.tokens == billed
