"""A loop's finished iterations, taken from the journal in one pass.

A re-drive walks a graph from its trigger; in a loop of many finished iterations, the walk
of each (its waves, its scope, a call per node) is most of a resume. When the loop's body
has one route only (tool nodes, edges without conditions) and the loop stops when its
items run out (``over``, no ``until``), every iteration takes the same steps in the same
order: ``<loop>#<i>/<node>`` for the body's nodes in wave order. Then the journal alone
says how far the loop got: the iterations whose steps are all journaled as completed are
taken at once (their ordinals, outputs and results), and the walk goes on, as always, from
the first iteration that is not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ratchet.graphs.nodes import tool_kwargs

if TYPE_CHECKING:
    from ratchet.graphs.validate import Node
    from ratchet.graphs.walk import Scope, Walk
    from ratchet.model import StepState


@dataclass(slots=True, frozen=True)
class Route:
    """A loop body's one route: its waves of nodes, in the order the walk runs them."""

    waves: tuple[tuple[str, ...], ...]

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(n for wave in self.waves for n in wave)


def route(interp: Walk, node: Node, entry: list[str]) -> Route | None:
    """The body's route if it has only one (see the module docstring), else None."""
    graph = interp.graph
    d = node.data
    if d.over is None or d.until is not None or not d.body:
        return None
    inside = set(d.body)
    if any(graph.nodes[b].type != "tool" for b in inside):
        return None
    incoming = {b: interp.incoming(b, inside) for b in inside}
    if any(e.when is not None for edges in incoming.values() for e in edges):
        return None
    # The walk's waves when every edge is taken (no edge has a condition): a node is
    # ready once all its sources ran, and then it runs.
    waves: list[tuple[str, ...]] = []
    ran: set[str] = set()
    while True:
        ready = tuple(
            n
            for n in sorted(inside - ran, key=interp.order.__getitem__)
            if n in entry or (incoming[n] and all(e.source in ran for e in incoming[n]))
        )
        if not ready:
            return Route(tuple(waves)) if waves else None
        waves.append(ready)
        ran.update(ready)


def skip_finished(
    interp: Walk,
    node: Node,
    plan: Route,
    prefix: str,
    scope: Scope,
    items: list[Any],
    results: list[Any],
) -> int:
    """Take the loop's iterations the journal holds as finished, from the first: append
    their results, leave their last outputs in ``scope`` and return how many there were."""
    ctx = interp.ctx
    order = plan.order
    loop_prefix = f"{prefix}{node.id}#"
    steps = ctx.take_completed_groups(
        (f"{loop_prefix}{i}/{n}" for i in range(len(items)) for n in order), len(order)
    )
    index = len(steps) // len(order)
    results.extend(s.output for s in steps[len(order) - 1 :: len(order)])
    if index == 0:
        return 0
    start = dict(scope.outputs)
    last = (index - 1) * len(order)
    for i, n in enumerate(order):
        scope.outputs[n] = steps[last + i].output
    _tell_guards(interp, node, plan, start, scope, items, results, steps, index)
    return index


def _tell_guards(
    interp: Walk,
    node: Node,
    plan: Route,
    start: dict[str, Any],
    scope: Scope,
    items: list[Any],
    results: list[Any],
    steps: list[StepState],
    iterations: int,
) -> None:
    """Report the steps taken to the runaway-loop guard, as the walk would have: only the
    last few count (see ``RunGuards.replayed_step``), so only they are reported."""
    guards = interp.ctx.guards
    limit = guards.g.runaway_repeats
    if limit is None:
        return
    order = plan.order
    total = iterations * len(order)
    # One more than the guard keeps, so it knows earlier steps fell out of its window.
    for k in range(max(total - limit - 1, 0), total):
        i, j = divmod(k, len(order))
        step = steps[k]
        here = _scope_at(interp, node, plan, start, scope, items, results, steps, i, order[j])
        guards.replayed_step(
            step.name, step.step_id, step.output, _arguments(interp, order[j], here)
        )


def _arguments(
    interp: Walk, name: str, here: Scope
) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    node = interp.graph.nodes[name]
    return lambda: ((), tool_kwargs(interp, node, here))


def _scope_at(
    interp: Walk,
    node: Node,
    plan: Route,
    start: dict[str, Any],
    scope: Scope,
    items: list[Any],
    results: list[Any],
    steps: list[StepState],
    iteration: int,
    name: str,
) -> Scope:
    """What node ``name`` saw in iteration ``iteration``: the scope the loop started in
    (``start``), the body's outputs of the iteration before, and those of this one's
    earlier waves."""
    from ratchet.graphs.walk import Scope

    order = plan.order
    outputs = dict(start)
    base = iteration * len(order)  # the iteration's first step among the steps taken
    if iteration > 0:
        for i, n in enumerate(order):
            outputs[n] = steps[base - len(order) + i].output
    for wave in plan.waves:
        if name in wave:
            break
        for n in wave:
            outputs[n] = steps[base + order.index(n)].output
    done = results[:iteration] if interp.reads_results else results
    loop = {"index": iteration, "item": items[iteration], "results": done}
    return Scope(scope.input, outputs, loop, node.data.item)
