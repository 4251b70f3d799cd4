"""The workflows a chaos campaign drives, and the worker process that drives them.

``python -m chaos.app`` is one worker, configured from the environment and stopped by
SIGTERM (and usually killed with SIGKILL long before):

* ``CHAOS_DB_URL``, ``CHAOS_WORKER_ID``, ``CHAOS_CONCURRENCY``: the worker;
* ``CHAOS_RECEIVER_URL``: where the sending steps deliver;
* ``CHAOS_APP_VERSION``: ``1``, or ``2`` for the new release of a rolling deploy, which
  also registers workflow ``audit`` (at version "2"); version-1 workers must leave its
  runs to version-2 ones;
* ``RATCHET_CRASH_AT``: a crash point the campaign armed (see ratchet.engine.faults).

Every run follows a *plan*, a list of step kinds chosen by the campaign:

* ``work``: a short computation; ``send``: a delivery to the receiver through
  ``ratchet.deliver``; ``sleep:<s>``: a durable sleep; ``signal``: a wait for the signal
  ``go``, which the campaign sends;
* ``par_signal``: a step and a wait for signal ``go<i>`` side by side (``asyncio.gather``);
  ``par_sleep:<s>``: a send and a durable sleep side by side. The run may park only once
  the step beside the wait is journaled;
* ``send2``: one step, two deliveries (one unnamed, one named ``copy``);
* ``flaky_send:<k>``: a step that delivers, then fails its first ``k`` attempts with a
  ConnectorError; each retry must get the settled delivery back, not send it again;
* ``children:<n>[:<ticks>]``: ``n`` child runs of workflow ``leaf`` at once (``ticks``
  quick steps, a step and a send);
* ``spin:<n>``: ``n`` quick steps in a loop, so that a cancel finds the run busy.

The plan is the run's input, so a re-drive replays the same step sequence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import sys
import urllib.error
import urllib.request
from typing import Any

import ratchet

LEASE_TTL = 2.0
RECOVERY_INTERVAL = 0.5
CONCURRENCY = 8
POST_TIMEOUT_S = 5.0
# Workflows only version-2 workers register, and the workers that do.
V2_ONLY = ("audit",)
V2_SLOT = 2  # the worker slot that runs the new release (slot 0 is the partitioned one)
ISOLATED = ("boxed",)  # workflows whose every attempt runs in a sandbox

# The retry budget of each step name, which the checker holds attempts against.
SEND_RETRY = ratchet.Retry(max_attempts=4, backoff_ms=200, retry_on=("connector",))
# Its own failures (up to 2) come on top of what faults cost.
FLAKY_RETRY = ratchet.Retry(max_attempts=6, backoff_ms=200, retry_on=("connector",))
MAX_ATTEMPTS = {
    "work": 1,
    "tick": 1,
    "send": SEND_RETRY.max_attempts,
    "send2": SEND_RETRY.max_attempts,
    "flaky_send": FLAKY_RETRY.max_attempts,
}
# How many deliveries each sending step makes; its output holds their answers.
DELIVERIES = {"send": 1, "send2": 2, "flaky_send": 1}


def _post(url: str, key: str, info: ratchet.StepInfo, delivery: str) -> Any:
    body = json.dumps({"run": info.run_id, "step": info.step_id}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": key,
            "X-Ratchet-Run": info.run_id,
            "X-Ratchet-Step": info.step_id,
            "X-Ratchet-Delivery": delivery,
            "X-Ratchet-Epoch": str(info.lease_epoch),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        # The receiver unreachable (a partition) or an answer cut short: a connector
        # failure, which the step's retry policy covers.
        raise ratchet.ConnectorError(f"receiver: {e}") from e


# The isolated workflow: module-level, so the harness can import it inside each sandbox.
# Its steps are computations only (a sandbox has no network and cannot park a run).
_boxed_steps = ratchet.Ratchet("sqlite:///:memory:")


@_boxed_steps.step
async def boxed_work(i: int) -> str:
    """A computation inside the sandbox; one in five is slow, so kills land mid-step."""
    slow = random.random() < 0.2
    await asyncio.sleep(random.uniform(0.3, 1.2) if slow else random.uniform(0.005, 0.03))
    return f"b{i}"


@_boxed_steps.workflow(tier="isolated", sandbox=ratchet.Sandbox(memory_mb=256, timeout_s=60))
async def boxed(plan: list[str]) -> list[Any]:
    """An isolated run: each ``work`` or ``spin:<n>`` entry of its plan, in a sandbox."""
    out: list[Any] = []
    for i, entry in enumerate(plan):
        kind, _, arg = entry.partition(":")
        if kind == "spin":
            out.append([await boxed_work(100 * i + j) for j in range(int(arg))])
        else:
            out.append(await boxed_work(i))
    return out


def build(url: str, receiver_url: str | None = None, version: str = "1") -> ratchet.Ratchet:
    """The campaign's application on database ``url``, delivering to ``receiver_url``;
    ``version`` "2" adds the workflows of :data:`V2_ONLY`."""
    app = ratchet.Ratchet(url, lease_ttl=LEASE_TTL, recovery_interval=RECOVERY_INTERVAL)

    async def to_receiver(delivery: str, name: str | None = None) -> Any:
        info = ratchet.current_step()
        if receiver_url is None:
            raise ratchet.ConnectorError("no receiver configured in this process")
        return await ratchet.deliver(
            lambda key: asyncio.to_thread(_post, receiver_url, key, info, delivery),
            policy="resend",
            name=name,
        )

    @app.step
    async def work(i: int) -> str:
        """A computation: no side effect, just time."""
        # Mostly quick; one in five is slow (a model call, say), so that kills and pauses
        # often land while a step's code is running.
        slow = random.random() < 0.2
        await asyncio.sleep(random.uniform(0.3, 1.2) if slow else random.uniform(0.005, 0.03))
        return f"w{i}"

    @app.step
    async def tick(i: int) -> int:
        """A quick step of a busy loop."""
        await asyncio.sleep(random.uniform(0.005, 0.02))
        return i

    @app.step(retry=SEND_RETRY)
    async def send(i: int) -> Any:
        """Deliver to the receiver under the step's idempotency key; its answer."""
        return await to_receiver("#1")

    @app.step(retry=SEND_RETRY)
    async def send2(i: int) -> list[Any]:
        """Two deliveries in one step: the first unnamed, the second named."""
        return [await to_receiver("#1"), await to_receiver("copy", name="copy")]

    @app.step(retry=FLAKY_RETRY)
    async def flaky_send(i: int, fail_attempts: int) -> Any:
        """Deliver, then fail the step's first ``fail_attempts`` attempts: a retry must get
        the delivery's stored answer back instead of sending it again."""
        answer = await to_receiver("#1")
        if ratchet.current_step().attempt <= fail_attempts:
            raise ratchet.ConnectorError("failed after delivering (on purpose)")
        return answer

    @app.workflow()
    async def leaf(i: int, ticks: int = 0) -> list[Any]:
        """A child run: a computation (after ``ticks`` quick steps) and a delivery."""
        for j in range(ticks):
            await tick(j)
        return [await work(i), await send(i)]

    async def follow(plan: list[str]) -> list[Any]:
        out: list[Any] = []
        for i, entry in enumerate(plan):
            kind, _, arg = entry.partition(":")
            if kind == "work":
                out.append(await work(i))
            elif kind == "send":
                out.append(await send(i))
            elif kind == "sleep":
                await ratchet.sleep(float(arg))
                out.append(None)
            elif kind == "signal":
                out.append(await ratchet.wait_for_signal("go"))
            elif kind == "par_signal":
                out.append(list(await asyncio.gather(work(i), ratchet.wait_for_signal(f"go{i}"))))
            elif kind == "par_sleep":
                out.append((await asyncio.gather(send(i), ratchet.sleep(float(arg))))[0])
            elif kind == "send2":
                out.append(await send2(i))
            elif kind == "flaky_send":
                out.append(await flaky_send(i, int(arg)))
            elif kind == "children":
                n, _, ticks = arg.partition(":")
                out.append(
                    list(
                        await asyncio.gather(
                            *(
                                ratchet.child(leaf, 10 * i + j, int(ticks or 0))
                                for j in range(int(n))
                            )
                        )
                    )
                )
            elif kind == "spin":
                out.append(sum([await tick(j) for j in range(int(arg))]))
            else:
                raise ValueError(f"unknown plan step {entry!r}")
        return out

    @app.workflow()
    async def flow(plan: list[str]) -> list[Any]:
        """Follow ``plan``, one entry after the other."""
        return await follow(plan)

    # As chaos.app, not __main__: the harness imports the module by that name.
    from chaos.app import boxed as isolated

    app.workflows[isolated.name] = isolated

    if version == "2":

        @app.workflow(version="2")
        async def audit(plan: list[str]) -> list[Any]:
            """The new release's workflow: only version-2 workers have it."""
            return await follow(plan)

    return app


def main() -> None:
    """One worker process, until SIGTERM."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s pid=%(process)d %(name)s %(message)s",
    )
    env = os.environ
    app = build(env["CHAOS_DB_URL"], env["CHAOS_RECEIVER_URL"], env.get("CHAOS_APP_VERSION", "1"))

    async def serve() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await app.run_worker(
            stop,
            worker_id=env["CHAOS_WORKER_ID"],
            concurrency=int(env.get("CHAOS_CONCURRENCY", CONCURRENCY)),
        )

    try:
        asyncio.run(serve())
    finally:
        app.shutdown()


if __name__ == "__main__":
    main()
