"""Starting a run of a registered graph: its latest version, the input checked against
the graph's ``inputs`` schema before anything is written."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from ratchet.engine.definitions import to_json
from ratchet.errors import InvalidInput, UnknownWorkflow
from ratchet.graphs.schema_check import schema_errors
from ratchet.model import NewRun
from ratchet.store.base import Store


def unknown_workflow(name: str, code: Collection[str], graphs: Collection[str]) -> str:
    """What a start of ``name`` says when neither a code workflow (``code``) nor a
    registered graph (``graphs``) has that name: everything it could have started."""
    listed = ", ".join(sorted(code)) or "none"
    registered = ", ".join(sorted(graphs)) or "none"
    return (
        f"unknown workflow {name!r}: no code workflow and no registered graph has that "
        f"name; code workflows: {listed}; registered graphs: {registered}"
    )


async def new_graph_run(
    store: Store,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    run_id: str,
    queue: str,
    priority: int,
    known: Collection[str] = (),
) -> NewRun:
    """The run to create for ``app.start(GRAPH, input)`` (or ``input=...`` as keywords)."""
    stored = await store.get_graph(name)
    if stored is None:
        graphs, _ = await store.graph_versions_tiers()
        raise UnknownWorkflow(unknown_workflow(name, known, {g for g, _ in graphs}))
    if len(args) > 1 or (args and kwargs):
        raise InvalidInput(
            f"graph {name}: pass its input as one value (app.start({name!r}, "
            "input)) or as keyword arguments, not both"
        )
    value: Any = args[0] if args else dict(kwargs)
    value = json.loads(to_json(value, f"the input of graph {name}"))
    inputs = stored.definition.get("inputs") or {"type": "object"}
    problems = schema_errors(inputs, value)
    if problems:
        raise InvalidInput(f"invalid input for graph {name}: " + "; ".join(problems))
    return NewRun(run_id, name, stored.version, {"args": [value], "kwargs": {}}, queue, priority)
