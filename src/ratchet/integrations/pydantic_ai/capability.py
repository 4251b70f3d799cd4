"""``RatchetDurability``: the capability that puts a Pydantic AI agent's model requests and
tool calls on Ratchet's journal.

It follows Pydantic AI's engine-builder surface (``BaseDurabilityCapability`` with a
callable backend): the base assembles the durable model and toolsets, this class says how
Ratchet runs their units (:mod:`.units`) and what stays stable across a replay (the run's
id, its start time, its waits).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic_ai._agent_graph import set_agent_graph_sleep
from pydantic_ai._utils import now_utc
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    ModelRequestParams,
    RoleBasedOperationConfig,
    ToolsetKind,
    conversation_id_from_run_id,
    replay_scope,
)
from pydantic_ai.durable_exec._toolset import DurableDynamicToolset
from pydantic_ai.durable_exec._utils import StreamedActivityResult, StreamedModelRequestResult
from pydantic_ai.messages import ModelResponseStreamEvent
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets._dynamic import DynamicToolset

from ratchet.engine.context import workflow_run
from ratchet.engine.definitions import StepDef
from ratchet.engine.retry import NO_RETRY, Retry, as_policy
from ratchet.errors import InvalidInput, NotSerializable
from ratchet.integrations.pydantic_ai.events import recorder, recording
from ratchet.integrations.pydantic_ai.toolsets import holding_per_run_step
from ratchet.integrations.pydantic_ai.units import RatchetOperationBackend, UnitConfig
from ratchet.llm.wrap import DEFAULT_RETRY

if TYPE_CHECKING:
    from pydantic_ai.agent import EventStreamHandler
    from pydantic_ai.capabilities.abstract import WrapRunHandler
    from pydantic_ai.models import Model
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.tools import RunContext

    from ratchet.engine.drive import Drive

# Agent runs started in each drive so far, for replay-stable run ids: a drive re-executes
# the workflow from the top, so its n-th agent run is the same run every time.
_runs_started: weakref.WeakKeyDictionary[Drive, Iterator[int]] = weakref.WeakKeyDictionary()


def _serialization_failure(e: Exception) -> BaseException:
    return NotSerializable(f"a Pydantic AI value cannot be journaled as JSON: {e}")


@dataclass(init=False, kw_only=True)
class RatchetDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent's runs inside Ratchet workflows durable:
    ``Agent(model, name="support", capabilities=[RatchetDurability()])``.

    Inside a workflow each model request is a step of kind ``llm`` (retried under
    ``model_retry``, default :data:`ratchet.llm.DEFAULT_RETRY`, each attempt bounded by
    ``model_timeout_s``), sent with ``Idempotency-Key: <the step's key>``, and each tool call
    a step of kind ``tool`` (``tool_retry``, default no retry; ``tool_timeout_s``). A tool's
    ``metadata={"ratchet": {"retry": ..., "timeout_s": ..., "risk": "high"}}`` overrides
    them for that tool; ``{"ratchet": False}`` runs it inline, unjournaled. ``models`` names
    further models a run may switch to; ``event_stream_handler`` receives the run's events
    (model events live, from inside the request's step); ``name`` (default: the agent's)
    prefixes the step names.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="Ratchet",
        durable_unit_noun="step",
        durable_container_noun="workflow",
        codec=JSON_CODEC,  # the journal holds JSON
        serialization_failure=_serialization_failure,
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        journal_discovery=True,
        # Steps are numbered in call order. Tools run one after another, so every replay
        # calls them, and numbers their steps, in the same order.
        sequential_tools_in_durable_context=True,
        tool_config_key="ratchet",
    )

    def __init__(
        self,
        *,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        name: str | None = None,
        model_retry: Retry | Mapping[str, Any] | None = None,
        model_timeout_s: float | None = None,
        tool_retry: Retry | Mapping[str, Any] | None = None,
        tool_timeout_s: float | None = None,
    ) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        # Built now, so a bad policy or timeout is refused where the capability is made.
        for what, value in (
            ("model_timeout_s", model_timeout_s),
            ("tool_timeout_s", tool_timeout_s),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise InvalidInput(
                    f"RatchetDurability: {what} must be a positive number, got {value!r}"
                )
        self._model_unit = UnitConfig(as_policy(model_retry, DEFAULT_RETRY), model_timeout_s)
        self._tool_unit = UnitConfig(as_policy(tool_retry, NO_RETRY), tool_timeout_s)
        self._other_unit = UnitConfig(NO_RETRY)

    # -- where the agent runs ----------------------------------------------------------------

    @property
    def in_durable_context(self) -> bool:
        return workflow_run() is not None

    def get_default_run_id(self) -> str | None:
        drive = workflow_run()
        if drive is None:
            return None
        runs = _runs_started.setdefault(drive, itertools.count(1))
        return f"{drive.run_id}:agent:{next(runs)}"

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        drive = workflow_run()
        if drive is None:
            return None

        # A step, so a re-driven run counts the agent run's timeout= from when it first began.
        async def started() -> str:
            return now_utc().isoformat()

        sd = StepDef(started, f"{self.name}__run_start_time")
        return datetime.fromisoformat(await drive.call_step(sd, (), {}))

    async def wrap_run(
        self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        if not self.in_durable_context:
            return await handler()
        # The agent's own waits become durable sleeps, and spans and metrics of replayed
        # units stay out of telemetry.
        with set_agent_graph_sleep(_durable_sleep), replay_scope():
            return await super().wrap_run(ctx, handler=handler)

    # -- how its units run -------------------------------------------------------------------

    def get_durable_operation_backend(self) -> RatchetOperationBackend:
        def tool_config(operation_id: Any, tool: Any, tool_name: str) -> Any:
            base = self._build_resolve_tool_config(self._tool_config_base())
            return base(tool, tool_name)

        return RatchetOperationBackend(
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(
                model=self._model_unit,
                event=self._other_unit,
                capability=self._other_unit,
                tool=self._tool_unit,
                resolve_tool=tool_config,
            ),
            defaults={
                "model": self._model_unit,
                "tool": self._tool_unit,
                "other": self._other_unit,
            },
        )

    def _tool_config_base(self) -> dict[str, Any]:
        unit = self._tool_unit
        return {"retry": unit.retry, "timeout_s": unit.timeout_s, "risk": unit.risk}

    def _toolset_base_config(self, kind: ToolsetKind) -> Any:
        return self._tool_config_base()

    # The base's streamed request returns its response alone, and the workflow side then
    # replays each part as one event; returned with the events it streamed (journaled by
    # the step, see .events), the workflow side replays those, delta for delta.
    async def _model_request_stream_operation(  # type: ignore[override]
        self, params: ModelRequestParams
    ) -> StreamedModelRequestResult:
        recorded: list[ModelResponseStreamEvent] = []
        token = recording.set(recorded)
        try:
            response = await super()._model_request_stream_operation(params)
        finally:
            recording.reset(token)
        return StreamedActivityResult(response=response, events=recorded)

    def _model_stream_event_handler(self) -> EventStreamHandler[AgentDepsT] | None:
        return recorder(super()._model_stream_event_handler())

    def _build_dynamic_toolset(
        self, toolset: DynamicToolset[AgentDepsT]
    ) -> DurableDynamicToolset[AgentDepsT]:
        return holding_per_run_step(super()._build_dynamic_toolset(toolset))


async def _durable_sleep(seconds: float) -> None:
    drive = workflow_run()
    if drive is None:  # a wait inside a step: an ordinary one
        import anyio

        await anyio.sleep(seconds)
        return
    await drive.sleep(seconds)
