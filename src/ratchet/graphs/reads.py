"""Which nodes a template may read: only nodes that have surely run when it is rendered.

A node runs when one of its incoming edges was taken, and is skipped otherwise, so a
template that reads ``nodes.send`` from a node that does not come after ``send`` on every
way there (``send`` is on the approved branch, the reader after the branches join) works
while the approval says yes and fails the run with a ``TemplateError`` once a person says
no. This module finds such reads when the graph is registered.

A node ``x`` has surely run before node ``n`` runs when:

* ``x`` dominates ``n``: every way from the trigger (or, inside a loop's body, from the
  body's first nodes) to ``n`` goes through ``x``. ``n`` runs only after one of its
  incoming edges was taken, which needs its source to have run, and so back to the
  trigger: every such chain goes through ``x``;
* or ``x`` comes before ``n`` (a way leads from ``x`` to ``n``) and an edge without
  ``when`` leads to ``x`` from a node that has surely run: that edge is taken, and the
  walk decides every node before the nodes after it (the other side of a ``parallel``).

The graph's ``output`` is rendered when the walk ends, so it reads nodes that run on every
way through the graph, where a node whose edges all carry ``when`` is taken to follow one
of them (the checker does not evaluate conditions: a branch's conditions are trusted to
cover its cases). A loop's body is a graph of its own, walked once per iteration; a node
after the loop may read a body node that runs in every iteration (the latest one's
output). A template that tests whether a node ran (``nodes.x is defined``, ``'x' in
nodes``) handles the branches itself (``nodes.send.output if nodes.send is defined else
nodes.tell.output``), and its reads are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from jinja2 import nodes as jn

from ratchet.graphs.spec import Edge


class ShapeNode(Protocol):
    """What the check reads of a node: its type, and a loop's body in its data."""

    @property
    def type(self) -> str: ...

    @property
    def data(self) -> Any: ...


class Graph(Protocol):
    """What the check reads of a graph being validated
    (:class:`ratchet.graphs.validate.Graph` is one)."""

    @property
    def nodes(self) -> Mapping[str, ShapeNode]: ...

    @property
    def trigger(self) -> str: ...

    @property
    def out_edges(self) -> Mapping[str, list[Edge]]: ...

    @property
    def loop_of(self) -> Mapping[str, str]: ...


# The walk's end, as a node of each scope (the top level, or a loop's body).
END = "\x00end"
_ROOT = "\x00root"


@dataclass(frozen=True, slots=True)
class Read:
    """A template at ``where`` that reads ``nodes.<target>``, rendered by ``reader`` (a node,
    or an edge's source for its ``when``; None for the graph's output)."""

    where: str
    reader: str | None
    target: str


def guarded(tree: jn.Template) -> set[str]:
    """The nodes the template tests for (``nodes.x is defined``, ``'x' in nodes``)."""
    out: set[str] = set()
    for test in tree.find_all(jn.Test):
        inner: Any = test.node
        if test.name in ("defined", "undefined") and _is_nodes(inner):
            out.add(inner.attr if isinstance(inner, jn.Getattr) else inner.arg.value)
    for compare in tree.find_all(jn.Compare):
        expr: Any = compare.expr
        for op in compare.ops:
            right: Any = op.expr
            if (
                op.op in ("in", "notin")
                and isinstance(expr, jn.Const)
                and isinstance(expr.value, str)
                and isinstance(right, jn.Name)
                and right.name == "nodes"
            ):
                out.add(expr.value)
    return out


def _is_nodes(node: Any) -> bool:
    if not isinstance(getattr(node, "node", None), jn.Name) or node.node.name != "nodes":
        return False
    if isinstance(node, jn.Getattr):
        return True
    return isinstance(node, jn.Getitem) and isinstance(node.arg, jn.Const)


@dataclass(slots=True)
class _Scope:
    """The top level or a loop's body: its members, their edges inside it, dominators."""

    members: list[str]
    entries: list[str]
    preds: dict[str, list[tuple[str, bool]]] = field(default_factory=dict)  # (source, plain)
    succs: dict[str, list[str]] = field(default_factory=dict)
    idom: dict[str, str] = field(default_factory=dict)
    depth: dict[str, int] = field(default_factory=dict)
    ok: bool = True  # False: a cycle, so no order to reason on (reported elsewhere)


