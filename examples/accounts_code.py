"""The account workflow of examples/accounts.yaml written as code:
``python examples/accounts_code.py``. The same steps, in the same order, on the same
engine: tools, one structured LLM call per account, a summary, an approval, a forecast
whose first call times out and is retried, and a webhook delivered once behind its
receipt."""

from __future__ import annotations

import json
from typing import Any

import accounts_common as common
import httpx
import openai

import ratchet
from ratchet.llm.server import LocalProvider, serve

app = ratchet.Ratchet("sqlite:///.ratchet/examples.db")
ENRICHED = {
    "type": "object",
    "required": ["industry", "employees"],
    "properties": {
        "industry": {"type": "string"},
        "employees": {"type": "integer", "minimum": 1, "maximum": 5000},
    },
}


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


@app.step(retry=ratchet.Retry(max_attempts=3, backoff_ms=200, retry_on=["connector"]))
async def notify(url: str, body: dict[str, Any]) -> int:
    """Post the summary once: the receipt is claimed before the request goes out."""

    async def post(key: str) -> int:
        async with httpx.AsyncClient() as client:
            response = await client.post(url, json=body, headers={"Idempotency-Key": key})
        if response.status_code >= 500:
            raise ratchet.ConnectorError(f"{url} answered {response.status_code}")
        return response.status_code

    return int(await ratchet.deliver(post))


def workflow(base: str) -> ratchet.WorkflowDef:
    oai = ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key="local"))
    # The forecast's own policy: three seconds an attempt, retried on a timeout.
    patient = ratchet.llm.wrap(
        openai.AsyncOpenAI(base_url=base + "/v1", api_key="local"),
        retry={"maxAttempts": 3, "backoffMs": 200, "retryableClasses": ["timeout", "llm"]},
        timeout_s=3,
    )

    async def ask(client: Any, prompt: str, **more: Any) -> str:
        reply = await client.chat.completions.create(
            model="gpt-4.1-mini", messages=[{"role": "user", "content": prompt}], **more
        )
        return str(reply.choices[0].message.content)

    @app.workflow(name="enrich-accounts-code")
    async def enrich_accounts(accounts: list[str], webhook: str) -> dict[str, Any]:
        loaded = await load_accounts(accounts)
        enriched = [
            json.loads(
                await ask(
                    oai,
                    f"Industry and head count of {a['name']}?",
                    response_format={
                        "type": "json_schema",
                        "json_schema": {"name": "enrich", "schema": ENRICHED},
                    },
                )
            )
            for a in loaded
        ]
        ranked = await rank_accounts(loaded, enriched)
        summary = await ask(oai, f"Summarize for the sales team: {json.dumps(ranked)}")
        decision = await ratchet.approval(
            "send-summary", data={"summary": summary, "top": ranked[0]["name"]}
        )
        if not decision.approved:
            return {"top": ranked[0]["name"], "approved": False, "delivered": False}
        forecast = await ask(patient, f"Forecast next quarter for {ranked[0]['name']}.")
        status = await notify(
            webhook, {"summary": summary, "forecast": forecast, "approved_by": decision.by}
        )
        return {"top": ranked[0]["name"], "approved": True, "delivered": status == 200}

    return enrich_accounts


def main() -> None:
    provider = LocalProvider()
    receiver = common.Receiver()
    with serve(provider) as base, app:
        wf = workflow(base)
        app.launch()
        run_id = app.start(wf, ["Acme", "Globex", "Initech"], receiver.url)
        common.approve_and_report(app, run_id, provider, receiver)
    receiver.close()


if __name__ == "__main__":
    main()
