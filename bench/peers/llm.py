"""The LLM crash-bill measure: what a crash costs in model calls.

The agent is the same for every system: five chat completions through the official
``openai`` SDK, each one sent with the whole conversation so far (a system prompt, the
task, then each reply and the next instruction), so a later call carries more input
tokens than an earlier one, as an agent's do. Replies come from the local provider, which
runs in the bench's own process and counts what it bills.

``crash_bill(system)``: the system's agent runs in a child process that is SIGKILLed while
the provider holds its 4th call; a fresh process then resumes the run the way that
system's users would, and the bill of the whole, completed run is set against the bill of
the same agent run once without a crash (:func:`crash_free_bill`). The held call is still
answered and billed after the kill, as a real provider bills a request whose client went
away.

The wrapped client's per-call overhead is measured by :mod:`bench.llm_overhead`.

Adapters (``bench/peers/<system>_llm.py``) read the provider's address from
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``, as the SDK does for its users.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.common import last_json
from ratchet.llm.server import LocalProvider, serve

MODEL = "gpt-4.1-mini"
CALLS = 5
KILL_AT = 4  # the call the provider holds while the child is killed
# Long enough for the kill to land while the call is held; after it the held call is
# answered and billed, its client gone.
HOLD_S = 1.0
SYSTEMS = ("ratchet", "dbos", "langgraph")
ROOT = Path(__file__).resolve().parents[2]

SYSTEM_PROMPT = (
    "You are a travel-planning agent. Work through the task one step at a "
    "time, and say what you decided at each step."
)
TASK = (
    "Plan three days in Lisbon for two people in May: flights from Berlin, a hotel "
    "near Alfama under 180 EUR a night, one day trip, and a restaurant each evening."
)


# -- the agent's shape --------------------------------------------------------------------


def opening() -> list[dict[str, str]]:
    """The messages of the first call."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": TASK}]


def follow_up(turn: int) -> dict[str, str]:
    """The instruction sent after the reply to call ``turn`` (1-based, below CALLS)."""
    return {
        "role": "user",
        "content": f"Step {turn} is settled. Now do step {turn + 1} of "
        f"{CALLS}, keeping what was decided so far.",
    }


def after(turn: int, reply: str) -> list[dict[str, str]]:
    """The messages the conversation grows by once call ``turn`` has replied."""
    grown = [{"role": "assistant", "content": reply}]
    if turn < CALLS:
        grown.append(follow_up(turn))
    return grown


def run_agent(create: Callable[[list[dict[str, str]]], str]) -> str:
    """The agent loop for a synchronous ``create(messages) -> reply text``; returns the
    last reply."""
    messages, reply = opening(), ""
    for turn in range(1, CALLS + 1):
        reply = create(messages)
        messages = messages + after(turn, reply)
    return reply


# -- the bills ---------------------------------------------------------------------------


def bill(provider: LocalProvider) -> dict[str, int]:
    """What the provider received and billed."""
    s = provider.stats()
    return {
        "sent": s["received"],
        "calls": s["billed_calls"],
        "input_tokens": s["billed_input_tokens"],
        "output_tokens": s["billed_output_tokens"],
        "tokens": s["billed_input_tokens"] + s["billed_output_tokens"],
        "replayed": s["replayed"],
    }


def crash_free_bill() -> dict[str, Any]:
    """The agent run once, without a crash, by the bare SDK: the bill every system's
    crashed-and-resumed run is set against, and the answer it must end with."""
    import openai

    provider = LocalProvider()
    with serve(provider) as base, openai.OpenAI(base_url=f"{base}/v1", api_key="local") as client:

        def create(messages: list[dict[str, str]]) -> str:
            completion = client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
            return completion.choices[0].message.content or ""

        answer = run_agent(create)
    return bill(provider) | {"answer": answer}


def _env(base: str) -> dict[str, str]:
    return {**os.environ, "OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": "local"}


def _argv(system: str, measure: str, db: str, timeout: float, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        f"bench.peers.{system}_llm",
        measure,
        "--backend",
        "sqlite",
        "--db",
        db,
        "--timeout",
        str(timeout),
        *extra,
    ]


def _wait(
    what: str,
    done: Callable[[], bool],
    deadline: float,
    gone: Callable[[], str | None] = lambda: None,
) -> None:
    """Poll ``done`` until it holds; raise naming ``what`` at the deadline, or as soon as
    ``gone()`` says why it never will."""
    while not done():
        reason = gone()
        if reason is not None:
            raise RuntimeError(f"{what}: {reason}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within the timeout")
        time.sleep(0.002)


def crash_bill(system: str, db: str, timeout: float = 60.0) -> dict[str, Any]:
    """Kill ``system``'s agent run during call 4, resume it, and bill the completed run.

    Call 4 is held by a ``slow`` fault. The fault queue is FIFO per endpoint, so the slow
    fault is queued at the start behind three 1 ms ones that let calls 1–3 through: armed
    from here after call 3 was answered, it would race an engine that sends call 4 within
    a millisecond of call 3's answer.
    """
    try:
        return _crash_bill(system, db, timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}


def _crash_bill(system: str, db: str, timeout: float) -> dict[str, Any]:
    clean = crash_free_bill()
    provider = LocalProvider()
    provider.fail("slow", times=KILL_AT - 1, delay_s=0.001, endpoint="chat")
    provider.fail("slow", times=1, delay_s=HOLD_S, endpoint="chat")
    deadline = time.monotonic() + timeout
    with serve(provider) as base, tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        log_path = Path(tmp) / "crash.log"
        with open(log_path, "w") as log:
            child = subprocess.Popen(
                _argv(system, "llm-crash", db, timeout),
                cwd=ROOT,
                env=_env(base),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:

            def gone() -> str | None:
                if child.poll() is None:
                    return None
                return f"the crash run ended first: {log_path.read_text()[-400:]}"

            _wait(
                f"call {KILL_AT} of the {system} run",
                lambda: provider.stats()["received"] >= KILL_AT,
                deadline,
                gone,
            )
            child.send_signal(signal.SIGKILL)
            child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        sent_before_kill = provider.stats()["received"]
        started = time.monotonic()
        remaining = max(deadline - started, 1.0)
        done = subprocess.run(
            _argv(system, "llm-resume", db, remaining),
            cwd=ROOT,
            env=_env(base),
            capture_output=True,
            text=True,
            timeout=remaining + 10,
        )
        resume_s = time.monotonic() - started
        resumed = last_json(done.stdout, done.stderr)
        # The held call is answered (and billed) after its client is gone: wait for it.
        _wait(
            "the held call's answer",
            lambda: provider.stats()["requests"] >= provider.stats()["received"],
            deadline + HOLD_S,
        )
        billed = bill(provider)
        requests = [
            {"key": r["idempotency_key"], "billed": r["billed"], "replayed": r["replayed"]}
            for r in provider.requests()
        ]
    if "error" in resumed or "skipped" in resumed:
        return resumed
    if resumed.get("answer") != clean["answer"]:
        return {
            "error": f"the resumed {system} run answered {resumed.get('answer')!r}, "
            f"expected {clean['answer']!r}"
        }
    return {
        "system": system,
        **billed,
        "sent_before_kill": sent_before_kill,
        "clean_calls": clean["calls"],
        "clean_tokens": clean["tokens"],
        "calls_ratio": billed["calls"] / clean["calls"],
        "tokens_ratio": billed["tokens"] / clean["tokens"],
        "resume_ms": round(resume_s * 1000, 1),
        "resumed_by": resumed.get("resumed_by"),
        "requests": requests,
    }
