"""The graph format: pydantic models of a graph file (YAML or JSON).

A graph has a ``name``, an optional ``version`` (its content hash is its identity either
way), ``inputs`` (a JSON Schema of the run's input), ``nodes`` (``id``, ``type``, ``data``),
``edges`` (``from``, ``to``, optional ``when``) and an optional ``output``. Each node type
has a data model of its own, so a misspelt field is named rather than ignored. Any node may
carry ``data.retry`` (``{"maxAttempts", "backoffMs", "retryableClasses"}``) and
``timeout_s`` (on the node or in its data). ``tier: isolated`` runs each attempt of a run
in a sandbox (``sandbox`` holds the ``ratchet.Sandbox`` fields), like an isolated code
workflow.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NODE_ID = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
Tier = Literal["process", "isolated"]


# What every node's data may hold: its retry policy and its attempts' time limit. (No
# docstring: a model's docstring would become a description in the graph JSON schema.)
class NodeData(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    retry: dict[str, Any] | None = Field(
        None,
        description='{"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["llm"]}; '
        "maxAttempts counts the first try; classes any, timeout, llm, "
        "connector, tool",
    )
    timeout_s: float | None = Field(None, gt=0, description="Seconds an attempt may take.")


class TriggerData(NodeData):
    description: str | None = None


class AiStepData(NodeData):
    model: str = Field(description="The model's name, e.g. gpt-4.1-mini or claude-sonnet-4-6.")
    prompt: str = Field(description="The user message: a template.")
    system: str | None = Field(None, description="The system message: a template.")
    provider: Literal["openai", "anthropic"] | None = Field(
        None, description="Default: anthropic for a claude model, openai otherwise."
    )
    tools: list[str] = Field(
        default_factory=list, description="Names of @app.tool tools the model may call."
    )
    output_schema: dict[str, Any] | None = Field(
        None, description="A JSON Schema: the answer is parsed as JSON of this shape."
    )
    max_tokens: int = Field(1024, ge=1)
    max_turns: int = Field(10, ge=1, description="With tools: model turns at most.")
    gate: dict[str, Any] | None = Field(
        None,
        description='A confidence gate: {"threshold": 0.8, "source": '
        '"field:confidence" | "logprobs" | "judge", "on_below": "approval" '
        '| "retry" | "fail" | "branch", "retry_model", "judge_model", '
        '"judge_prompt"}.',
    )


class ToolData(NodeData):
    tool: str = Field(description="The name of an @app.tool tool.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments; string values are templates."
    )


class ConnectorData(NodeData):
    kind: Literal["http", "webhook", "email"] = "http"
    url: str | None = Field(None, description="http/webhook: the URL (a template).")
    method: str = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any = Field(None, description="The JSON body (http/webhook) or the email's text.")
    to: str | None = Field(None, description="email: the recipient.")
    subject: str | None = Field(None, description="email: the subject.")
    sender: str | None = Field(None, alias="from", description="email: the sender.")
    policy: Literal["resend", "at_most_once"] = Field(
        "resend",
        description="webhook/email: what a re-drive does with a delivery left "
        "claimed by a crash (see ratchet.deliver).",
    )


class SubagentData(NodeData):
    graph: str | None = Field(None, description="A registered graph to run as a child run.")
    workflow: str | None = Field(None, description="Or a code workflow of the app.")
    input: Any = Field(
        None,
        description="The child's input (graph) or keyword arguments "
        "(workflow); strings are templates.",
    )


class ApprovalData(NodeData):
    name: str | None = Field(None, description="What is asked (default: the node's id).")
    ask: Any = Field(None, description="The data shown to the person; strings are templates.")


class LoopData(NodeData):
    body: list[str] = Field(min_length=1, description="Ids of the nodes run each iteration.")
    over: str | None = Field(None, description="A template giving a list: one iteration each.")
    until: str | None = Field(None, description="An expression checked after each iteration.")
    max_iterations: int = Field(100, ge=1)
    item: str = Field("item", description="The name of the current item in templates.")


class ConditionData(NodeData):
    expression: str = Field(description="An expression; outgoing edges test it as `output`.")


class ParallelData(NodeData):
    pass


class JoinData(NodeData):
    pass


class OutputData(NodeData):
    value: Any = Field(None, description="The run's result; strings are templates.")


DATA_MODELS: dict[str, type[NodeData]] = {
    "trigger": TriggerData,
    "ai-step": AiStepData,
    "tool": ToolData,
    "connector": ConnectorData,
    "subagent": SubagentData,
    "approval": ApprovalData,
    "loop": LoopData,
    "condition": ConditionData,
    "parallel": ParallelData,
    "join": JoinData,
    "output": OutputData,
}
NODE_TYPES = tuple(DATA_MODELS)


SANDBOX_HELP = (
    "tier isolated: the sandbox's limits (ratchet.Sandbox fields): memory_mb, cpus, "
    "timeout_s, network (none | report-only), mounts, max_processes."
)


class Edge(BaseModel):
    """``from`` → ``to``; with ``when`` (an expression over ``output``, the source node's
    output, and ``input``, ``nodes``), taken only when it is true."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    source: str = Field(alias="from")
    target: str = Field(alias="to")
    when: str | None = None


