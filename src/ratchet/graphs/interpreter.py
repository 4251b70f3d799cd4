"""The graph interpreter: a workflow like any other, whose nodes run as its steps.

A graph run is a run of workflow ``<graph name>`` at version ``<content hash>``; the
interpreter loads that version (never a newer one) and walks it from the trigger on the
drive's own journal, leases, retries and receipts. Every side-effecting node (ai-step,
tool, connector, subagent, approval) is a step named after the node (``3:enrich``; in a
loop, after its iteration: ``7:review#2/summarize``), so a re-drive returns each finished
node's journaled output and never invokes it again, and a re-drive of a finished graph
writes nothing (the driver's rule for every run).

The walk is in waves, so the journal's step order is the same on every drive: each wave
takes the nodes whose incoming edges are all decided, in file order. Nodes that are one
step each run at once (``asyncio.gather``: their step ordinals are taken in that order
before any of them awaits); nodes that are many steps (a loop, an ai-step with tools, a
subagent, which looks up its graph first) run after them, one at a time. A node runs when
at least one incoming edge was taken; when none was (a branch not chosen), it is skipped,
and so are the nodes only it leads to.

A re-drive walks what it finished cheaply: a finished tool node's output comes from the
journal without its call being built (``nodes``), and a loop whose body has one route
takes its finished iterations in one pass (``fast_forward``), so a resume costs little
more than reading the journal, however many iterations it finished.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ratchet.engine.context import require_run
from ratchet.errors import RatchetError, RetryClass
from ratchet.graphs import fast_forward, templates
from ratchet.graphs.compiled import graph_for_run
from ratchet.graphs.fast_forward import Route
from ratchet.graphs.nodes import Ready, run_node, single_step
from ratchet.graphs.validate import Graph, Node
from ratchet.graphs.walk import GraphApp, Scope
from ratchet.model import AnomalyKind, GuardAction

if TYPE_CHECKING:
    from ratchet.engine.definitions import WorkflowDef
    from ratchet.engine.drive import Drive

# The workflow of graph (name, version), for a subgraph's child run.
Subgraphs = Callable[[str, str], "WorkflowDef"]


class GraphFailed(RatchetError):
    """A graph could not go on: a loop ran past its max_iterations, a template failed."""

    retry_class = RetryClass.NEVER


class Interpreter:
    """One drive's walk of one graph."""

    def __init__(self, app: GraphApp, ctx: Drive, graph: Graph, subgraphs: Subgraphs) -> None:
        self.app = app
        self.ctx = ctx
        self.graph = graph
        self.subgraphs = subgraphs
        self.order = {n: i for i, n in enumerate(graph.nodes)}
        self.reads_results = _reads_results(graph.definition)
        self.routes: dict[str, Route | None] = {}  # loop -> its body's one route, if any

    async def run(self, input: Any) -> Any:
        scope = Scope(input)
        top = [n for n in self.graph.nodes if n not in self.graph.loop_of]
        last = await self.walk(top, [self.graph.trigger], "", scope)
        if self.graph.output is not None:
            return templates.render(self.graph.output, scope.context())
        return last

    async def walk(self, members: list[str], entry: list[str], prefix: str, scope: Scope) -> Any:
        """Run ``members`` (the top level, or one iteration of a loop's body) from
        ``entry``; return the output of the last node that ran (an output node's value)."""
        inside = set(members)
        order = self.order
        state: dict[str, str] = {}  # node -> "done" | "skipped"
        taken: dict[tuple[str, str], bool] = {}
        last: Any = None
        while True:
            ready = [
                n
                for n in sorted(inside - set(state), key=order.__getitem__)
                if n in entry or self._decided(n, inside, state)
            ]
            if not ready:
                return last
            run, skip = [], []
            for n in ready:
                edges = self.incoming(n, inside)
                if n in entry or any(taken.get((e.source, e.target)) for e in edges):
                    run.append(n)
                else:
                    skip.append(n)
            for n in skip:
                state[n] = "skipped"
            single = [n for n in run if single_step(self.graph.nodes[n])]
            many = [n for n in run if n not in single]
            # Every single-step node is started (its ordinal taken) before any is awaited.
            started = [run_node(self, self.graph.nodes[n], prefix + n, scope) for n in single]
            done = await _settled(single, started)
            for n in many:
                done.append((n, await self._node(self.graph.nodes[n], prefix, scope)))
            for n, output in done:
                scope.outputs[n] = output
                state[n] = "done"
                last = output
            for n, output in done:
                for e in self.graph.out_edges.get(n, []):
                    if e.target in inside:
                        taken[(n, e.target)] = e.when is None or bool(
                            templates.evaluate(e.when, scope.context(output))
                        )
            for n in skip:
                for e in self.graph.out_edges.get(n, []):
                    taken[(n, e.target)] = False

    def incoming(self, n: str, inside: set[str]) -> list[Any]:
        # A loop body's edges back to its loop close an iteration; they do not feed it.
        return [
            e
            for e in self.graph.in_edges.get(n, [])
            if e.source in inside and self.graph.loop_of.get(e.source) != e.target
        ]

    def subgraph(self, name: str, version: str) -> WorkflowDef:
        """The interpreter as the workflow of graph ``name`` at ``version``, for a child run."""
        return self.subgraphs(name, version)

    def _decided(self, n: str, inside: set[str], state: Mapping[str, str]) -> bool:
        edges = self.incoming(n, inside)
        return bool(edges) and all(e.source in state for e in edges)

    async def _node(self, node: Node, prefix: str, scope: Scope) -> Any:
        if node.type == "loop":
            return await self._loop(node, prefix, scope)
        started = run_node(self, node, prefix + node.id, scope)
        return started.value if isinstance(started, Ready) else await started

    async def _loop(self, node: Node, prefix: str, scope: Scope) -> Any:
        d = node.data
        body = list(d.body)
        inside = set(body)
        entry = [
            b
            for b in body
            if not any(
                e.source in inside
                for e in self.graph.in_edges.get(b, [])
                if self.graph.loop_of.get(e.source) != e.target
            )
        ]
        items: list[Any] | None = None
        if d.over is not None:
            value = templates.render(d.over, scope.context())
            if not isinstance(value, list):
                raise GraphFailed(f"loop {node.id}: over gave {type(value).__name__}, not a list")
            if len(value) > d.max_iterations:
                raise GraphFailed(
                    f"loop {node.id}: {len(value)} items is more than its "
                    f"max_iterations ({d.max_iterations})"
                )
            items = value
        results: list[Any] = []
        index = 0
        if items is not None:
            if node.id not in self.routes:
                self.routes[node.id] = fast_forward.route(self, node, entry)
            plan = self.routes[node.id]
            if plan is not None:
                index = fast_forward.skip_finished(self, node, plan, prefix, scope, items, results)
        while True:
            if items is not None and index >= len(items):
                return results
            if index >= d.max_iterations:
                # A loop that never converged: journaled as a runaway loop, and the run
                # fails as it always did (or as the guard's fail says).
                runaway = AnomalyKind.RUNAWAY_LOOP
                fail = self.ctx.guards.g.action(runaway) == GuardAction.FAIL
                action = GuardAction.FAIL if fail else GuardAction.RECORD
                await self.ctx.guards.trip(
                    runaway,
                    f"runaway_loop:{prefix}{node.id}",
                    None,
                    {"loop": prefix + node.id, "max_iterations": d.max_iterations},
                    action,
                )
                raise GraphFailed(
                    f"loop {node.id}: its until condition {d.until!r} was still "
                    f"false after max_iterations ({d.max_iterations})"
                )
            loop = {
                "index": index,
                "item": items[index] if items is not None else None,
                "results": list(results) if self.reads_results else results,
            }
            inner = scope.inner(loop, d.item)
            result = await self.walk(body, entry, f"{prefix}{node.id}#{index}/", inner)
            results.append(result)
            for b in body:  # the latest iteration's outputs, for the nodes after the loop
                if b in inner.outputs:
                    scope.outputs[b] = inner.outputs[b]
            index += 1
            if d.until is not None:
                loop = {
                    "index": index - 1,
                    "last": result,
                    "results": list(results) if self.reads_results else results,
                }
                check = scope.inner(loop, d.item).context(result)
                check["nodes"] = {k: {"output": v} for k, v in inner.outputs.items()}
                if templates.evaluate(d.until, check):
                    return results


