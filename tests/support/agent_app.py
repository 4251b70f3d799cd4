"""A Pydantic AI agent on Ratchet, for the crash tests: its workflow, and the worker process
that drives it (``python tests/support/agent_app.py``, configured like ``crash_app``'s, plus
``CRASH_LLM_URL``: the local provider the agent's ``OpenAIChatModel`` talks to).

The agent asks the model, which calls the ``lookup`` tool (the step logs its invocation and
waits for the test's ``lookup`` gate), then asks again and answers. ``pai_mcp`` does the same
with the ``forecast`` tool of the tests' MCP server (``mcp_server.py``): at ``CRASH_MCP_URL``
(streamable HTTP), or started over stdio with the calls log and gate in ``CRASH_MCP_STDIO``
(``<calls>|<gate>``). ``pai_stream`` is ``pai_weather`` streamed, with a ``ProcessEventStream``
handler that appends each model event it gets to ``CRASH_EVENTS`` (one JSON line, with the
worker's pid).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from crash_app import LLM_SECRET, gate, main, record

import ratchet

SCRIPT = {
    "rules": [
        {
            "match": {"last_role": "user"},
            "reply": {"tool_calls": [{"name": "lookup", "arguments": {"city": "Paris"}}]},
        },
        {"match": {"last_role": "tool"}, "reply": {"text": "It is sunny in Paris."}},
    ]
}
MODEL_STEP = "pai_weather__model.request"
TOOL_STEP = "pai_weather__function_toolset__<agent>.call_tool:lookup"
STREAM_TOOL_STEP = "pai_stream__function_toolset__<agent>.call_tool:lookup"
MCP_SCRIPT = {
    "rules": [
        {
            "match": {"last_role": "user"},
            "reply": {"tool_calls": [{"name": "forecast", "arguments": {"city": "Paris"}}]},
        },
        {"match": {"last_role": "tool"}, "reply": {"text": "Rain in Paris tomorrow."}},
    ]
}
MCP_MODEL_STEP = "pai_mcp__model.request"
MCP_TOOL_STEP = "pai_mcp__mcp_server__tools.call_tool"


@functools.cache
def weather_agent() -> Any:
    """The agent, made on first use in the worker (the test process only starts runs)."""
    import openai
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from ratchet.integrations.pydantic_ai import RatchetDurability

    # The SDK's own retries off: the step's retry policy is the only one.
    client = openai.AsyncOpenAI(
        base_url=os.environ["CRASH_LLM_URL"] + "/v1", api_key=LLM_SECRET, max_retries=0
    )
    model = OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client))
    agent = Agent(
        model,
        name="pai_weather",
        instructions="Answer with the tools.",
        capabilities=[RatchetDurability()],
    )

    @agent.tool_plain
    async def lookup(city: str) -> dict[str, str]:
        """The weather in a city."""
        record("invoke")
        await gate("lookup")
        return {"city": city, "sky": "sunny"}

    return agent


@functools.cache
def stream_agent() -> Any:
    """The weather agent with a workflow-side event handler, made on first use."""
    import json
    from pathlib import Path

    import openai
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import ProcessEventStream
    from pydantic_ai.messages import PartDeltaEvent, PartStartEvent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from ratchet.integrations.pydantic_ai import RatchetDurability

    async def note(ctx: Any, stream: Any) -> None:
        async for event in stream:
            if isinstance(event, PartStartEvent):
                seen = ["start", event.index, event.part.part_kind]
            elif isinstance(event, PartDeltaEvent):
                delta = event.delta
                seen = [
                    "delta",
                    event.index,
                    getattr(delta, "content_delta", None) or getattr(delta, "args_delta", None),
                ]
            else:
                continue
            with Path(os.environ["CRASH_EVENTS"]).open("a") as f:
                f.write(json.dumps({"pid": os.getpid(), "event": seen}) + "\n")

    client = openai.AsyncOpenAI(
        base_url=os.environ["CRASH_LLM_URL"] + "/v1", api_key=LLM_SECRET, max_retries=0
    )
    model = OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client))
    agent = Agent(
        model, name="pai_stream", capabilities=[ProcessEventStream(note), RatchetDurability()]
    )

    @agent.tool_plain
    async def lookup(city: str) -> dict[str, str]:
        """The weather in a city."""
        record("invoke")
        await gate("lookup")
        return {"city": city, "sky": "sunny"}

    return agent


@functools.cache
def mcp_agent() -> Any:
    """The agent with the MCP server's tools, made on first use in the worker."""
    from pathlib import Path

    import mcp_servers
    import openai
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from ratchet.integrations.pydantic_ai import RatchetDurability

    if "CRASH_MCP_URL" in os.environ:
        toolset = mcp_servers.http_toolset(os.environ["CRASH_MCP_URL"])
    else:
        calls, gate = os.environ["CRASH_MCP_STDIO"].split("|")
        toolset = mcp_servers.stdio_toolset(Path(calls), Path(gate))
    client = openai.AsyncOpenAI(
        base_url=os.environ["CRASH_LLM_URL"] + "/v1", api_key=LLM_SECRET, max_retries=0
    )
    model = OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client))
    return Agent(model, name="pai_mcp", toolsets=[toolset], capabilities=[RatchetDurability()])


def build(
    url: str, *, lease_ttl: float | None = None, recovery_interval: float | None = None
) -> ratchet.Ratchet:
    """The app on database ``url``."""
    app = ratchet.Ratchet(url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)

    @app.workflow()
    async def pai_weather(text: str) -> str:
        result = await weather_agent().run(text)
        return str(result.output)

    @app.workflow()
    async def pai_stream(text: str) -> str:
        result = await stream_agent().run(text)
        return str(result.output)

    @app.workflow()
    async def pai_mcp(text: str) -> str:
        result = await mcp_agent().run(text)
        return str(result.output)

    return app


if __name__ == "__main__":
    # The agents' libraries, imported before the worker starts: imported by the first run,
    # they would hold its event loop, and so its lease renewals, for seconds.
    import fastmcp.client  # noqa: F401
    import openai  # noqa: F401
    import pydantic_ai.mcp
    import pydantic_ai.models.openai  # noqa: F401

    main(build)
