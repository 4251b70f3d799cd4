"""The ai-step node: one model call (or, with tools, an agent loop) through the app's
wrapped client (:meth:`ratchet.Ratchet.llm_client`; by default the SDK's own client from
its environment variables: Anthropic's for a ``claude`` model, OpenAI's otherwise)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from ratchet.errors import LLMError
from ratchet.graphs import templates
from ratchet.graphs.validate import Node

if TYPE_CHECKING:
    from ratchet.graphs.walk import Scope, Walk


def _text(provider: str, body: dict[str, Any]) -> str:
    if provider == "anthropic":
        return "".join(
            b.get("text", "") for b in body.get("content", []) if b.get("type") == "text"
        )
    return str(body["choices"][0]["message"].get("content") or "")


def _parse(node: Node, text: str | None) -> Any:
    if node.data.output_schema is None:
        return text
    try:
        return json.loads(text or "")
    except ValueError:
        raise LLMError(
            f"node {node.id}: the model's answer is not the JSON its "
            f"output_schema asks for: {str(text)[:200]!r}"
        ) from None


def ai_step(interp: Walk, node: Node, name: str, scope: Scope) -> Any:
    d = node.data
    ctx = scope.context()
    prompt = str(templates.render(d.prompt, ctx))
    system = templates.render(d.system, ctx) if d.system else None
    provider = d.provider or ("anthropic" if d.model.startswith("claude") else "openai")
    client = interp.app.llm_client_for(provider)
    if d.tools:
        return _agent(interp, node, client, prompt, system)
    if provider == "anthropic":
        call = client.messages.create
        kwargs: dict[str, Any] = {
            "model": d.model,
            "max_tokens": d.max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        }
        if system:
            kwargs["system"] = system
        if d.output_schema is not None:  # Anthropic's structured outputs
            kwargs["output_config"] = {"format": {"type": "json_schema", "schema": d.output_schema}}
    else:
        call = client.chat.completions.create
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        kwargs = {"model": d.model, "messages": messages, "max_tokens": d.max_tokens}
        if d.output_schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": node.id.replace("-", "_"), "schema": d.output_schema},
            }
    retry = node.retry if d.retry is not None else call.step.retry
    sd = dataclasses.replace(
        call.step,
        name=name,
        retry=retry,
        timeout_s=node.timeout_s or call.step.timeout_s,
        decode=lambda body: body,
    )
    if node.gate is not None:
        return _gated(interp, node, call, sd, kwargs, provider)
    step = interp.ctx.call_step(sd, (), kwargs, {"provider": provider, "model": d.model})

    async def answer() -> Any:
        return _parse(node, _text(provider, await step))

    return answer()


async def _gated(
    interp: Walk, node: Node, call: Any, sd: Any, kwargs: dict[str, Any], provider: str
) -> Any:
    """The ai-step under its confidence gate; with ``on_below: branch`` its output is
    ``{"answer": ..., "confidence": {"score", "threshold", "passed"}}`` for its edges."""
    from ratchet.llm.gate import apply
    from ratchet.llm.wrap import judge_call

    ctx = interp.ctx
    gate = node.gate
    judge_sd = dataclasses.replace(sd, name=f"{sd.name}.judge")

    async def step(kw: dict[str, Any], what: Any) -> tuple[str, dict[str, Any]]:
        step_id, journaled = ctx.next_step(what.name)
        body = await ctx.run_step(
            what, (), kw, step_id, journaled, {"provider": provider, "model": kw.get("model")}
        )
        return step_id, body

    async def retry(kw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return await step(kw, sd)

    async def judge(model: str, prompt: str) -> tuple[str, dict[str, Any]]:
        return await step(judge_call(call.endpoint, model, prompt), judge_sd)

    step_id, body = await step(kwargs, sd)
    verdict = await apply(ctx, gate, step_id, body, kwargs, retry, judge)
    answer = _parse(node, _text(provider, verdict.body))
    if gate.on_below == "branch":
        return {"answer": answer, "confidence": verdict.as_json(gate)}
    return answer


async def _agent(interp: Walk, node: Node, client: Any, prompt: str, system: Any) -> Any:
    from ratchet.llm.agent import Agent

    d = node.data
    agent = Agent(
        d.model,
        instructions=system,
        tools=[interp.app.tools[t] for t in d.tools],
        max_turns=d.max_turns,
        client=client,
        max_tokens=d.max_tokens,
        name=node.id,
    )
    result = await agent.run(prompt)
    return _parse(node, result.output)
