"""Graphs and an app: registration by content, and the workflows a worker drives.

A registered graph is a row of ``graphs`` (name, content hash, definition), written by
``app.graph(...)`` or ``ratchet graph register``. A run of it is a run of workflow
``<name>`` at version ``<hash>``: the worker's claims serve every registered version (it
re-reads the list when a claim finds nothing, so a graph registered by the CLI while the
worker runs is served from its next claim), and the interpreter loads the run's own version,
so a run in flight never sees an edited graph. A version with ``tier: isolated`` is driven
in a sandbox: the worker asks :meth:`AppWorkflows.pinned` for the run's own version, whose
workflow carries the graph and its sandbox.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ratchet.engine.definitions import WorkflowDef
from ratchet.errors import RatchetError

if TYPE_CHECKING:
    from ratchet.app import Ratchet
    from ratchet.engine.drive import Drive
    from ratchet.graphs.validate import Graph
    from ratchet.store.base import Store, StoredGraph

# Compiled graphs by (name, version): a version's content never changes.
_COMPILED: dict[tuple[str, str], Graph] = {}


@dataclass(slots=True)
class GraphWorkflow(WorkflowDef):
    """The interpreter as the workflow of one graph version, with the compiled graph (its
    sandbox, for ``tier: isolated``) and the tools of the app it runs with."""

    graph: Graph | None = None
    tools: Mapping[str, Any] | None = None


def graph_workflow(
    app: Ratchet, name: str, version: str, graph: Graph | None = None
) -> WorkflowDef:
    """The interpreter as the workflow of graph ``name`` at ``version``."""
    from ratchet.graphs.interpreter import interpret

    async def run_graph(input: Any = None) -> Any:
        return await interpret(app, input)

    run_graph.__name__ = run_graph.__qualname__ = "run_graph"
    if graph is None:
        return WorkflowDef(run_graph, name, version)
    return GraphWorkflow(
        run_graph, name, version, sandbox=graph.sandbox, graph=graph, tools=app.tools
    )


def pin(graph: Graph) -> None:
    """Hold ``graph`` as the compiled form of its version (a sandbox's harness has no
    store to read it from)."""
    _COMPILED[(graph.name, graph.version)] = graph


class GraphSource(Protocol):
    """Where a registered graph is read from: the store, or a drive (``Drive.get_graph``)."""

    async def get_graph(self, name: str, version: str | None = None) -> StoredGraph | None:
        """A registered graph version (None: not registered)."""
        ...


async def compiled(store: GraphSource, name: str, version: str) -> Graph | None:
    """Graph ``name`` at ``version``, compiled once per process (None: not registered)."""
    graph = _COMPILED.get((name, version))
    if graph is None:
        stored = await store.get_graph(name, version)
        if stored is None:
            return None
        # Here, not at the top: a worker that never meets a graph run never loads the
        # graph format (pydantic models, templates), which would cost every start.
        from ratchet.graphs.validate import load

        graph = _COMPILED[(name, version)] = load(stored.definition)
    return graph


async def graph_for_run(app: Ratchet, ctx: Drive) -> Graph:
    """The compiled graph version this run is pinned to."""
    graph = await compiled(ctx, ctx.record.workflow, ctx.record.workflow_version)
    if graph is None:
        raise RatchetError(
            f"run {ctx.run_id}: graph {ctx.record.workflow!r} version "
            f"{ctx.record.workflow_version} is not registered"
        )
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

    async def pinned(self, store: Store, name: str, version: str) -> WorkflowDef | None:
        """The workflow of a run of ``name`` at ``version``: a code workflow, the
        interpreter of an isolated graph version (carrying its sandbox), else None (the
        interpreter in-process: :meth:`__getitem__`'s)."""
        wd = self.app.workflows.get(name)
        if wd is not None:
            return wd
        graph = await compiled(store, name, version)
        if graph is None or graph.sandbox is None:
            return None
        return graph_workflow(self.app, name, version, graph)


def _graph_def(app: Ratchet, name: str) -> WorkflowDef:
    # The version is the run's (the interpreter reads it from the run's record).
    wd = app._graph_defs.get(name)
    if wd is None:
        wd = app._graph_defs[name] = graph_workflow(app, name, "graph")
    return wd
