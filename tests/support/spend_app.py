"""The workflows the spend crash tests drive (tests/test_spend_crash.py), in worker processes
run as ``python tests/support/spend_app.py`` (the worker of tests/support/crash_app.py):
model calls on the local provider at ``CRASH_LLM_URL`` under a token budget, a call retried
after a dropped connection with a backoff long enough to park, and runs with a deadline."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import crash_app
import openai
from crash_app import LLM_SECRET, gate, record

import ratchet

MODEL = "gpt-4.1-mini"
# Tokens a call of ask() may spend at most (max_tokens 1000 and a short prompt): the budget
# of `pair` holds one call in flight, not two.
BUDGET = 1500
DEADLINE_S = 5.0  # room to park before it (a park needs 2 s left), under load too


def client(retry: ratchet.Retry | None = None) -> Any:
    return ratchet.llm.wrap(
        openai.AsyncOpenAI(base_url=os.environ["CRASH_LLM_URL"] + "/v1", api_key=LLM_SECRET),
        retry=retry,
    )


async def ask(oai: Any, question: str) -> str:
    reply = await oai.chat.completions.create(
        model=MODEL, max_tokens=1000, messages=[{"role": "user", "content": question}]
    )
    return reply.choices[0].message.content or ""


def build(
    url: str, *, lease_ttl: float | None = None, recovery_interval: float | None = None
) -> ratchet.Ratchet:
    app = ratchet.Ratchet(url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)

    @app.step
    async def held(name: str) -> str:
        record("invoke")
        await gate(name)
        return name

    async def then_ask(oai: Any) -> str:
        await held("b")
        return await ask(oai, "question b")

    @app.workflow(guards=ratchet.Guards(budget_tokens=BUDGET))
    async def pair() -> list[str]:
        oai = client()
        return list(await asyncio.gather(ask(oai, "question a"), then_ask(oai)))

    @app.workflow
    async def dropped() -> str:
        # A backoff longer than a park's minimum: the run parks between the attempts.
        oai = client(ratchet.Retry(max_attempts=3, backoff_ms=2500, retry_on=["llm"]))
        return await ask(oai, "question d")

    @app.workflow
    async def waits_forever() -> Any:
        return await ratchet.wait_for_signal("never")

    @app.workflow(timeout_s=DEADLINE_S)
    async def parent_with_deadline() -> Any:
        await held("p")
        return await ratchet.child(waits_forever)

    @app.workflow(timeout_s=DEADLINE_S)
    async def step_with_deadline() -> str:
        return await held("never")

    return app


if __name__ == "__main__":
    crash_app.main(build)
