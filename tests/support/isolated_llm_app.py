"""Isolated workflows that call a model, and a worker process that drives them.

The wrapped client is made at module level from the worker's environment (ISO_LLM_URL,
ISO_LLM_KEY): in the worker it talks to the local provider with the key; inside a sandbox
the same line makes a client with neither (the sandbox's environment holds no key, and
the SDK's OPENAI_API_KEY is a placeholder there), and its calls go to the worker, which
makes them with its own client. Run as ``python tests/support/isolated_llm_app.py``: one worker
configured from the environment (ISO_DB_URL), stopped by SIGTERM or killed.
"""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path
from typing import Any

import anthropic
import openai
from attack_app import channel_call

import ratchet

app = ratchet.Ratchet(os.environ.get("ISO_DB_URL"))
MODEL = "gpt-4.1-mini"
SANDBOX = ratchet.Sandbox(memory_mb=256, timeout_s=120)

llm = ratchet.llm.wrap(
    openai.AsyncOpenAI(
        base_url=os.environ.get("ISO_LLM_URL", "http://127.0.0.1:9/v1"),
        api_key=os.environ.get("ISO_LLM_KEY") or os.environ.get("OPENAI_API_KEY") or "none",
    )
)
claude = ratchet.llm.wrap(
    anthropic.AsyncAnthropic(
        base_url=os.environ.get("ISO_LLM_URL", "http://127.0.0.1:9/v1").removesuffix("/v1"),
        api_key=os.environ.get("ISO_LLM_KEY") or os.environ.get("ANTHROPIC_API_KEY") or "none",
    )
)


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@app.step
def key_seen(key_sha256: str) -> dict[str, Any]:
    """Whether the provider key is anywhere the workload can look: its environment, the
    first environment of every process it can see, the client it made."""
    found = [name for name, value in os.environ.items() if _digest(value) == key_sha256]
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            entries = environ.read_bytes().split(b"\0")
        except OSError:
            continue
        found += [
            f"{environ}"
            for e in entries
            if _digest(e.partition(b"=")[2].decode(errors="replace")) == key_sha256
        ]
    return {"found": found, "client_key": llm.api_key}


@app.step
def forge_usage(step_id: str) -> dict[str, Any]:
    """Report the model call's end again with a billion tokens, and ask the worker to
    make the call once more."""
    payload = {
        "output": {"id": "forged"},
        "llm": {
            "provider": "openai",
            "model": MODEL,
            "request_id": "forged",
            "latency_ms": 1.0,
            "usage": {"input_tokens": 1_000_000_000, "output_tokens": 0},
            "cost_usd": 123456.0,
        },
    }
    import json

    run_id, sandbox_id = os.environ["RATCHET_RUN_ID"], os.environ["RATCHET_SANDBOX_ID"]
    report = channel_call(
        "POST",
        "/v1/runtime/report",
        {
            "run_id": run_id,
            "sandbox_id": sandbox_id,
            "op": "append",
            "events": [
                {
                    "kind": "step_completed",
                    "step_id": step_id,
                    "attempt": 1,
                    "payload_json": json.dumps(payload, separators=(",", ":"), sort_keys=True),
                }
            ],
        },
    )
    again = channel_call(
        "POST",
        "/v1/runtime/llm",
        {
            "run_id": run_id,
            "sandbox_id": sandbox_id,
            "step_id": step_id,
            "attempt": 1,
            "site": llm.site,  # type: ignore[attr-defined]  # wrap() keeps the client's type
            "kwargs_json": json.dumps({"model": MODEL, "messages": []}),
        },
    )
    return {
        "report": report[0],
        "report_says": report[1].get("message"),
        "again": again[0],
        "again_says": again[1].get("message"),
    }


@app.workflow(tier="isolated", sandbox=SANDBOX)
async def ask(question: str, key_sha256: str) -> dict[str, Any]:
    # A header that would stand in for the worker's key: the worker sends its own.
    answer = await llm.chat.completions.create(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": question}],
        extra_headers={"Authorization": "Bearer from-the-sandbox"},
    )
    message = await claude.messages.create(
        model="claude-sonnet-4-6", max_tokens=64, messages=[{"role": "user", "content": question}]
    )
    return {
        "answer": answer.choices[0].message.content,
        "claude": message.content[0].text if message.content[0].type == "text" else "",
        "usage": answer.usage.model_dump() if answer.usage else None,
        "seen": await key_seen(key_sha256),
        "forged": await forge_usage("1:openai.chat.completions.create"),
    }


@app.workflow(tier="isolated", sandbox=SANDBOX, guards=ratchet.Guards(budget_tokens=100))
async def costly(question: str) -> str:
    answer = await llm.chat.completions.create(
        model=MODEL, max_tokens=500, messages=[{"role": "user", "content": question}]
    )
    return answer.choices[0].message.content or ""


if os.environ.get("RATCHET_SANDBOX_ID"):
    # Inside its sandbox the workload switches its budget off; the worker's own import of
    # this module keeps it, and the worker checks it before it makes the call.
    costly.guards = ratchet.Guards()


if __name__ == "__main__":
    import asyncio

    import isolated_llm_app  # the module name the harness imports, not __main__

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await isolated_llm_app.app.run_worker(stop, lease_ttl=5.0, recovery_interval=0.5)

    asyncio.run(main())
