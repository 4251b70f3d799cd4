"""The workflows the crash tests drive, and the worker process that drives them.

Run as ``python tests/support/crash_app.py``: one worker, configured from the environment, that
stops on SIGTERM (and is usually killed with SIGKILL long before):

* ``CRASH_DB_URL``: the database; ``CRASH_WORKER_ID``, ``CRASH_LEASE_TTL``,
  ``CRASH_RECOVERY_INTERVAL``, ``CRASH_CONCURRENCY`` and, when set, ``CRASH_GRACE`` (the
  shutdown grace period, in seconds): the worker's settings;
* ``CRASH_LOG``: the invocation log. Every step invocation appends one JSON line (step id,
  attempt, idempotency key, lease epoch, pid) and fsyncs it, so the count survives a
  SIGKILL a moment later;
* ``CRASH_GATES``: a folder. A step told to block waits until the file named by its gate
  exists there; the test creates it when it is ready for the step to go on.

Imported, :func:`build` gives the test process the same workflows, to start runs, send
signals and read journals with.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any, Literal

import ratchet

GATE_POLL_S = 0.01


def record(event: str) -> ratchet.StepInfo:
    """Append what the running step is doing to the invocation log, durably."""
    info = ratchet.current_step()
    line = (
        json.dumps(
            {
                "event": event,
                "run_id": info.run_id,
                "step_id": info.step_id,
                "attempt": info.attempt,
                "idempotency_key": info.idempotency_key,
                "epoch": info.lease_epoch,
                "pid": os.getpid(),
                "at": time.time(),
            }
        )
        + "\n"
    )
    fd = os.open(os.environ["CRASH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return info


async def gate(name: str) -> None:
    """Wait until the test opens gate ``name``."""
    path = os.path.join(os.environ["CRASH_GATES"], name)
    while not os.path.exists(path):
        await asyncio.sleep(GATE_POLL_S)


def gate_sync(name: str) -> None:
    """:func:`gate` for a plain ``def`` step, on its thread."""
    path = os.path.join(os.environ["CRASH_GATES"], name)
    while not os.path.exists(path):
        time.sleep(GATE_POLL_S)


async def post(url: str, key: str) -> Any:
    """POST to the test's receiver with ``Idempotency-Key``; its JSON answer."""

    def call() -> Any:
        request = urllib.request.Request(
            url,
            data=b"{}",
            method="POST",
            headers={"Idempotency-Key": key, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    return await asyncio.to_thread(call)


# A step name longer than the run page's label column.
LONG_STEP = "summarize_the_quarterly_report_for_the_board_of_directors_in_three_short_paragraphs"


def build(
    url: str, *, lease_ttl: float | None = None, recovery_interval: float | None = None
) -> ratchet.Ratchet:
    """The crash tests' application on database ``url``."""
    app = ratchet.Ratchet(url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)

    @app.step
    async def work(i: int, block: bool = False) -> str:
        record("invoke")
        if block:
            await gate(f"step-{i}")
        return f"out-{i}"

    @app.workflow()
    async def chain(n: int = 5, block_at: list[int] | None = None) -> list[str]:
        blocked = set(block_at or ())
        return [await work(i, i in blocked) for i in range(1, n + 1)]

    @app.step
    def crunch(i: int) -> str:
        """A plain `def` step, on a thread no shutdown can stop: it blocks on gate sync-i."""
        record("invoke")
        gate_sync(f"sync-{i}")
        return f"crunched-{i}"

    @app.workflow()
    async def cruncher() -> list[str]:
        return [await crunch(1), await work(2)]

    @app.workflow()
    async def napper(seconds: float) -> list[str]:
        first = await work(1)
        await ratchet.sleep(seconds)
        return [first, await work(3)]

    @app.workflow()
    async def listener() -> list[Any]:
        first = await work(1)
        data = await ratchet.wait_for_signal("go")
        return [first, data, await work(3)]

    @app.workflow()
    async def approver(amount: int) -> list[Any]:
        first = await work(1)
        decision = await ratchet.approval("refund", data={"amount": amount})
        return [first, decision.approved, decision.by, await work(3)]

    @app.workflow()
    async def payout(amount: int) -> dict[str, Any]:
        decision = await ratchet.approval("payout", data={"amount": amount})
        return {"approved": decision.approved, "by": decision.by}

    @app.workflow()
    async def payout_parent(amount: int) -> list[Any]:
        first = await work(1)
        return [first, await ratchet.child(payout, amount), await work(3)]

    @app.step
    async def send(url: str, policy: Literal["resend", "at_most_once"], block_after: bool) -> Any:
        record("invoke")
        response = await ratchet.deliver(lambda key: post(url, key), policy=policy)
        if block_after:
            record("settled")
            await gate("after-settle")
        return response

    @app.workflow()
    async def courier(
        url: str, policy: Literal["resend", "at_most_once"] = "resend", block_after: bool = False
    ) -> Any:
        response = await send(url, policy, block_after)
        await work(2)
        return response

    @app.step(retry=ratchet.Retry(max_attempts=3, backoff_ms=50))
    async def flaky(succeed_on: int, block_on: int) -> str:
        info = record("invoke")
        if info.attempt == block_on:
            await gate(f"attempt-{info.attempt}")
        if info.attempt < succeed_on:
            raise ratchet.ToolError(f"attempt {info.attempt} failed")
        return f"ok on attempt {info.attempt}"

    @app.workflow()
    async def retrier(succeed_on: int, block_on: int) -> str:
        return await flaky(succeed_on, block_on)

    @app.step(name=LONG_STEP)
    async def long_named() -> str:
        return "ok"

    @app.workflow()
    async def long_names() -> str:
        return await long_named()

    @app.tool
    async def lookup(city: str) -> dict[str, Any]:
        """The weather in a city."""
        record("invoke")
        await gate("lookup")
        return {"city": city, "sky": "sunny"}

    @app.tool
    async def forecast(city: str) -> dict[str, Any]:
        """Tomorrow's weather in a city."""
        record("invoke")
        await gate("forecast")
        return {"city": city, "tomorrow": "rain"}

    @app.workflow()
    async def asker(n: int = 3) -> list[str]:
        oai = llm_client()
        answers = []
        for i in range(1, n + 1):
            reply = await oai.chat.completions.create(
                model="gpt-4.1-mini", messages=[{"role": "user", "content": f"question {i}"}]
            )
            answers.append(reply.choices[0].message.content)
        return answers

    @app.workflow()
    async def agent_run(text: str, max_turns: int = 6) -> list[Any]:
        agent = ratchet.Agent(
            model="gpt-4.1-mini",
            instructions="Answer with the tools.",
            tools=[lookup],
            client=llm_client(),
            max_turns=max_turns,
        )
        result = await agent.run(text)
        return [result.output, result.turns]

    @app.workflow()
    async def agent_pair(text: str) -> list[Any]:
        agent = ratchet.Agent(
            model="gpt-4.1-mini", tools=[lookup, forecast], client=llm_client(), max_turns=3
        )
        result = await agent.run(text)
        tools = [m["content"] for m in result.messages if m["role"] == "tool"]
        return [result.output, tools]

    async def prompted_body() -> list[Any]:
        # The system prompt is the worker's (CRASH_PROMPT): a worker started with another
        # is code that changed under the run.
        oai = llm_client()
        messages: list[Any] = [
            {"role": "system", "content": os.environ.get("CRASH_PROMPT", "You are terse.")},
            {"role": "user", "content": "question 1"},
        ]
        first = await oai.chat.completions.create(model="gpt-4.1-mini", messages=messages)
        held = await work(2, block=True)  # the worker is killed here
        messages += [first.choices[0].message, {"role": "user", "content": "question 2"}]
        second = await oai.chat.completions.create(model="gpt-4.1-mini", messages=messages)
        return [first.choices[0].message.content, held, second.choices[0].message.content]

    @app.workflow()
    async def prompted() -> list[Any]:
        return await prompted_body()

    @app.workflow(request_drift="warn")
    async def prompted_warn() -> list[Any]:
        return await prompted_body()

    return app


def llm_client() -> Any:
    """An OpenAI client on the local provider at ``CRASH_LLM_URL``, wrapped. The key is a
    made-up secret the tests look for in the journal."""
    import openai

    return ratchet.llm.wrap(
        openai.AsyncOpenAI(base_url=os.environ["CRASH_LLM_URL"] + "/v1", api_key=LLM_SECRET)
    )


LLM_SECRET = "sk-test-secret-4c1d"


def main(build_app: Callable[..., ratchet.Ratchet] | None = None) -> None:
    """The worker: the app ``build_app`` (default :func:`build`) makes, served until SIGTERM."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s pid=%(process)d %(name)s %(message)s",
    )
    env = os.environ
    app = (build_app or build)(
        env["CRASH_DB_URL"],
        lease_ttl=float(env["CRASH_LEASE_TTL"]),
        recovery_interval=float(env["CRASH_RECOVERY_INTERVAL"]),
    )

    options: dict[str, Any] = {}
    if "CRASH_GRACE" in env:
        options["grace"] = float(env["CRASH_GRACE"])

    async def serve() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await app.run_worker(
            stop,
            worker_id=env["CRASH_WORKER_ID"],
            concurrency=int(env["CRASH_CONCURRENCY"]),
            **options,
        )

    try:
        asyncio.run(serve())
    finally:
        app.shutdown()


if __name__ == "__main__":
    main()
