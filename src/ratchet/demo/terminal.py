"""``ratchet demo`` in the terminal: the run started and followed through the Python API.
See :mod:`ratchet.demo`."""

from __future__ import annotations

import asyncio
import os
import shlex
import time
import uuid
from typing import Any

from rich.console import Console
from rich.text import Text

from ratchet.app import Ratchet
from ratchet.demo.stage import (
    HOLD_S,
    WAIT_S,
    WORKER_ID,
    Demo,
    DemoFailed,
    Setup,
    demo_provider,
    prepare,
    report,
    verdict,
)
from ratchet.llm.server import LocalProvider, serve


def _lease(app: Ratchet, run_id: str) -> tuple[str | None, int, bool] | None:
    """The run's lease row: (worker id, epoch, still live by the database's clock)."""
    lease = asyncio.run(app.store.lease(run_id))
    return (lease.worker_id, lease.epoch, lease.live) if lease else None


def run_demo(db: str | None, console: Console) -> int:
    """Run the demo; 0 when every claim held, 1 otherwise."""
    setup = prepare(db, "demo")
    # The demo's own process reads and starts runs; the workflow is imported for app.start.
    from ratchet.demo import workflow

    app = workflow.app
    app.database_url = setup.url
    demo = Demo(console, setup.folder)
    console.print(
        Text("Ratchet crash-resume demo", style="bold"),
        Text(f"— a 6-step agent workflow on {setup.shown}", style="dim"),
    )
    provider = demo_provider(setup)
    try:
        with serve(provider) as base:
            setup.env["RATCHET_DEMO_LLM_URL"] = base
            demo.say(
                f"local model provider listening on {base} (request log "
                f"{os.path.relpath(setup.requests_path)})"
            )
            return _play(demo, app, setup, provider)
    except DemoFailed as e:
        return demo.failed(e)
    finally:
        demo.stop_all()
        app.shutdown()


def _play(demo: Demo, app: Ratchet, setup: Setup, provider: LocalProvider) -> int:
    from ratchet.demo.workflow import answer_ticket, invocations

    env, log_path = setup.env, setup.log_path

    say = demo.say
    # The first answer to the model call is held: worker 1 is killed while it waits.
    provider.fail("slow", times=1, delay_s=HOLD_S, endpoint="chat")
    w1 = demo.start_worker(env)
    say(
        f"worker 1 launched: ratchet worker ratchet.demo.workflow:app --worker-id {WORKER_ID} "
        f"(pid {w1.pid})"
    )
    run_id = f"ticket-4711-{uuid.uuid4().hex[:6]}"
    app.start(answer_ticket, "T-4711", run_id=run_id)
    say(f"run {run_id} queued: answer_ticket('T-4711')")

    def seen(step: str) -> list[dict[str, Any]]:
        return [e for e in invocations(log_path) if e["run_id"] == run_id and e["step"] == step]

    t_kill = demo.kill_mid_call(w1, provider, lambda: app.events(run_id))

    status = app.get(run_id).status
    lease = _lease(app, run_id)
    holder = (
        f"its lease (epoch {lease[1]}, {'unexpired' if lease[2] else 'expired'}) is "
        f"still held by {lease[0]}, the process just killed"
        if lease and lease[0]
        else "no lease is held"
    )
    say(f"run {run_id} is still {status}: {holder}")
    if status != "running" or not lease or lease[0] != WORKER_ID:
        raise DemoFailed(
            f"expected the run running under {WORKER_ID}'s lease after the kill, "
            f"found status {status} and lease {lease}"
        )

    w2 = demo.start_worker(env)
    say(
        f"worker 2 launched with the same worker id {WORKER_ID} (pid {w2.pid}): it reclaims "
        "the run at once instead of waiting for the lease to expire"
    )
    try:
        result = app.result(run_id, timeout_s=WAIT_S)
    except Exception as e:
        raise DemoFailed(f"the run did not succeed after the restart: {e}") from e
    t_done = time.monotonic()
    say(Text(f"run {run_id} succeeded, {t_done - t_kill:.2f}s after the kill", style="bold green"))
    demo.stop(w2)
    checks = report(
        demo.console,
        run_id,
        app.events(run_id),
        app.get(run_id).status,
        {w1.pid: 1, w2.pid: 2},
        invocations(log_path),
        provider.requests(),
    )
    return verdict(
        demo,
        checks,
        result,
        f"see the journal: ratchet --db {shlex.quote(setup.shown_url)} events {run_id}",
    )
