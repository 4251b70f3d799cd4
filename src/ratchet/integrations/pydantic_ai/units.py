"""Pydantic AI's durable units as Ratchet steps.

Pydantic AI hands an engine each durable operation as a named async body (a model request,
a tool call, an event for the stream handler, ...). Here each one becomes a step of the
running workflow: a model request of kind ``llm`` (usage and cost in its llm meta, as a
wrapped SDK client journals them), a tool call of kind ``tool`` (announced by a
``tool_called`` event), anything else a plain step. Tool argument validation is pure and
runs inline, unjournaled: it would add a step per tool call and decides nothing the
journaled model response does not already fix.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_ai.durable_exec import (
    CallableOperationBackend,
    DurableOperationId,
    JournalOperationNamer,
    ModelCompactMessagesId,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetValidateToolArgumentsId,
    record_durable_unit,
)
from pydantic_ai.durable_exec._utils import streamed_before_failing
from pydantic_ai.messages import ModelMessagesTypeAdapter

from ratchet.engine import connections
from ratchet.engine.context import current_step_info, workflow_run
from ratchet.engine.definitions import StepDef, to_json
from ratchet.engine.retry import Retry, as_policy
from ratchet.errors import InvalidInput, RatchetError
from ratchet.integrations.pydantic_ai.errors import as_ratchet_error
from ratchet.integrations.pydantic_ai.events import compact, expand
from ratchet.integrations.pydantic_ai.keys import request_key, send_keys
from ratchet.llm.prices import Usage, cost_usd
from ratchet.llm.tools import RISKS
from ratchet.llm.worst_case import worst_case
from ratchet.model import EventKind

Body = Callable[[], Awaitable[object]]
_CONFIG_KEYS = frozenset({"retry", "timeout_s", "risk"})


@dataclass(frozen=True, slots=True)
class UnitConfig:
    """How the steps of one kind of operation run: their retry policy, the timeout of each
    attempt, and (for tools) the risk their ``tool_called`` event reports."""

    retry: Retry
    timeout_s: float | None = None
    risk: str = "low"


def unit_config(
    value: Mapping[str, Any] | UnitConfig, default: UnitConfig, where: str
) -> UnitConfig:
    """A :class:`UnitConfig` from a tool's ``metadata={"ratchet": {...}}`` (``retry``,
    ``timeout_s``, ``risk``) over ``default``; an unknown key or a bad value is refused,
    naming ``where``."""
    if isinstance(value, UnitConfig):
        return value
    unknown = sorted(set(value) - _CONFIG_KEYS)
    if unknown:
        raise InvalidInput(
            f"{where}: unknown Ratchet option {', '.join(map(repr, unknown))}; "
            f"expected {', '.join(sorted(_CONFIG_KEYS))}"
        )
    retry = as_policy(value["retry"], default.retry) if "retry" in value else default.retry
    timeout_s = value.get("timeout_s", default.timeout_s)
    if timeout_s is not None and (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0
    ):
        raise InvalidInput(f"{where}: timeout_s must be a positive number, got {timeout_s!r}")
    risk = value.get("risk", default.risk)
    if risk not in RISKS:
        raise InvalidInput(f"{where}: risk must be one of {', '.join(RISKS)}, got {risk!r}")
    return UnitConfig(retry, timeout_s, risk)


class RatchetOperationBackend(CallableOperationBackend[Any]):
    """Runs each durable operation as a step of the workflow the agent runs in."""

    def __init__(
        self,
        *,
        agent_name: str,
        default_model_id: str | None,
        config: RoleBasedOperationConfig[Any],
        defaults: Mapping[str, UnitConfig],
    ) -> None:
        super().__init__(
            namer=JournalOperationNamer(agent_name, default_model_id=default_model_id or "default"),
            config=config,
        )
        self._defaults = defaults

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Body,
        cache_key: tuple[object, ...],
        config: Any,
    ) -> object:
        ctx = workflow_run()
        if ctx is None or isinstance(operation_id, ToolsetValidateToolArgumentsId):
            # Outside the workflow's own code (inside a step, say) an operation is a plain
            # call, as a wrapped client's is.
            return await body()
        ran = False

        async def unit(*_: Any, **__: Any) -> object:
            nonlocal ran
            ran = True
            return await body()

        if isinstance(operation_id, ModelRequestId | ModelCompactMessagesId):
            settings = unit_config(config, self._defaults["model"], name)
            http = _http_client(cache_key[-1])
            connections.used(http)
            send_keys(http)
            estimate = (
                _worst_case(operation_id, cache_key)
                if isinstance(operation_id, ModelRequestId)
                else None
            )
            sd = StepDef(
                _model_unit(unit),
                name,
                settings.retry,
                settings.timeout_s,
                kind="llm",
                encode=_llm_meta,
                decode=expand,
                worst_case=estimate,
            )
            started = {"model": operation_id.model_name}
            result = await ctx.call_step(sd, (), {}, started)
        elif isinstance(operation_id, ToolsetCallToolId):
            tool_name, tool_args = str(cache_key[0]), cache_key[1]
            settings = unit_config(config, self._defaults["tool"], f"tool {tool_name}")
            arguments = _arguments(tool_name, tool_args)
            sd = StepDef(
                unit,
                name,
                settings.retry,
                settings.timeout_s,
                kind="tool",
                announce=_announce(tool_name, arguments, settings.risk),
            )
            # The arguments are the step's own, so the runaway-loop guard tells two calls
            # of a tool apart by them, as it does any step's.
            result = await ctx.call_step(sd, (), {"arguments": arguments})
        else:
            settings = unit_config(config, self._defaults["other"], name)
            sd = StepDef(unit, name, settings.retry, settings.timeout_s)
            result = await ctx.call_step(sd, (), {})
        record_durable_unit(executed=ran)
        return result


def _model_unit(unit: Callable[..., Awaitable[object]]) -> Callable[..., Awaitable[object]]:
    """A model request's step code: the step's key goes with its HTTP request (.keys),
    Pydantic AI's model errors become Ratchet's, so the step's policy retries what is worth
    retrying; the time it took goes to the llm meta."""

    async def request() -> object:
        began = time.perf_counter()
        step = current_step_info.get()
        token = request_key.set(step.idempotency_key if step is not None else None)
        try:
            payload = await unit()
        except Exception as e:
            error = as_ratchet_error(e)
            if streamed_before_failing(e) is not None:
                # The event handler has seen part of this answer: a new attempt would show
                # it the beginning again.
                error.retry_class = "never"  # type: ignore[attr-defined]
            raise error from e
        finally:
            request_key.reset(token)
        return _Timed(payload, round((time.perf_counter() - began) * 1000, 3))

    return request


@dataclass(frozen=True, slots=True)
class _Timed:
    payload: object
    latency_ms: float


def _llm_meta(result: Any) -> tuple[Any, dict[str, Any]]:
    """The journaled output (the response as Pydantic AI's own adapter dumps it) and the
    step's llm meta: provider, model, usage, cost, latency and the provider's response id."""
    assert isinstance(result, _Timed)
    payload = result.payload
    response = payload.get("response", payload) if isinstance(payload, dict) else {}
    if not isinstance(response, dict):
        response = {}
    u = response.get("usage") or {}
    details = u.get("details") or {}
    usage = Usage(
        input_tokens=_int(u.get("input_tokens")),
        output_tokens=_int(u.get("output_tokens")),
        cached_tokens=_int(u.get("cache_read_tokens")),
        cache_write_tokens=_int(u.get("cache_write_tokens")),
        reasoning_tokens=_int(details.get("reasoning_tokens")),
    )
    model = response.get("model_name")
    meta = {
        "provider": response.get("provider_name"),
        "model": model,
        "usage": usage.as_json(),
        "cost_usd": cost_usd(model, usage),
        "latency_ms": result.latency_ms,
        "request_id": response.get("provider_response_id"),
    }
    return compact(payload), {"llm": meta}


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _http_client(run_context: Any) -> Any:
    """The HTTP client the run's model sends with (an ``OpenAIChatModel``'s or an
    ``AnthropicModel``'s SDK client's), whose connections the running loop owns."""
    model = getattr(run_context, "model", None)
    while getattr(model, "wrapped", None) is not None:  # a WrapperModel
        model = model.wrapped  # type: ignore[union-attr]
    return connections.http_client_of(getattr(model, "client", None))


def _worst_case(
    operation_id: DurableOperationId, cache_key: tuple[object, ...]
) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[int, float | None]]:
    """The budgets' look at a model request before it is sent: its ``max_tokens`` (from
    its model settings) and its prompt (messages and tool definitions), as the wrapped
    clients estimate theirs. Only a run with a token or money budget asks for it."""

    def estimate(_args: tuple[Any, ...], _kwargs: dict[str, Any]) -> tuple[int, float | None]:
        messages: Any = cache_key[1]
        settings, parameters = cache_key[2], cache_key[3]
        request: dict[str, Any] = {"model": getattr(operation_id, "model_name", None)}
        limit = settings.get("max_tokens") if isinstance(settings, Mapping) else None
        if limit is not None:
            request["max_tokens"] = limit
        request["messages"] = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
        tools = getattr(parameters, "function_tools", None) or []
        request["tools"] = [
            dataclasses.asdict(t)
            for t in tools
            if dataclasses.is_dataclass(t) and not isinstance(t, type)
        ]
        return worst_case((), request)

    return estimate


def _arguments(tool_name: str, tool_args: Any) -> Any:
    """A tool call's arguments as JSON data (as its ``tool_called`` event reports them)."""
    try:
        return json.loads(to_json(tool_args, f"the arguments of tool {tool_name}"))
    except RatchetError:
        return {"repr": repr(tool_args)[:1000]}


def _announce(
    tool_name: str, arguments: Any, risk: str
) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[str, dict[str, Any]]]:
    def announce(_args: tuple[Any, ...], _kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return EventKind.TOOL_CALLED, {"name": tool_name, "arguments": arguments, "risk": risk}

    return announce
