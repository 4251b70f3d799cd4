"""An agent with a tool, on the local model provider: ``python examples/agent.py``.

The provider is scripted to ask for the weather tool first and answer after it, as a real
model would; each model turn and the tool call are journaled steps.
"""

from __future__ import annotations

import openai

import ratchet
from ratchet.llm.server import LocalProvider, serve

SCRIPT = {
    "rules": [
        {
            "match": {"last_role": "user"},
            "reply": {"tool_calls": [{"name": "weather", "arguments": {"city": "Paris"}}]},
        },
        {"match": {"last_role": "tool"}, "reply": {"text": "It is sunny in Paris."}},
    ]
}

app = ratchet.Ratchet("sqlite:///.ratchet/examples.db")


@app.tool(risk="low", timeout_s=30)
async def weather(city: str) -> dict[str, str]:
    """Today's weather in a city."""
    return {"city": city, "sky": "sunny"}


def main() -> None:
    with serve(LocalProvider(script=SCRIPT)) as base:
        oai = ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key="local"))

        @app.workflow()
        async def forecast(question: str) -> str | None:
            agent = ratchet.Agent(
                model="gpt-4.1-mini",
                client=oai,
                tools=[weather],
                instructions="Answer with the tools you have.",
            )
            return (await agent.run(question)).output

        with app:
            app.launch()
            run_id = app.start(forecast, "What is the weather in Paris?")
            print(app.result(run_id, timeout_s=30))
            for e in app.events(run_id):
                print(f"{e.seq:>3} {e.kind:<15} {e.step_id or ''}")


if __name__ == "__main__":
    main()
