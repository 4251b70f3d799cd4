"""The demo's workflow: a support agent answering a ticket in six steps.

Every plain step invocation appends one JSON line ``{run_id, step, attempt,
idempotency_key, pid}`` to the file named by ``RATCHET_DEMO_LOG``, made durable before the
step returns, so the demo can count invocations across processes, including one killed
with SIGKILL. The fourth step is a model call through a wrapped OpenAI client, sent to the
local provider at ``RATCHET_DEMO_LLM_URL``: the provider's own request log counts what it
received and billed.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import ratchet
from ratchet.extras import require

app = ratchet.Ratchet()

MODEL = "gpt-4.1-mini"
#: What the demo's local provider answers the model call with.
REPLY = "Hi Ada, sorry about the double charge. We have refunded it (see kb/billing/refund-policy)."


def _log_path() -> str:
    path = os.environ.get("RATCHET_DEMO_LOG")
    if not path:
        raise ratchet.RatchetError("RATCHET_DEMO_LOG is not set: the demo's steps log there")
    return path


def invocations(path: str) -> list[dict[str, Any]]:
    """Every step invocation recorded so far (a line cut short by a kill is skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _record(step: str) -> bool:
    """Log this invocation; True when it is the step's first one in this run."""
    path = _log_path()
    info = ratchet.current_step()
    first = not any(
        entry["run_id"] == info.run_id and entry["step"] == step for entry in invocations(path)
    )
    line = json.dumps(
        {
            "run_id": info.run_id,
            "step": step,
            "step_id": info.step_id,
            "attempt": info.attempt,
            "idempotency_key": info.idempotency_key,
            "pid": os.getpid(),
        }
    )
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    return first


@app.step
async def fetch_ticket(ticket_id: str) -> dict[str, Any]:
    """Load the ticket from the help desk."""
    _record("fetch_ticket")
    return {"id": ticket_id, "customer": "Ada", "text": "I was charged twice for March."}


@app.step
async def classify(ticket: dict[str, Any]) -> str:
    """Route the ticket."""
    _record("classify")
    return "billing" if "charged" in ticket["text"] else "general"


@app.step
async def retrieve_docs(category: str) -> list[str]:
    """Find the help-center articles for the category."""
    _record("retrieve_docs")
    return [f"kb/{category}/duplicate-charges", f"kb/{category}/refund-policy"]


@functools.cache
def model_client() -> Any:
    """The wrapped OpenAI client of this worker, pointed at the demo's local provider."""
    url = os.environ.get("RATCHET_DEMO_LLM_URL")
    if not url:
        raise ratchet.RatchetError(
            "RATCHET_DEMO_LLM_URL is not set: the demo's model call "
            "goes to the local provider the demo starts"
        )
    require("the demo's model call", "openai")
    import openai

    return ratchet.llm.wrap(openai.AsyncOpenAI(base_url=url + "/v1", api_key="demo-local"))


async def draft_reply(ticket: dict[str, Any], docs: list[str]) -> str:
    """The model call: draft an answer from the ticket and the articles. Called in the
    workflow, it is a journaled LLM step whose key the provider sees as Idempotency-Key."""
    response = await model_client().chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "You answer support tickets briefly and kindly."},
            {
                "role": "user",
                "content": f"Ticket from {ticket['customer']}: {ticket['text']}\n"
                f"Articles: {', '.join(docs)}",
            },
        ],
    )
    return str(response.choices[0].message.content)


@app.step
async def review(draft: str) -> dict[str, Any]:
    """A second model call grades the draft."""
    _record("review")
    return {"approved": True, "score": 0.93}


@app.step
async def send_reply(ticket_id: str, draft: str) -> dict[str, Any]:
    """Post the reply to the customer."""
    _record("send_reply")
    return {"ticket": ticket_id, "sent": True, "chars": len(draft)}


@app.workflow()
async def answer_ticket(ticket_id: str) -> dict[str, Any]:
    """Answer a support ticket: six steps, the fourth a model call."""
    ticket = await fetch_ticket(ticket_id)
    category = await classify(ticket)
    docs = await retrieve_docs(category)
    draft = await draft_reply(ticket, docs)
    verdict = await review(draft)
    receipt = await send_reply(ticket_id, draft)
    return {
        "ticket": ticket_id,
        "category": category,
        "approved": verdict["approved"],
        "sent": receipt["sent"],
    }
