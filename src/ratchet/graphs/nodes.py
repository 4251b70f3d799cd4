"""What each node type does when the interpreter reaches it.

Pure nodes (trigger, condition, parallel, join, output) compute from the input and
earlier outputs, which the journal already holds, so they are not steps. The others are
steps named ``name`` (the node's id, prefixed by its loop iteration): a tool node is the
tool's step under the node's retry and timeout; an ai-step one LLM step through the app's
wrapped client (with tools, ``ratchet.Agent``'s loop of LLM and tool steps); a connector an
HTTP request step, or a delivery that claims its receipt first; a subagent a child run;
an approval ``Drive.await_approval``, whose timeout is an output (``outcome: timeout``) for the
node's edges to follow rather than a failure.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from ratchet.engine.approvals import STEP_PREFIX, approve_then_call
from ratchet.engine.definitions import StepDef, to_json
from ratchet.errors import ApprovalTimeout, InvalidInput, RatchetError
from ratchet.graphs import connectors, templates
from ratchet.graphs.validate import Node

if TYPE_CHECKING:
    from ratchet.graphs.walk import Scope, Walk


def single_step(node: Node) -> bool:
    """Whether the node takes at most one step ordinal, at once when it starts: such nodes
    of one wave run together (see the interpreter's docstring)."""
    if node.type in ("loop", "subagent"):
        return False
    # An ai-step with a gate may take more (a judge, an approval, a retry) once it answered.
    return not (node.type == "ai-step" and (node.data.tools or node.gate is not None))


def _json(value: Any, what: str) -> Any:
    return json.loads(to_json(value, what))


class Ready:
    """A node's output known without awaiting anything: a pure node's, or a finished tool
    node's from the journal."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def run_node(interp: Walk, node: Node, name: str, scope: Scope) -> Any:
    """The node's output as :class:`Ready`, or a coroutine for it; a step node's ordinal is
    taken here, now."""
    kind = node.type
    if kind == "trigger":
        return Ready(scope.input)
    if kind == "condition":
        return Ready(templates.evaluate(node.data.expression, scope.context()))
    if kind == "parallel":
        return Ready(None)
    if kind == "join":  # what each branch brought, by the node it came from
        return Ready(
            {e.source: scope.outputs.get(e.source) for e in interp.graph.in_edges.get(node.id, [])}
        )
    if kind == "output":
        return Ready(templates.render(node.data.value, scope.context()))
    if kind == "tool":
        return _tool(interp, node, name, scope)
    if kind == "connector":
        return _connector(interp, node, name, scope)
    if kind == "approval":
        return _approval(interp, node, name, scope)
    if kind == "ai-step":
        return _ai_step(interp, node, name, scope)
    if kind == "subagent":
        return _subagent(interp, node, name, scope)
    raise RatchetError(f"node {node.id}: no interpreter for type {kind!r}")


def _override(sd: StepDef, node: Node, name: str, **more: Any) -> StepDef:
    """The step as this node runs it: its name, and the node's retry and timeout if set."""
    retry = node.retry if node.data.retry is not None else sd.retry
    return dataclasses.replace(
        sd, name=name, retry=retry, timeout_s=node.timeout_s or sd.timeout_s, **more
    )


def _tool(interp: Walk, node: Node, name: str, scope: Scope) -> Any:
    ctx = interp.ctx
    step = ctx.take_completed(name)
    if step is not None:
        # Finished on an earlier drive: its output is the journal's, and its arguments
        # (templates are pure: the same scope renders the same) are built only if the
        # runaway-loop guard needs them.
        here = scope.frozen()
        ctx.guards.replayed_step(
            name, step.step_id, step.output, lambda: ((), tool_kwargs(interp, node, here))
        )
        return Ready(step.output)
    td = _tool_def(interp, node)
    kwargs = tool_kwargs(interp, node, scope)
    sd = _override(td.step, node, name, decode=lambda v: v)
    if td.requires_approval:
        coro = approve_then_call(interp.ctx, sd, td.name, td.arguments((), kwargs), (), kwargs)
    else:
        coro = interp.ctx.call_step(sd, (), kwargs)
    return _as_json(coro, f"the output of node {node.id}")


def _tool_def(interp: Walk, node: Node) -> Any:
    call = interp.app.tools.get(node.data.tool)
    if call is None:
        raise InvalidInput(f"node {node.id}: the app has no tool {node.data.tool!r}")
    return call.tool


def tool_kwargs(interp: Walk, node: Node, scope: Scope) -> dict[str, Any]:
    kwargs: dict[str, Any] = _tool_def(interp, node).bind(
        templates.render(node.data.args, scope.context())
    )
    return kwargs


async def _as_json(coro: Any, what: str) -> Any:
    return _json(await coro, what)


def _connector(interp: Walk, node: Node, name: str, scope: Scope) -> Any:
    d = node.data
    ctx = scope.context()
    request = {
        "kind": d.kind,
        "url": templates.render(d.url, ctx),
        "method": d.method,
        "headers": templates.render(d.headers, ctx),
        "body": templates.render(d.body, ctx),
        "to": templates.render(d.to, ctx),
        "subject": templates.render(d.subject, ctx),
        "sender": d.sender,
        "policy": d.policy,
    }
    sd = StepDef(
        connectors.send, name, node.retry, node.timeout_s, kind="connector", decode=lambda v: v
    )
    return interp.ctx.call_step(sd, (), {"request": request})


def _approval(interp: Walk, node: Node, name: str, scope: Scope) -> Any:
    ctx = interp.ctx
    what = node.data.name or node.id
    step_id, step = ctx.next_step(STEP_PREFIX + name)
    data = _json(
        templates.render(node.data.ask, scope.context()), f"the data of approval node {node.id}"
    )

    async def ask() -> Any:
        try:
            decision = await ctx.await_approval(step_id, step, what, data, node.timeout_s)
        except ApprovalTimeout:
            return {"outcome": "timeout", "approved": False, "by": None, "comment": None}
        return {
            "outcome": "approved" if decision.approved else "rejected",
            **_json(decision.as_dict(), "a decision"),
        }

    return ask()


def _ai_step(interp: Walk, node: Node, name: str, scope: Scope) -> Any:
    from ratchet.graphs.llm import ai_step

    return ai_step(interp, node, name, scope)


async def _subagent(interp: Walk, node: Node, name: str, scope: Scope) -> Any:
    d = node.data
    value = templates.render(d.input, scope.context())
    if d.workflow is not None:
        wd = interp.app.workflows.get(d.workflow)
        if wd is None:
            raise InvalidInput(f"node {node.id}: the app has no workflow {d.workflow!r}")
        if value is not None and not isinstance(value, dict):
            raise InvalidInput(
                f"node {node.id}: a workflow subagent's input is its keyword "
                f"arguments (a mapping), got {type(value).__name__}"
            )
        return _json(
            await interp.ctx.child(wd, (), dict(value or {}), None), f"the output of node {node.id}"
        )
    step = interp.ctx.upcoming()
    if step is not None and step.child_run_id is not None:
        # Journaled by an earlier drive: the child is found by its id, whatever version of
        # its graph is registered now.
        gwd = interp.subgraph(d.graph or "", "replayed")
    else:
        stored = await interp.ctx.get_graph(d.graph or "")
        if stored is None:
            raise RatchetError(f"node {node.id}: no graph {d.graph!r} is registered")
        gwd = interp.subgraph(stored.name, stored.version)
    return await interp.ctx.child(gwd, (value,), {}, None)
