"""Compiled graphs: a registered version's definition, validated and compiled once per
process (a version's content never changes), and the version a graph run is pinned to."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ratchet.errors import RatchetError

if TYPE_CHECKING:
    from ratchet.engine.drive import Drive
    from ratchet.graphs.validate import Graph
    from ratchet.graphs.walk import GraphApp
    from ratchet.store.base import StoredGraph

# Compiled graphs by (name, version): a version's content never changes.
_COMPILED: dict[tuple[str, str], Graph] = {}


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


async def graph_for_run(app: GraphApp, ctx: Drive) -> Graph:
    """The compiled graph version this run is pinned to."""
    graph = await compiled(ctx, ctx.record.workflow, ctx.record.workflow_version)
    if graph is None:
        raise RatchetError(
            f"run {ctx.run_id}: graph {ctx.record.workflow!r} version "
            f"{ctx.record.workflow_version} is not registered"
        )
    return graph
