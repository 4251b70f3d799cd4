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
from typing import TYPE_CHECKING, Any

from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.versions import definition_for, every_version
from ratchet.graphs.compiled import compiled
from ratchet.graphs.walk import GraphApp, GraphWorkflow

if TYPE_CHECKING:
    from ratchet.graphs.validate import Graph
    from ratchet.store.base import Store


def graph_workflow(
    app: GraphApp, name: str, version: str, graph: Graph | None = None
) -> WorkflowDef:
    """The interpreter as the workflow of graph ``name`` at ``version``."""
    from ratchet.graphs.interpreter import interpret

    async def run_graph(input: Any = None) -> Any:
        # The interpreter makes the workflows of its subgraphs' child runs the same way.
        return await interpret(app, input, lambda n, v: graph_workflow(app, n, v))

    run_graph.__name__ = run_graph.__qualname__ = "run_graph"
    if graph is None:
        return WorkflowDef(run_graph, name, version)
    return GraphWorkflow(
        run_graph, name, version, sandbox=graph.sandbox, graph=graph, tools=app.tools
    )


class AppWorkflows(Mapping[str, WorkflowDef]):
    """What a worker of an app drives: its code workflows, and any graph run (by name)
    through the interpreter. Iterates over the code workflows only."""

    def __init__(self, app: GraphApp) -> None:
        self.app = app

    def __getitem__(self, name: str) -> WorkflowDef:
        wd = self.app.workflows.get(name)
        if wd is not None:
            return wd
        # The version is the run's (the interpreter reads it from the run's record).
        return self.app.graph_interpreter(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.app.workflows)

    def __len__(self) -> int:
        return len(self.app.workflows)

    def values(self) -> Any:
        return self.app.workflows.values()

    def every(self) -> list[WorkflowDef]:
        """Every version of every code workflow (what the worker's claims serve)."""
        return every_version(self.app.workflows)

    def version_of(self, name: str, version: str) -> WorkflowDef | None:
        """A code workflow's definition at ``version`` (None when the app lacks that
        version), else the interpreter of graph ``name``."""
        if name in self.app.workflows:
            return definition_for(self.app.workflows, name, version)
        return self.app.graph_interpreter(name)

    async def pinned(self, store: Store, name: str, version: str) -> WorkflowDef | None:
        """The workflow of a run of ``name`` at ``version``: a code workflow's version, the
        interpreter of an isolated graph version (carrying its sandbox), else None (the
        interpreter in-process: :meth:`__getitem__`'s)."""
        if name in self.app.workflows:
            return definition_for(self.app.workflows, name, version)
        graph = await compiled(store, name, version)
        if graph is None or graph.sandbox is None:
            return None
        return graph_workflow(self.app, name, version, graph)
