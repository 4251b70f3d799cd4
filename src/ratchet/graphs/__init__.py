"""Graph workflows: a YAML/JSON graph of nodes, validated by pydantic, registered by
content, and run by an interpreter whose nodes are steps of the one engine.

The names below load on first use: a worker imports this package to serve graph runs, and
pydantic's models and the template engine are no part of its start (a restart's latency)
until a graph is compiled.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratchet.graphs.spec import NODE_TYPES, json_schema
    from ratchet.graphs.validate import (
        Graph,
        GraphInvalid,
        Problem,
        load,
        load_document,
        validate,
    )

__all__ = [
    "NODE_TYPES",
    "Graph",
    "GraphInvalid",
    "Problem",
    "json_schema",
    "load",
    "load_document",
    "validate",
]

_HOMES = {
    "NODE_TYPES": "spec",
    "json_schema": "spec",
    "Graph": "validate",
    "GraphInvalid": "validate",
    "Problem": "validate",
    "load": "validate",
    "load_document": "validate",
    "validate": "validate",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """The package's ``validate`` is the function, as it always was, though a submodule
    of that name exists: importing the submodule (which sets the package's attribute to
    it) leaves the function in its place."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "validate" and isinstance(value, types.ModuleType):
            value = value.validate
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
