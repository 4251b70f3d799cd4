"""Journal bytes of a long agent conversation: model requests content-addressed (each
distinct message once per run, see :mod:`ratchet.model.requests`) against every request
journaled whole.

``python -m bench.journal_size [--turns 200]`` runs, on SQLite, one workflow of ``turns``
model calls against the local provider (``ratchet.llm.server``): a system prompt and a first
question, then each turn appends the assistant's answer and a tool result or a user message
(every other turn), so turn ``i`` sends ``2i`` messages. It runs the same conversation twice,
a run each: as Ratchet journals it, and with every request journaled whole (each of its
messages in ``bodies``, nothing referenced), and reports for each the journal's bytes (the
sum of the stored payloads, as SQLite holds them), the bytes of the ``request`` fields
alone, and the messages sent. Nothing is estimated: both figures are the journal as written.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "gpt-4.1-mini"
SYSTEM = (
    "You are the support agent of a hardware shop. Answer in two sentences at most, quote "
    "the order number when there is one, never promise a refund before the order was "
    "checked, and hand over to a person when the customer asks for one. "
) * 3


def conversations(db: str, base: str, turn_counts: list[int]) -> dict[str, list[dict[str, Any]]]:
    """Run the conversation once for each of ``turn_counts``, each way, on the SQLite
    database ``db`` (one app, a run each); the size of each run's journal, by way."""
    import openai

    import ratchet
    import ratchet.engine.requests as journaled
    from ratchet.model import dumps

    app = ratchet.Ratchet(f"sqlite:///{db}")
    oai = ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-bench"))

    @app.workflow(name="long_agent", guards=ratchet.Guards(max_steps=None))
    async def long_agent(turns: int) -> int:
        messages: list[Any] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Where is my order 1042? It was due on Monday."},
        ]
        sent = 0
        for i in range(turns):
            reply = await oai.chat.completions.create(model=MODEL, messages=messages)
            sent += len(messages)
            messages.append(reply.choices[0].message.model_dump(exclude_unset=True))
            if i % 2:
                messages.append({"role": "user", "content": f"And what about item {i}?"})
            else:
                messages.append(
                    {"role": "user", "content": f"Tool lookup_order answered: shipped, step {i}"}
                )
        return sent

    out: dict[str, list[dict[str, Any]]] = {"content_addressed": [], "whole_requests": []}
    try:
        app.launch()
        for way, turns in [(w, t) for w in out for t in turn_counts]:
            began = time.perf_counter()
            journaled.WHOLE = way == "whole_requests"  # read by each request the run journals
            try:
                run_id = app.start(long_agent, turns)
                sent = app.result(run_id, timeout_s=600)
            finally:
                journaled.WHOLE = False
            seconds = time.perf_counter() - began
            requests = sum(
                len(dumps(e.payload["request"]).encode())
                for e in app.events(run_id)
                if "request" in e.payload
            )
            with sqlite3.connect(db) as conn:
                total, events = conn.execute(
                    "SELECT sum(length(CAST(payload AS BLOB))), count(*) FROM journal_events "
                    "WHERE run_id = ?",
                    (run_id,),
                ).fetchone()
            out[way].append(
                {
                    "turns": turns,
                    "journal_bytes": int(total),
                    "request_bytes": requests,
                    "events": int(events),
                    "messages_sent": int(sent),
                    "seconds": round(seconds, 2),
                }
            )
    finally:
        app.shutdown()
    return out


def measure_many(turn_counts: list[int], folder: Path) -> list[dict[str, Any]]:
    """The conversation of each of ``turn_counts`` turns journaled both ways: one result per
    count, as :func:`measure` gives it."""
    from ratchet.llm.server import LocalProvider, serve

    with serve(LocalProvider()) as base:
        ways = conversations(str(folder / "journal_size.db"), base, turn_counts)
    results = []
    for ca, wr in zip(ways["content_addressed"], ways["whole_requests"], strict=True):
        results.append(
            {
                "turns": ca["turns"],
                "content_addressed": ca,
                "whole_requests": wr,
                "journal_ratio": round(wr["journal_bytes"] / ca["journal_bytes"], 2),
                "request_ratio": round(wr["request_bytes"] / ca["request_bytes"], 2),
            }
        )
    return results


def measure(turns: int, folder: Path) -> dict[str, Any]:
    """The ``turns``-turn conversation journaled both ways, and how they compare."""
    return measure_many([turns], folder)[0]


def render(result: dict[str, Any]) -> str:
    ca, wr = result["content_addressed"], result["whole_requests"]
    lines = [
        f"{result['turns']}-turn agent, {ca['messages_sent']} messages sent in all",
        f"{'':20} {'journal bytes':>14} {'request bytes':>14} {'events':>7}",
    ]
    for name, r in (("content-addressed", ca), ("whole requests", wr)):
        lines.append(
            f"{name:20} {r['journal_bytes']:>14,} {r['request_bytes']:>14,} {r['events']:>7}"
        )
    lines.append(
        f"whole / content-addressed: journal {result['journal_ratio']}x, "
        f"requests {result['request_ratio']}x"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ratchet-journal-size-") as folder:
        result = measure(args.turns, Path(folder))
    print(json.dumps(result, indent=2) if args.json else render(result))


if __name__ == "__main__":
    main()
