"""The workflows a chaos campaign drives, and the worker process that drives them.

``python -m chaos.app`` is one worker, configured from the environment and stopped by
SIGTERM (and usually killed with SIGKILL long before):

* ``CHAOS_DB_URL``, ``CHAOS_WORKER_ID``, ``CHAOS_CONCURRENCY``: the worker;
* ``CHAOS_RECEIVER_URL``: where ``send`` steps deliver;
* ``RATCHET_CRASH_AT``: a crash point the campaign armed (see ratchet.engine.faults).

Every run follows a *plan*, a list of five or so step kinds chosen by the campaign:
``work`` (a short computation), ``send`` (a delivery to the receiver through
``ratchet.deliver``), ``sleep:<seconds>`` (a durable sleep) and ``signal`` (a wait for the
signal ``go``, which the campaign sends). The plan is the run's input, so a re-drive
replays the same step sequence.
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

# The retry budget of each step name, which the checker holds attempts against.
SEND_RETRY = ratchet.Retry(max_attempts=4, backoff_ms=200, retry_on=("connector",))
MAX_ATTEMPTS = {"work": 1, "send": SEND_RETRY.max_attempts}


def _post(url: str, key: str, info: ratchet.StepInfo) -> Any:
    body = json.dumps({"run": info.run_id, "step": info.step_id}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json",
        "Idempotency-Key": key,
        "X-Ratchet-Run": info.run_id,
        "X-Ratchet-Step": info.step_id,
        "X-Ratchet-Epoch": str(info.lease_epoch),
    })
    try:
        with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        # The receiver unreachable (a partition) or an answer cut short: a connector
        # failure, which the step's retry policy covers.
        raise ratchet.ConnectorError(f"receiver: {e}") from e


def build(url: str, receiver_url: str | None = None) -> ratchet.Ratchet:
    """The campaign's application on database ``url``, delivering to ``receiver_url``."""
    app = ratchet.Ratchet(url, lease_ttl=LEASE_TTL, recovery_interval=RECOVERY_INTERVAL)

    @app.step
    async def work(i: int) -> str:
        """A computation: no side effect, just time."""
        # Mostly quick; one in five is slow (a model call, say), so that kills and pauses
        # often land while a step's code is running.
        slow = random.random() < 0.2
        await asyncio.sleep(random.uniform(0.3, 1.2) if slow else random.uniform(0.005, 0.03))
        return f"w{i}"

    @app.step(retry=SEND_RETRY)
    async def send(i: int) -> Any:
        """Deliver to the receiver under the step's idempotency key; its answer."""
        info = ratchet.current_step()
        if receiver_url is None:
            raise ratchet.ConnectorError("no receiver configured in this process")
        return await ratchet.deliver(
            lambda key: asyncio.to_thread(_post, receiver_url, key, info), policy="resend")

    @app.workflow()
    async def flow(plan: list[str]) -> list[Any]:
        """Follow ``plan``, one step per entry."""
        out: list[Any] = []
        for i, kind in enumerate(plan):
            if kind == "work":
                out.append(await work(i))
            elif kind == "send":
                out.append(await send(i))
            elif kind.startswith("sleep:"):
                await ratchet.sleep(float(kind.split(":", 1)[1]))
                out.append(None)
            elif kind == "signal":
                out.append(await ratchet.wait_for_signal("go"))
            else:
                raise ValueError(f"unknown plan step {kind!r}")
        return out

    return app


def main() -> None:
    """One worker process, until SIGTERM."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s pid=%(process)d %(name)s %(message)s")
    env = os.environ
    app = build(env["CHAOS_DB_URL"], env["CHAOS_RECEIVER_URL"])

    async def serve() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await app.run_worker(stop, worker_id=env["CHAOS_WORKER_ID"],
                             concurrency=int(env.get("CHAOS_CONCURRENCY", CONCURRENCY)))

    try:
        asyncio.run(serve())
    finally:
        app.shutdown()


if __name__ == "__main__":
    main()