class Checker:
    """The reads of one graph, checked against its scopes."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.loop_of = graph.loop_of
        self.scopes: dict[str | None, _Scope] = {}
        top = [n for n in graph.nodes if n not in self.loop_of]
        self.scopes[None] = self._scope(None, top, [graph.trigger])
        for n, node in graph.nodes.items():
            if node.type == "loop":
                body = [b for b in node.data.body if self.loop_of.get(b) == n]
                self.scopes[n] = self._scope(n, body, None)
        self._certain: dict[tuple[str | None, str], set[str]] = {}

    def _scope(self, loop: str | None, members: list[str], entries: list[str] | None) -> _Scope:
        inside = set(members)
        sc = _Scope(members, [])
        for m in members:
            sc.preds[m] = []
            sc.succs.setdefault(m, [])
        for m in members:
            for e in self.graph.out_edges.get(m, []):
                if e.target in inside:
                    sc.preds[e.target].append((m, e.when is None))
                    sc.succs[m].append(e.target)
        sc.entries = entries if entries is not None else [m for m in members if not sc.preds[m]]
        sinks = [m for m in members if not sc.succs[m]]
        sc.preds[END] = [(m, False) for m in sinks]
        sc.succs[END] = []
        for m in sinks:
            sc.succs[m].append(END)
        order = _topological([*members, END], sc.preds)
        if order is None:
            sc.ok = False
            return sc
        sc.depth[_ROOT] = 0
        for n in order:
            if n in sc.entries:
                sc.idom[n], sc.depth[n] = _ROOT, 1
                continue
            reached = [p for p, _ in sc.preds[n] if p in sc.idom]
            if not reached:
                continue  # unreachable from the scope's entries (reported elsewhere)
            cur = reached[0]
            for p in reached[1:]:
                cur = self._meet(sc, cur, p)
            sc.idom[n], sc.depth[n] = cur, sc.depth[cur] + 1
        return sc

    @staticmethod
    def _meet(sc: _Scope, a: str, b: str) -> str:
        while a != b:
            if sc.depth[a] >= sc.depth[b]:
                a = sc.idom[a]
            else:
                b = sc.idom[b]
        return a

    def _chain(self, n: str) -> list[tuple[str | None, str]]:
        """(scope, the node standing for ``n`` in it), from ``n``'s own scope outwards."""
        out: list[tuple[str | None, str]] = []
        cur: str | None = n
        while cur is not None:
            loop = self.loop_of.get(cur)
            out.append((loop, cur))
            cur = loop
        return out

    def surely_run(self, read: Read) -> bool:
        """Whether ``read.target`` has surely run when ``read``'s template is rendered."""
        x_chain = self._chain(read.target)
        x_in = dict(x_chain)
        reader = END if read.reader is None else read.reader
        scope = None if read.reader is None else self.loop_of.get(read.reader)
        # Lift the reader to the innermost scope that holds the target (or a loop around it).
        while scope not in x_in:
            assert scope is not None  # the top level holds every target
            reader, scope = scope, self.loop_of.get(scope)
        x = x_in[scope]
        if x == reader:
            return True  # the node itself (an edge's source), or a loop reading its body
        if not self._before(scope, x, reader):
            return False
        # A body node read from after its loop: it runs in every iteration of the body
        # (and of every loop between).
        for inner, rep in x_chain:
            if inner == scope:
                break
            if not self._before(inner, rep, END):
                return False
        return True

    def _before(self, scope: str | None, x: str, n: str) -> bool:
        sc = self.scopes[scope]
        if not sc.ok or n not in sc.idom or x not in sc.idom:
            return True  # unreachable or cyclic: reported by the structure checks
        d = sc.idom[n]
        while d != _ROOT:  # the common case, a walk up the dominator tree
            if d == x:
                return True
            d = sc.idom[d]
        return x in self._certain_before(scope, sc, n)

    def _certain_before(self, scope: str | None, sc: _Scope, n: str) -> set[str]:
        key = (scope, n)
        found = self._certain.get(key)
        if found is not None:
            return found
        certain: set[str] = set()
        d = sc.idom[n]
        while d != _ROOT:
            certain.add(d)
            d = sc.idom[d]
        before = _ancestors(n, sc.preds)
        grew = True
        while grew:
            grew = False
            for b in before - certain:
                if any(plain and p in certain for p, plain in sc.preds[b]):
                    certain.add(b)
                    grew = True
        self._certain[key] = certain
        return certain


def _ancestors(n: str, preds: dict[str, list[tuple[str, bool]]]) -> set[str]:
    seen: set[str] = set()
    todo = [p for p, _ in preds.get(n, [])]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [p for p, _ in preds.get(m, [])]
    return seen


def _topological(names: list[str], preds: dict[str, list[tuple[str, bool]]]) -> list[str] | None:
    """``names`` in an order where each comes after its predecessors; None if they cycle."""
    waiting = {n: len(preds.get(n, [])) for n in names}
    succs: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for p, _ in preds.get(n, []):
            succs[p].append(n)
    ready = [n for n in names if waiting[n] == 0]
    order: list[str] = []
    while ready:
        n = ready.pop()
        order.append(n)
        for m in succs[n]:
            waiting[m] -= 1
            if waiting[m] == 0:
                ready.append(m)
    return order if len(order) == len(names) else None


def unsure(graph: Graph, reads: list[Read]) -> Iterator[Read]:
    """The reads of nodes that may not have run when their template is rendered."""
    if not graph.trigger or not reads:
        return
    checker = Checker(graph)
    for read in reads:
        if read.target in graph.nodes and not checker.surely_run(read):
            yield read


def message(read: Read) -> str:
    """What is wrong with ``read``, for its problem."""
    if read.reader is None:
        return (
            f"bad template: it reads nodes.{read.target}, and node {read.target!r} is not on "
            "every way through the graph (it is on a branch), so the output cannot be "
            f"rendered when the run takes another; read it where {read.target!r} ran, or test "
            f"'nodes.{read.target} is defined' first"
        )
    return (
        f"bad template: it reads nodes.{read.target}, and node {read.target!r} may not have "
        f"run when {read.reader!r} runs (it is on another branch, or not before "
        f"{read.reader!r}); read only nodes on every way from the trigger to {read.reader!r}, "
        f"or test 'nodes.{read.target} is defined' first"
    )
