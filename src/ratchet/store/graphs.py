"""Graphs in the store: each registered version of a graph definition, by content hash
(``graphs``; migrations sqlite 006, postgres 007). A worker serves every registered
version besides its code workflows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ratchet.model import dumps
from ratchet.store.dialect import Dialect
from ratchet.store.transaction import Tx

__all__ = ["StoredGraph", "get_graph", "list_graphs", "register_graph", "versions_and_tiers"]


@dataclass(frozen=True, slots=True)
class StoredGraph:
    """A row of ``graphs``: one registered version of a graph, by content hash."""

    name: str
    version: str
    definition: dict[str, Any]
    registered_at: float


def _graph(row: Any) -> StoredGraph:
    return StoredGraph(
        row["name"], row["version"], json.loads(row["definition"]), float(row["registered_at"])
    )


async def register_graph(d: Dialect, name: str, version: str, definition: Any) -> StoredGraph:
    """Store a graph version (a no-op when that content is registered already)."""
    params = {"name": name, "version": version, "definition": dumps(definition)}

    def body(tx: Tx) -> StoredGraph:
        tx.send("graph_insert", params)
        return _graph(tx.one("graph_get", {"name": name, "version": version}))

    return await d._run(body)


async def get_graph(d: Dialect, name: str, version: str | None = None) -> StoredGraph | None:
    """A registered graph version, or its latest registered version."""
    if version is None:
        row = await d._read(lambda tx: tx.one("graph_latest", {"name": name}))
    else:
        row = await d._read(lambda tx: tx.one("graph_get", {"name": name, "version": version}))
    return _graph(row) if row else None


async def list_graphs(d: Dialect) -> list[StoredGraph]:
    """Every registered version of every graph, newest first within a name."""
    return [_graph(r) for r in await d._read(lambda tx: tx.all("graphs_list", {}))]


async def versions_and_tiers(
    d: Dialect,
) -> tuple[frozenset[tuple[str, str]], frozenset[tuple[str, str]]]:
    """Every registered ``(graph name, version)`` pair, and the isolated ones among them."""
    rows = await d._read(lambda tx: tx.all("graph_versions_tiers", {}))
    pairs = [((r["name"], r["version"]), bool(r["isolated"])) for r in rows]
    return (frozenset(p for p, _ in pairs), frozenset(p for p, isolated in pairs if isolated))
