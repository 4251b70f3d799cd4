"""What a graph's node code works with: the app a graph runs with (:class:`GraphApp`), the
interpreter's walk as a node sees it (:class:`Walk`), the scope templates read
(:class:`Scope`), and a graph version as a workflow (:class:`GraphWorkflow`).

Here, below the interpreter and the node types, so that each imports these and neither
imports the other; and graphs take the app as a :class:`GraphApp`, never importing it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ratchet.engine.definitions import WorkflowDef

if TYPE_CHECKING:
    from ratchet.engine.drive import Drive
    from ratchet.graphs.validate import Graph


class GraphApp(Protocol):
    """What a graph run needs of the app it runs with. :class:`ratchet.Ratchet` is one; a
    sandbox's harness makes its own. Graphs take it as a parameter and never import the app
    (the app wires the features together, not the other way round)."""

    @property
    def workflows(self) -> Mapping[str, WorkflowDef]:
        """The code workflows, by name, that a graph's workflow nodes may start."""
        ...

    @property
    def tools(self) -> Mapping[str, Any]:
        """The ``@app.tool`` callables, by name, that tool nodes and ai-steps call."""
        ...

    def llm_client_for(self, provider: str) -> Any:
        """The wrapped model client an ai-step of ``provider`` calls."""
        ...

    def graph_interpreter(self, name: str) -> WorkflowDef:
        """The interpreter as the workflow of graph ``name`` (any version), one per name."""
        ...


class Walk(Protocol):
    """One drive's walk of one graph (:class:`ratchet.graphs.interpreter.Interpreter`), as
    the node types and the loop's fast-forward use it."""

    app: GraphApp
    ctx: Drive
    graph: Graph
    order: dict[str, int]  # node -> its place in the file
    reads_results: bool  # whether any template reads a loop's ``results``

    def incoming(self, n: str, inside: set[str]) -> list[Any]:
        """The edges into node ``n`` from ``inside`` that feed it."""
        ...

    def subgraph(self, name: str, version: str) -> WorkflowDef:
        """The interpreter as the workflow of graph ``name`` at ``version``, for a child run."""
        ...


@dataclass(slots=True)
class Scope:
    """What templates see at one place of the walk: the input, the outputs so far, and
    the loops around it."""

    input: Any
    outputs: dict[str, Any] = field(default_factory=dict)
    loop: dict[str, Any] | None = None
    item_name: str | None = None

    def context(self, output: Any = None) -> dict[str, Any]:
        ctx: dict[str, Any] = {
            "input": self.input,
            "output": output,
            "nodes": {k: {"output": v} for k, v in self.outputs.items()},
        }
        if self.loop is not None:
            ctx["loop"] = self.loop
            if self.item_name:
                ctx[self.item_name] = self.loop.get("item")
        return ctx

    def inner(self, loop: dict[str, Any], item_name: str) -> Scope:
        return Scope(self.input, dict(self.outputs), loop, item_name)

    def frozen(self) -> Scope:
        """This place of the walk as it is now, for templates rendered later."""
        return Scope(self.input, dict(self.outputs), self.loop, self.item_name)


@dataclass(slots=True)
class GraphWorkflow(WorkflowDef):
    """The interpreter as the workflow of one graph version, with the compiled graph (its
    sandbox, for ``tier: isolated``) and the tools of the app it runs with."""

    graph: Graph | None = None
    tools: Mapping[str, Any] | None = None
