"""A Pydantic AI agent on Ratchet, for the crash tests: its workflow, and the worker process
that drives it (``python tests/agent_app.py``, configured like ``crash_app``'s, plus
``CRASH_LLM_URL``: the local provider the agent's ``OpenAIChatModel`` talks to).

The agent asks the model, which calls the ``lookup`` tool (the step logs its invocation and
waits for the test's ``lookup`` gate), then asks again and answers.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from crash_app import LLM_SECRET, gate, main, record

import ratchet

SCRIPT = {"rules": [
    {"match": {"last_role": "user"},
     "reply": {"tool_calls": [{"name": "lookup", "arguments": {"city": "Paris"}}]}},
    {"match": {"last_role": "tool"}, "reply": {"text": "It is sunny in Paris."}},
]}
MODEL_STEP = "pai_weather__model.request"
TOOL_STEP = "pai_weather__function_toolset__<agent>.call_tool:lookup"


@functools.cache
def weather_agent() -> Any:
    """The agent, made on first use in the worker (the test process only starts runs)."""
    import openai
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from ratchet.integrations.pydantic_ai import RatchetDurability

    # The SDK's own retries off: the step's retry policy is the only one.
    client = openai.AsyncOpenAI(base_url=os.environ["CRASH_LLM_URL"] + "/v1",
                                api_key=LLM_SECRET, max_retries=0)
    model = OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, name="pai_weather", instructions="Answer with the tools.",
                  capabilities=[RatchetDurability()])

    @agent.tool_plain
    async def lookup(city: str) -> dict[str, str]:
        """The weather in a city."""
        record("invoke")
        await gate("lookup")
        return {"city": city, "sky": "sunny"}

    return agent


def build(url: str, *, lease_ttl: float | None = None,
          recovery_interval: float | None = None) -> ratchet.Ratchet:
    """The app on database ``url``."""
    app = ratchet.Ratchet(url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)

    @app.workflow()
    async def pai_weather(text: str) -> str:
        result = await weather_agent().run(text)
        return str(result.output)

    return app


if __name__ == "__main__":
    main(build)
