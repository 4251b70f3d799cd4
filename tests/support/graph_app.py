"""Graphs for the crash tests, and the worker process that drives them
(``python tests/support/graph_app.py``, configured like ``crash_app``'s, plus ``CRASH_LLM_URL``:
the local provider the ai-steps talk to).

* ``enrich-accounts``: the example graph (examples/accounts.yaml), its tools logging each
  invocation;
* ``kid`` and ``parent``: a graph whose subagent node runs ``kid``, whose tool waits for
  the test's ``kid`` gate;
* ``routes``: loops (one repeating itself into a runaway-loop streak, one of a two-node
  chain, one with a branch in its body and an ``until``), a fan-out, a join and a branch
  on the outputs; its tools log each invocation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from crash_app import gate, main, record

import ratchet

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "accounts.yaml"
KID = {
    "name": "kid",
    "nodes": [
        {"id": "start", "type": "trigger"},
        {
            "id": "work",
            "type": "tool",
            "data": {"tool": "kid_work", "args": {"name": "{{ input.name }}"}},
        },
    ],
    "edges": [{"from": "start", "to": "work"}],
    "output": "{{ nodes.work.output }}",
}
PARENT = {
    "name": "parent",
    "nodes": [
        {"id": "start", "type": "trigger"},
        {
            "id": "child",
            "type": "subagent",
            "data": {"graph": "kid", "input": {"name": "{{ input.name }}"}},
        },
        {"id": "after", "type": "tool", "data": {"tool": "kid_work", "args": {"name": "after"}}},
    ],
    "edges": [{"from": "start", "to": "child"}, {"from": "child", "to": "after"}],
    "output": ["{{ nodes.child.output }}", "{{ nodes.after.output }}"],
}

ROUTES = {
    "name": "routes",
    # The streak of the first loop is recorded, and the run goes on (the default: 10, fail).
    "guards": {"runaway_repeats": 4, "actions": {"runaway_loop": "record"}},
    "nodes": [
        {"id": "start", "type": "trigger"},
        {
            "id": "same",
            "type": "loop",
            "data": {
                "over": "{{ input.same }}",
                "item": "v",
                "body": ["echo"],
                "max_iterations": 20,
            },
        },
        {"id": "echo", "type": "tool", "data": {"tool": "echo", "args": {"v": "{{ v }}"}}},
        {
            "id": "each",
            "type": "loop",
            "data": {
                "over": "{{ input.items }}",
                "item": "x",
                "body": ["double", "shift"],
                "max_iterations": 20,
            },
        },
        {"id": "double", "type": "tool", "data": {"tool": "double", "args": {"n": "{{ x }}"}}},
        {
            "id": "shift",
            "type": "tool",
            "data": {
                "tool": "shift",
                "args": {"n": "{{ nodes.double.output }}", "by": "{{ loop.index }}"},
            },
        },
        {"id": "fan", "type": "parallel"},
        {
            "id": "left",
            "type": "tool",
            "data": {"tool": "echo", "args": {"v": "{{ nodes.shift.output }}"}},
        },
        {
            "id": "right",
            "type": "tool",
            "data": {"tool": "double", "args": {"n": "{{ nodes.each.output | length }}"}},
        },
        {"id": "both", "type": "join"},
        {"id": "pick", "type": "condition", "data": {"expression": "nodes.left.output > 10"}},
        {"id": "big", "type": "tool", "data": {"tool": "echo", "args": {"v": "big"}}},
        {"id": "small", "type": "tool", "data": {"tool": "echo", "args": {"v": "small"}}},
        {
            "id": "tries",
            "type": "loop",
            "data": {
                "until": "loop.results | length >= 3",
                "body": ["probe", "odd"],
                "max_iterations": 5,
            },
        },
        {
            "id": "probe",
            "type": "tool",
            "data": {"tool": "double", "args": {"n": "{{ loop.index }}"}},
        },
        {
            "id": "odd",
            "type": "tool",
            "data": {"tool": "shift", "args": {"n": "{{ nodes.probe.output }}", "by": 1}},
        },
    ],
    "edges": [
        {"from": "start", "to": "same"},
        {"from": "same", "to": "echo"},
        {"from": "same", "to": "each"},
        {"from": "each", "to": "double"},
        {"from": "double", "to": "shift"},
        {"from": "each", "to": "fan"},
        {"from": "fan", "to": "left"},
        {"from": "fan", "to": "right"},
        {"from": "left", "to": "both"},
        {"from": "right", "to": "both"},
        {"from": "both", "to": "pick"},
        {"from": "pick", "to": "big", "when": "output"},
        {"from": "pick", "to": "small", "when": "not output"},
        {"from": "big", "to": "tries"},
        {"from": "small", "to": "tries"},
        {"from": "tries", "to": "probe"},
        {"from": "probe", "to": "odd", "when": "output % 4 == 2"},
    ],
    "output": {
        "same": "{{ nodes.same.output }}",
        "each": "{{ nodes.each.output }}",
        "both": "{{ nodes.both.output }}",
        "tries": "{{ nodes.tries.output }}",
    },
}


def build(
    url: str, *, lease_ttl: float | None = None, recovery_interval: float | None = None
) -> ratchet.Ratchet:
    """The app on database ``url``, its graphs registered."""
    app = ratchet.Ratchet(url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)

    @app.tool
    def load_accounts(names: list[str]) -> list[dict[str, Any]]:
        """The accounts to enrich."""
        record("invoke")
        return [{"id": i + 1, "name": name} for i, name in enumerate(names)]

    @app.tool
    def rank_accounts(
        accounts: list[dict[str, Any]], enriched: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Accounts with what the model said, biggest first."""
        record("invoke")
        rows = [{**a, **e} for a, e in zip(accounts, enriched, strict=True)]
        return sorted(rows, key=lambda r: (-r["employees"], r["name"]))

    @app.tool
    async def kid_work(name: str) -> str:
        """The child's work: waits for the test's gate the first time."""
        record("invoke")
        if name != "after":
            await gate("kid")
        return f"done {name}"

    @app.tool
    def echo(v: Any) -> Any:
        record("invoke")
        return v

    @app.tool
    def double(n: int) -> int:
        record("invoke")
        return 2 * n

    @app.tool
    def shift(n: int, by: int) -> int:
        record("invoke")
        return n + by

    if "CRASH_LLM_URL" in os.environ:
        import openai

        app.llm_client(
            openai.AsyncOpenAI(base_url=os.environ["CRASH_LLM_URL"] + "/v1", api_key="local")
        )
    app.graph(EXAMPLE)
    app.graph(KID)
    app.graph(PARENT)
    app.graph(ROUTES)
    return app


if __name__ == "__main__":
    main(build)
