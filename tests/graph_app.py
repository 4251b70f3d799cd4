"""Graphs for the crash tests, and the worker process that drives them
(``python tests/graph_app.py``, configured like ``crash_app``'s, plus ``CRASH_LLM_URL``:
the local provider the ai-steps talk to).

* ``enrich-accounts``: the example graph (examples/accounts.yaml), its tools logging each
  invocation;
* ``kid`` and ``parent``: a graph whose subagent node runs ``kid``, whose tool waits for
  the test's ``kid`` gate.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from crash_app import gate, main, record

import ratchet

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "accounts.yaml"
KID = {"name": "kid", "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "work", "type": "tool", "data": {"tool": "kid_work",
                                            "args": {"name": "{{ input.name }}"}}}],
    "edges": [{"from": "start", "to": "work"}], "output": "{{ nodes.work.output }}"}
PARENT = {"name": "parent", "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "child", "type": "subagent", "data": {"graph": "kid",
                                                 "input": {"name": "{{ input.name }}"}}},
    {"id": "after", "type": "tool", "data": {"tool": "kid_work", "args": {"name": "after"}}}],
    "edges": [{"from": "start", "to": "child"}, {"from": "child", "to": "after"}],
    "output": ["{{ nodes.child.output }}", "{{ nodes.after.output }}"]}


def build(url: str, *, lease_ttl: float | None = None,
          recovery_interval: float | None = None) -> ratchet.Ratchet:
    """The app on database ``url``, its graphs registered."""
    app = ratchet.Ratchet(url, lease_ttl=lease_ttl, recovery_interval=recovery_interval)

    @app.tool
    def load_accounts(names: list[str]) -> list[dict[str, Any]]:
        """The accounts to enrich."""
        record("invoke")
        return [{"id": i + 1, "name": name} for i, name in enumerate(names)]

    @app.tool
    def rank_accounts(accounts: list[dict[str, Any]],
                      enriched: list[dict[str, Any]]) -> list[dict[str, Any]]:
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

    if "CRASH_LLM_URL" in os.environ:
        import openai

        app.llm_client(openai.AsyncOpenAI(base_url=os.environ["CRASH_LLM_URL"] + "/v1",
                                          api_key="local"))
    app.graph(EXAMPLE)
    app.graph(KID)
    app.graph(PARENT)
    return app


if __name__ == "__main__":
    main(build)
