"""Loading and validating a graph: every problem, each naming its node and field.

``validate(document)`` returns the compiled :class:`Graph` or the full list of
:class:`Problem` s; nothing is written either way. The checks: the file's shape and each
node's data (by its type's model: a missing or misspelt field is named), unknown node
types, duplicate ids, one trigger, dangling edges, templates that do not parse or read a
node or name that does not exist, templates that read a node that may not have run by then
(on another branch: :mod:`ratchet.graphs.reads`), retry policies, unknown tools (when the
app's tools are given), cycles outside a loop, loop bodies that leak, nodes the trigger
cannot reach, and for ``tier: isolated`` the sandbox's fields and every node a sandbox
cannot run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import yaml

from ratchet.engine.guards import DEFAULT as DEFAULT_GUARDS
from ratchet.engine.guards import Guards
from ratchet.engine.retry import NO_RETRY, Retry, as_policy
from ratchet.engine.waits import PARK_MIN_S
from ratchet.errors import InvalidInput, RatchetError
from ratchet.graphs import reads as branch_reads
from ratchet.graphs import templates
from ratchet.graphs.spec import DATA_MODELS, NODE_TYPES, Edge, NodeData, RawGraph, RawNode
from ratchet.model import dumps
from ratchet.sandbox.spec import Sandbox

# Node types a sandbox cannot run, and why: each needs the worker outside (a park, a
# child run) or a network the sandbox does not have.
NOT_ISOLATABLE = {
    "approval": "an approval parks the run, and only the worker outside the sandbox can",
    "subagent": "a subagent starts a child run, and only the worker outside the sandbox can",
    "connector": "a connector reaches the network (a delivery claims a receipt besides), "
    "and a sandbox has no network",
    "ai-step": "an ai-step calls a model provider over the network, and a sandbox has no network",
}

# Names a template may read at the top level, besides a loop's item name.
TOP_NAMES = frozenset({"input", "nodes", "output", "loop"})


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a graph: where (``node``, the JSON path ``field``) and what."""

    field: str
    message: str
    node: str | None = None

    def __str__(self) -> str:
        where = f"node {self.node!r}: " if self.node else ""
        return f"{where}{self.field}: {self.message}"


class GraphInvalid(InvalidInput):
    """The graph has problems; ``.problems`` lists every one."""

    def __init__(self, name: str, problems: list[Problem]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"graph {name} has {len(problems)} problem(s):\n{lines}")


@dataclass(slots=True)
class Node:
    id: str
    type: str
    data: Any  # the type's data model
    raw: dict[str, Any]
    retry: Retry = NO_RETRY
    timeout_s: float | None = None
    gate: Any = None  # an ai-step's ratchet.Gate


@dataclass(slots=True)
class Graph:
    """A valid graph, compiled for the interpreter."""

    name: str
    version: str  # sha256 of the canonical definition: its identity
    definition: dict[str, Any]
    nodes: dict[str, Node]
    edges: list[Edge]
    output: Any
    inputs: dict[str, Any]
    trigger: str = ""
    out_edges: dict[str, list[Edge]] = field(default_factory=dict)
    in_edges: dict[str, list[Edge]] = field(default_factory=dict)
    loop_of: dict[str, str] = field(default_factory=dict)  # body node -> its loop
    guards: Guards = DEFAULT_GUARDS
    sandbox: Sandbox | None = None  # tier: isolated


def content_version(definition: Mapping[str, Any]) -> str:
    """The graph's version: a hash of its canonical JSON (key order and layout ignored)."""
    return hashlib.sha256(dumps(dict(definition)).encode()).hexdigest()[:16]


def load_document(source: str | Path) -> dict[str, Any]:
    """A graph file (YAML or JSON; JSON is YAML) as data; :class:`InvalidInput` if it cannot
    be read or is not a mapping."""
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as e:
        raise InvalidInput(f"cannot read graph file {str(path)!r}: {e.strerror}") from None
    try:
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise InvalidInput(
            f"graph file {str(path)!r} is not valid "
            f"{'JSON' if path.suffix == '.json' else 'YAML'}: {e}"
        ) from None
    if not isinstance(doc, dict):
        raise InvalidInput(
            f"graph file {str(path)!r} must hold a mapping (name, nodes, "
            f"edges, ...), not {type(doc).__name__}"
        )
    return doc


