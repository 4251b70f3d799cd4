"""The ten-node account graph (examples/accounts.yaml), on the local model provider:
``python examples/accounts_graph.py``.

The run enriches each account with a model (structured output), ranks them, writes a
summary and parks on an approval. This script then makes the provider slow for one call
and approves as "ana": the forecast node times out, is retried under the same key (billed
once) and succeeds, and the summary goes to a webhook once, behind its receipt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import accounts_common as common
import openai

import ratchet
from ratchet.llm.server import LocalProvider, serve

app = ratchet.Ratchet("sqlite:///.ratchet/examples.db")


@app.tool
def load_accounts(names: list[str]) -> list[dict[str, Any]]:
    """The accounts to enrich."""
    return common.load_accounts(names)


@app.tool
def rank_accounts(
    accounts: list[dict[str, Any]], enriched: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Accounts with what the model said, biggest first."""
    return common.rank_accounts(accounts, enriched)


def main() -> None:
    provider = LocalProvider()
    receiver = common.Receiver()
    with serve(provider) as base, app:
        app.llm_client(openai.AsyncOpenAI(base_url=base + "/v1", api_key="local"))
        app.graph(Path(__file__).with_name("accounts.yaml"))
        app.launch()
        run_id = app.start(
            "enrich-accounts", {"accounts": ["Acme", "Globex", "Initech"], "webhook": receiver.url}
        )
        common.approve_and_report(app, run_id, provider, receiver)
    receiver.close()


if __name__ == "__main__":
    main()
