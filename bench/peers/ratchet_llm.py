"""Ratchet's LLM measures (see bench/peers/llm.py): the agent as a Ratchet user writes it,
``ratchet.llm.wrap(openai.AsyncOpenAI())`` called from a workflow, each model call a
journaled step sending its step's ``Idempotency-Key``.

``llm-crash`` starts the run and works it until the bench kills the process; ``llm-resume``
starts a worker with the killed one's id, which reclaims the run at once and re-drives it:
calls 1–3 come back from the journal, call 4 is sent again under the same key.
(The wrapped client's per-call overhead is bench/llm_overhead.py.)
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import openai

import ratchet
from bench.peers import llm
from bench.peers.common import Result, run, stable_id
from bench.peers.ratchet_peer import _with_worker

WORKER_ID = "bench-llm-worker"


def _app(args: argparse.Namespace) -> tuple[ratchet.Ratchet, ratchet.WorkflowDef]:
    app = ratchet.Ratchet(f"sqlite:///{args.db}", recovery_interval=0.5)
    client = ratchet.llm.wrap(openai.AsyncOpenAI())  # OPENAI_BASE_URL, OPENAI_API_KEY

    @app.workflow(name="agent")
    async def agent() -> str:
        messages, reply = llm.opening(), ""
        for turn in range(1, llm.CALLS + 1):
            completion = await client.chat.completions.create(
                model=llm.MODEL,
                messages=messages,  # type: ignore[arg-type]  # the SDK's TypedDicts
            )
            reply = completion.choices[0].message.content or ""
            messages = messages + llm.after(turn, reply)
        return reply

    return app, agent


def _run_id(args: argparse.Namespace) -> str:
    return stable_id("ratchet-llm", args.db)


def llm_crash(args: argparse.Namespace) -> Result:
    app, agent = _app(args)

    async def body() -> None:
        await app.start_async(agent, run_id=_run_id(args))
        await app.result_async(_run_id(args))  # the bench kills us during call 4

    asyncio.run(_with_worker(app, body, worker_id=WORKER_ID))
    return {"error": "the run finished; the process was not killed during its 4th call"}


def llm_resume(args: argparse.Namespace) -> Result:
    app, _ = _app(args)

    async def body() -> Any:
        return await app.result_async(_run_id(args), timeout_s=args.timeout)

    answer = asyncio.run(_with_worker(app, body, worker_id=WORKER_ID))
    return {
        "answer": answer,
        "resumed_by": "a worker with the killed worker's id reclaims the run at once",
    }


MEASURES = {"llm-crash": llm_crash, "llm-resume": llm_resume}

if __name__ == "__main__":
    run("ratchet", MEASURES)