def _loc(loc: Iterable[Any], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _pydantic_problems(
    e: pydantic.ValidationError,
    prefix: str,
    node: str | None,
    nodes_by_index: Mapping[int, str] | None = None,
) -> list[Problem]:
    out = []
    for err in e.errors():
        loc = list(err.get("loc", ()))
        who = node
        if nodes_by_index is not None and len(loc) >= 2 and loc[0] == "nodes":
            who = nodes_by_index.get(loc[1]) if isinstance(loc[1], int) else None
        out.append(Problem(_loc(loc, prefix), err["msg"], who))
    return out


def validate(
    doc: Mapping[str, Any],
    tools: Collection[str] | None = None,
    workflows: Collection[str] | None = None,
) -> tuple[Graph | None, list[Problem]]:
    """Check a graph document; (the graph, []) if it is valid, else (None, every problem).
    ``tools`` (and ``workflows``): the names an app offers, checked when given."""
    ids: dict[int, str] = {
        i: n["id"]
        for i, n in enumerate(doc.get("nodes") or [])
        if isinstance(n, dict) and isinstance(n.get("id"), str)
    }
    try:
        raw = RawGraph.model_validate(doc)
    except pydantic.ValidationError as e:
        return None, _pydantic_problems(e, "", None, ids)
    problems: list[Problem] = []
    nodes: dict[str, Node] = {}
    for i, rn in enumerate(raw.nodes):
        where = f"nodes[{i}]"
        if rn.id in nodes:
            problems.append(Problem(f"{where}.id", f"duplicate node id {rn.id!r}", rn.id))
            continue
        node = _node(rn, where, problems, tools)
        if node is not None:
            nodes[rn.id] = node
    known = {n.id for n in raw.nodes}
    reads: list[branch_reads.Read] = []  # which nodes each template reads
    for j, edge in enumerate(raw.edges):
        for end, name in (("from", edge.source), ("to", edge.target)):
            if name not in known:
                problems.append(
                    Problem(
                        f"edges[{j}].{end}",
                        f"dangling edge: no node {name!r} ({edge.source} -> {edge.target})",
                        _other_end(edge, end, known),
                    )
                )
        if edge.when is not None:
            _templates(edge.when, f"edges[{j}].when", edge.source, known, problems, True, (), reads)
    _templates(raw.output, "output", None, known, problems, reads=reads)
    graph = Graph(
        raw.name,
        "",
        doc if isinstance(doc, dict) else dict(doc),
        nodes,
        raw.edges,
        raw.output,
        raw.inputs,
    )
    if raw.guards is not None:
        try:
            graph.guards = Guards.from_json(raw.guards)
        except InvalidInput as e:
            problems.append(Problem("guards", str(e).removeprefix("invalid guards: ")))
    _structure(graph, raw, known, problems, workflows, reads)
    for read in branch_reads.unsure(graph, reads):
        problems.append(Problem(read.where, branch_reads.message(read), read.reader))
    if raw.tier == "isolated":
        graph.sandbox = _isolated(raw, nodes, tools, problems)
    elif raw.sandbox is not None:
        problems.append(Problem("sandbox", "a sandbox needs tier: isolated"))
    if problems:
        return None, problems
    graph.definition = json.loads(dumps(dict(doc)))
    graph.version = content_version(graph.definition)
    return graph, []


def _other_end(edge: Edge, end: str, known: Collection[str]) -> str | None:
    """The node a dangling edge belongs to: its end that exists, if one does."""
    other = edge.source if end == "to" else edge.target
    return other if other in known else None


def _node(
    rn: RawNode, where: str, problems: list[Problem], tools: Collection[str] | None
) -> Node | None:
    if rn.type not in DATA_MODELS:
        problems.append(
            Problem(
                f"{where}.type",
                f"unknown node type {rn.type!r}; expected one of {', '.join(NODE_TYPES)}",
                rn.id,
            )
        )
        return None
    try:
        data: NodeData = DATA_MODELS[rn.type].model_validate(rn.data)
    except pydantic.ValidationError as e:
        problems.extend(_pydantic_problems(e, f"{where}.data", rn.id))
        return None
    node = Node(rn.id, rn.type, data, rn.data, timeout_s=rn.timeout_s or data.timeout_s)
    if data.retry is not None:
        try:
            node.retry = as_policy(data.retry)
        except RatchetError as e:
            problems.append(Problem(f"{where}.data.retry", str(e), rn.id))
    gate = getattr(data, "gate", None)
    if gate is not None:
        from ratchet.llm.gate import Gate

        try:
            node.gate = Gate.from_json(gate)
        except InvalidInput as e:
            problems.append(
                Problem(f"{where}.data.gate", str(e).removeprefix("invalid gate: "), rn.id)
            )
    names = [getattr(data, "tool", "")] if rn.type == "tool" else list(getattr(data, "tools", []))
    if tools is not None:
        for k, name in enumerate(names):
            if name not in tools:
                at = ".data.tool" if rn.type == "tool" else f".data.tools[{k}]"
                known = ", ".join(sorted(tools)) or "none"
                problems.append(
                    Problem(where + at, f"unknown tool {name!r}; the app's tools: {known}", rn.id)
                )
    return node


def _isolated(
    raw: RawGraph, nodes: Mapping[str, Node], tools: Collection[str] | None, problems: list[Problem]
) -> Sandbox | None:
    """The sandbox of an isolated graph; a problem for each node it could not run."""
    for i, rn in enumerate(raw.nodes):
        node = nodes.get(rn.id)
        if node is None:
            continue
        why = NOT_ISOLATABLE.get(node.type)
        if why is None and node.type == "tool" and isinstance(tools, Mapping):
            td = getattr(tools.get(node.data.tool), "tool", None)
            if td is not None and (td.requires_approval or td.risk == "critical"):
                why = (
                    f"tool {td.name!r} asks a person's approval before it runs (a park), "
                    "and only the worker outside the sandbox can park a run"
                )
        if why is not None:
            problems.append(
                Problem(
                    f"nodes[{i}].type",
                    f"{node.type} nodes cannot run in an isolated graph: {why}",
                    rn.id,
                )
            )
            continue
        # A backoff this long parks the run between attempts, which a sandbox cannot.
        longest = max(
            (node.retry.delay_s(k) for k in range(1, node.retry.max_attempts)), default=0.0
        )
        if longest >= PARK_MIN_S:
            problems.append(
                Problem(
                    f"nodes[{i}].data.retry",
                    f"a backoff of {longest:g}s "
                    f"parks the run, which an isolated graph cannot: keep "
                    f"each backoff under {PARK_MIN_S:g}s",
                    rn.id,
                )
            )
    fields = {f.name for f in dataclasses.fields(Sandbox)}
    given = raw.sandbox or {}
    unknown = sorted(set(given) - fields)
    if unknown:
        problems.append(
            Problem(
                "sandbox",
                f"unknown field(s) {', '.join(unknown)}; expected {', '.join(sorted(fields))}",
            )
        )
        return None
    try:
        return Sandbox(**given)
    except InvalidInput as e:
        problems.append(Problem("sandbox", str(e)))
        return None


def _templates(
    value: Any,
    where: str,
    node: str | None,
    known: Collection[str],
    problems: list[Problem],
    expression: bool = False,
    extra: Collection[str] = (),
    reads: list[branch_reads.Read] | None = None,
) -> None:
    """Check the templates in ``value``, rendered by ``node`` (None: the graph's output);
    the nodes they read go to ``reads``, for :mod:`ratchet.graphs.reads`."""
    try:
        trees = list(templates.check(value, expression))
    except templates.TemplateError as e:
        problems.append(Problem(where, str(e), node))
        return
    for path, tree in trees:
        # A template that tests whether a node ran handles the branches itself.
        checked = reads is not None and not branch_reads.guarded(tree)
        for name, attr in templates.references(tree):
            if name == "nodes" and attr is not None and attr in known:
                if reads is not None and checked:
                    reads.append(branch_reads.Read(where + path, node, attr))
            elif name == "nodes" and attr is not None:
                problems.append(
                    Problem(
                        where + path,
                        f"bad template: it reads nodes.{attr}, and there is no node {attr!r}",
                        node,
                    )
                )
            elif name not in TOP_NAMES and name not in extra:
                problems.append(
                    Problem(
                        where + path,
                        f"bad template: unknown name {name!r} "
                        f"(use input, nodes.<id>.output, output, loop)",
                        node,
                    )
                )


_TEMPLATED = {
    "ai-step": ("prompt", "system"),
    "tool": ("args",),
    "subagent": ("input",),
    "approval": ("ask",),
    "connector": ("url", "body", "to", "subject", "headers"),
    "output": ("value",),
    "loop": ("over",),
}
_EXPRESSIONS = {"condition": ("expression",), "loop": ("until",)}


def _structure(
    graph: Graph,
    raw: RawGraph,
    known: Collection[str],
    problems: list[Problem],
    workflows: Collection[str] | None,
    reads: list[branch_reads.Read],
) -> None:
    index: dict[str, int] = {}
    for i, n in enumerate(raw.nodes):  # a duplicate id's problems name the first node
        index.setdefault(n.id, i)
    items = {getattr(n.data, "item", None) for n in graph.nodes.values() if n.type == "loop"}
    extra = {i for i in items if i}
    for node in graph.nodes.values():
        where = f"nodes[{index[node.id]}].data"
        for name in _TEMPLATED.get(node.type, ()):
            value = getattr(node.data, name)
            _templates(value, f"{where}.{name}", node.id, known, problems, False, extra, reads)
        for name in _EXPRESSIONS.get(node.type, ()):
            value = getattr(node.data, name)
            if value is not None:
                _templates(value, f"{where}.{name}", node.id, known, problems, True, extra, reads)
        if node.type == "subagent":
            d = node.data
            if (d.graph is None) == (d.workflow is None):
                problems.append(
                    Problem(
                        f"{where}.graph",
                        "a subagent names exactly one of graph or workflow",
                        node.id,
                    )
                )
            elif d.workflow is not None and workflows is not None and d.workflow not in workflows:
                problems.append(
                    Problem(f"{where}.workflow", f"unknown workflow {d.workflow!r}", node.id)
                )
        if node.type == "loop":
            d = node.data
            if (d.over is None) == (d.until is None):
                problems.append(
                    Problem(
                        f"{where}.over",
                        "a loop has exactly one of over (a list) or until (a condition)",
                        node.id,
                    )
                )
            for k, member in enumerate(d.body):
                if member not in known:
                    problems.append(Problem(f"{where}.body[{k}]", f"no node {member!r}", node.id))
                elif member == node.id or member in graph.loop_of:
                    problems.append(
                        Problem(
                            f"{where}.body[{k}]",
                            f"node {member!r} cannot be "
                            "in this loop's body (it is the loop, or in "
                            "another loop)",
                            node.id,
                        )
                    )
                else:
                    graph.loop_of[member] = node.id
        if node.type == "connector":
            d = node.data
            needs = ("to",) if d.kind == "email" else ("url",)
            for name in needs:
                if getattr(d, name) is None:
                    problems.append(
                        Problem(f"{where}.{name}", f"a {d.kind} connector needs {name}", node.id)
                    )
    triggers = [n.id for n in raw.nodes if n.type == "trigger"]
    if len(triggers) != 1:
        problems.append(
            Problem(
                "nodes",
                f"a graph has exactly one trigger node, this one has "
                f"{len(triggers)}" + (f" ({', '.join(triggers)})" if triggers else ""),
            )
        )
    else:
        graph.trigger = triggers[0]
    for edge in graph.edges:
        if edge.source in known and edge.target in known:
            graph.out_edges.setdefault(edge.source, []).append(edge)
            graph.in_edges.setdefault(edge.target, []).append(edge)
    _loop_edges(graph, raw, index, problems)
    _cycles(graph, raw, index, problems)
    if graph.trigger:
        seen = _reachable(graph)
        for n in raw.nodes:
            if n.id not in seen and n.id in graph.nodes:
                problems.append(
                    Problem(
                        f"nodes[{index[n.id]}]",
                        f"unreachable node: no path from the trigger {graph.trigger!r} leads to it",
                        n.id,
                    )
                )


def _loop_edges(
    graph: Graph, raw: RawGraph, index: Mapping[str, int], problems: list[Problem]
) -> None:
    """A loop's body is entered from the loop only, and leaves only back to it."""
    for j, edge in enumerate(graph.edges):
        src, dst = graph.loop_of.get(edge.source), graph.loop_of.get(edge.target)
        if src == dst:
            continue
        if dst is not None and edge.source != dst:
            problems.append(
                Problem(
                    f"edges[{j}].to",
                    f"edge {edge.source} -> {edge.target} "
                    f"enters the body of loop {dst!r} from outside it",
                    edge.source,
                )
            )
        if src is not None and edge.target != src:
            problems.append(
                Problem(
                    f"edges[{j}].from",
                    f"edge {edge.source} -> {edge.target} "
                    f"leaves the body of loop {src!r} (end the body with an "
                    f"edge back to {src!r}, or none)",
                    edge.source,
                )
            )


def _forward(graph: Graph, node: str) -> list[str]:
    """Successors, without a loop body's edges back to its loop."""
    return [
        e.target for e in graph.out_edges.get(node, []) if graph.loop_of.get(e.source) != e.target
    ]


def _cycles(graph: Graph, raw: RawGraph, index: Mapping[str, int], problems: list[Problem]) -> None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in _forward(graph, n):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)) is not None:
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in raw.nodes:
        if n.id not in state:
            stack.clear()
            cycle = visit(n.id)
            if cycle is not None:
                problems.append(
                    Problem(
                        f"nodes[{index[cycle[0]]}]",
                        "cycle outside a loop: " + " -> ".join(cycle) + " (repeat work with a loop "
                        "node and its body)",
                        cycle[0],
                    )
                )
                return


def _reachable(graph: Graph) -> set[str]:
    seen = {graph.trigger}
    todo = [graph.trigger]
    while todo:
        n = todo.pop()
        nexts = list(_forward(graph, n))
        node = graph.nodes.get(n)
        if node is not None and node.type == "loop":
            nexts += [m for m in node.data.body if m in graph.nodes]
        for m in nexts:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def load(
    source: str | Path | Mapping[str, Any],
    tools: Collection[str] | None = None,
    workflows: Collection[str] | None = None,
) -> Graph:
    """A valid graph from a file or a document, or :class:`GraphInvalid` listing every
    problem."""
    doc = dict(source) if isinstance(source, Mapping) else load_document(source)
    graph, problems = validate(doc, tools, workflows)
    if graph is None:
        raise GraphInvalid(str(doc.get("name", source)), problems)
    return graph
