"""Graphs and an app: registration by content, and the workflows a worker drives.

A registered graph is a row of ``graphs`` (name, content hash, definition), written by
``app.graph(...)`` or ``ratchet graph register``. A run of it is a run of workflow
``<name>`` at version ``<hash>``: the worker's claims serve every registered version (it
re-reads the list when a claim finds nothing, so a graph registered by the CLI while the
worker runs is served from its next claim), and the interpreter loads the run's own version,
so a run in flight never sees an edited graph.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ratchet.engine.definitions import WorkflowDef
from ratchet.errors import RatchetError
from ratchet.graphs.validate import Graph, load

if TYPE_CHECKING:
    from ratchet.app import Ratchet
    from ratchet.engine.driver import RunContext

# Compiled graphs by (name, version): a version's content never changes.
_COMPILED: dict[tuple[str, str], Graph] = {}


def graph_workflow(app: Ratchet, name: str, version: str) -> WorkflowDef:
    """The interpreter as the workflow of graph ``name`` at ``version``."""
    from ratchet.graphs.interpreter import interpret

    async def run_graph(input: Any = None) -> Any:
        return await interpret(app, input)

    run_graph.__name__ = run_graph.__qualname__ = "run_graph"
    return WorkflowDef(run_graph, name, version)


async def graph_for_run(app: Ratchet, ctx: RunContext) -> Graph:
    """The compiled graph version this run is pinned to."""
    key = (ctx.record.workflow, ctx.record.workflow_version)
    graph = _COMPILED.get(key)
    if graph is None:
        stored = await ctx.store.raw.get_graph(*key)
        if stored is None:
            raise RatchetError(f"run {ctx.run_id}: graph {key[0]!r} version {key[1]} is not "
                               "registered")
        graph = load(stored.definition)
        _COMPILED[key] = graph
    return graph


class AppWorkflows(Mapping[str, WorkflowDef]):
    """What a worker of an app drives: its code workflows, and any graph run (by name)
    through the interpreter. Iterates over the code workflows only."""

    def __init__(self, app: Ratchet) -> None:
        self.app = app

    def __getitem__(self, name: str) -> WorkflowDef:
        wd = self.app.workflows.get(name)
        if wd is not None:
            return wd
        return _graph_def(self.app, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.app.workflows)

    def __len__(self) -> int:
        return len(self.app.workflows)

    def values(self) -> Any:
        return self.app.workflows.values()


def _graph_def(app: Ratchet, name: str) -> WorkflowDef:
    # The version is the run's (the interpreter reads it from the run's record).
    wd = app._graph_defs.get(name)
    if wd is None:
        wd = app._graph_defs[name] = graph_workflow(app, name, "graph")
    return wd