# ``loop`` read otherwise than as ``loop.index``, ``loop.item`` or ``loop.last``.
_WHOLE_LOOP = re.compile(r"\bloop\b(?!\s*\.\s*(?:index|item|last)\b)")


def _reads_results(definition: Any, key: str = "") -> bool:
    """Whether any template or expression of the graph may read a loop's results so far
    (the word, or ``loop`` read whole): if none may, an iteration is handed the loop's own
    list rather than a copy of it (a copy per iteration is quadratic in the iterations)."""
    if isinstance(definition, str):
        if key in _EXPRESSIONS or templates.is_template(definition):
            return "results" in definition or _WHOLE_LOOP.search(definition) is not None
        return False
    if isinstance(definition, dict):
        return any(_reads_results(v, k) for k, v in definition.items())
    if isinstance(definition, list):
        return any(_reads_results(v, key) for v in definition)
    return False


_EXPRESSIONS = ("when", "until", "expression")


async def _settled(names: list[str], started: list[Any]) -> list[tuple[str, Any]]:
    """The outputs of nodes started together: the ready ones as they are, the others run
    concurrently (one alone is awaited as it is, without a task)."""
    pending = [s for s in started if not isinstance(s, Ready)]
    if len(pending) > 1:
        outputs = iter(await asyncio.gather(*pending))
    elif pending:
        outputs = iter([await pending[0]])
    else:
        outputs = iter(())
    return [
        (n, s.value if isinstance(s, Ready) else next(outputs))
        for n, s in zip(names, started, strict=True)
    ]


async def interpret(app: GraphApp, input: Any, subgraphs: Subgraphs) -> Any:
    """The body of every graph run: load the run's pinned graph version and walk it
    (``subgraphs`` makes the workflows of its subgraph nodes' child runs)."""
    ctx = require_run("a graph run")
    graph = await graph_for_run(app, ctx)
    ctx.configure_guards(graph.guards)
    return await Interpreter(app, ctx, graph, subgraphs).run(input)