class RawNode(BaseModel):
    """A node before its type is checked: ``data`` is validated by the type's model."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=NODE_ID)
    type: str
    data: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = Field(None, gt=0)


class RawGraph(BaseModel):
    """A graph file's top level."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    version: str | None = None
    description: str | None = None
    inputs: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    nodes: list[RawNode] = Field(min_length=1)
    edges: list[Edge] = Field(default_factory=list)
    output: Any = None
    guards: dict[str, Any] | None = Field(
        None,
        description="The graph's guards (ratchet.Guards fields): thresholds, budgets, actions.",
    )
    tier: Tier = Field(
        "process", description="isolated: each attempt runs in a sandbox of its own."
    )
    sandbox: dict[str, Any] | None = Field(None, description=SANDBOX_HELP)


def _typed_node(kind: str, data: type[NodeData]) -> type[BaseModel]:
    fields: dict[str, Any] = {
        "id": (str, Field(pattern=NODE_ID)),
        "type": (Literal[kind], ...),
        "data": (data, Field(default_factory=data) if kind in _EMPTY_OK else ...),
        "timeout_s": (float | None, Field(None, gt=0)),
    }
    from pydantic import create_model

    name = "".join(part.capitalize() for part in kind.split("-")) + "Node"
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


_EMPTY_OK = frozenset({"trigger", "parallel", "join", "output"})


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the graph format (for editors): nodes discriminated by type."""
    from pydantic import create_model

    typed = [_typed_node(kind, model) for kind, model in DATA_MODELS.items()]
    union: Any = typed[0]
    for t in typed[1:]:
        union = union | t
    annotated: Any = Annotated  # built at run time from the node models
    node_list: Any = list[annotated[union, Field(discriminator="type")]]  # type: ignore[misc]
    graph = create_model(
        "Graph",
        __config__=ConfigDict(extra="forbid"),
        name=(str, Field(pattern=RawGraph.model_fields["name"].metadata[0].pattern)),
        version=(str | None, None),
        description=(str | None, None),
        inputs=(dict[str, Any], Field(default_factory=lambda: {"type": "object"})),
        nodes=(node_list, Field(min_length=1)),
        edges=(list[Edge], Field(default_factory=list)),
        output=(Any, None),
        guards=(dict[str, Any] | None, None),
        tier=(Tier, "process"),
        sandbox=(dict[str, Any] | None, Field(None, description=SANDBOX_HELP)),
    )
    schema: dict[str, Any] = graph.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Ratchet graph"
    return schema
