"""Tools: steps a model may call, each with a JSON schema derived from its type hints.

``@app.tool(risk="high", timeout_s=30)`` declares one. Inside a workflow a call is a journaled
step of kind ``tool``, preceded by a ``tool_called`` event (name, arguments, risk); an
``idempotency_key`` function replaces the step's default key (``lambda c:
f"{c.run_id}:{c.step_id}"``, the same key for every attempt). A tool with
``risk="critical"`` or ``requires_approval=True`` asks a person's approval (named after the
tool, showing its arguments) as a step of its own before each call in a workflow; rejected,
the call fails with ``ApprovalRejected`` without running.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ratchet.engine.context import workflow_run
from ratchet.engine.definitions import StepDef, StepKey, to_json
from ratchet.engine.retry import NO_RETRY, Retry
from ratchet.errors import InvalidInput
from ratchet.model import EventKind
from ratchet.names import check_step_name

if TYPE_CHECKING:
    from pydantic import BaseModel

RISKS = ("low", "medium", "high", "critical")


class ToolDef:
    """A declared tool: its step, its description and risk, and its argument schema."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        *,
        risk: str = "low",
        timeout_s: float | None = None,
        retry: Retry = NO_RETRY,
        idempotency_key: Callable[[StepKey], str] | None = None,
        description: str | None = None,
        requires_approval: bool = False,
        journal_args: bool = True,
    ) -> None:
        if isinstance(name, str):
            check_step_name(name, "tool")
        if risk not in RISKS:
            raise InvalidInput(f"tool {name}: risk must be one of {', '.join(RISKS)}, got {risk!r}")
        if idempotency_key is not None and not callable(idempotency_key):
            raise InvalidInput(
                f"tool {name}: idempotency_key must be a function of the step "
                f"(c.run_id, c.step_id, c.attempt), got {idempotency_key!r}"
            )
        if not isinstance(requires_approval, bool):
            raise InvalidInput(
                f"tool {name}: requires_approval must be True or False, got {requires_approval!r}"
            )
        self.fn = fn
        self.name = name
        self.risk = risk
        # A critical tool never runs in a workflow without a person's approval.
        self.requires_approval = requires_approval or risk == "critical"
        self.description = (description or inspect.getdoc(fn) or name).strip()
        self.signature = inspect.signature(fn)
        self.step = StepDef(
            fn,
            name,
            retry,
            timeout_s,
            kind="tool",
            key=idempotency_key,
            announce=self._announce,
            journal_args=journal_args,
        )
        self._model: type[BaseModel] | None = None

    def args_model(self) -> type[BaseModel]:
        """A pydantic model of the tool's parameters (built on first use)."""
        if self._model is None:
            from pydantic import create_model

            hints = inspect.get_annotations(self.fn, eval_str=True)
            fields: dict[str, Any] = {}
            for p in self.signature.parameters.values():
                if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    raise InvalidInput(
                        f"tool {self.name}: *args and **kwargs have no schema; name each parameter"
                    )
                default = ... if p.default is p.empty else p.default
                fields[p.name] = (hints.get(p.name, Any), default)
            self._model = create_model(f"{self.name}_arguments", **fields)
        return self._model

    def schema(self) -> dict[str, Any]:
        """The JSON schema of the tool's arguments."""
        schema: dict[str, Any] = self.args_model().model_json_schema()
        schema.pop("title", None)
        return schema

    def openai_tool(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.schema(),
            },
        }

    def anthropic_tool(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.schema()}

    def bind(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments from a model's JSON arguments, or
        :class:`InvalidInput` naming the tool and the problem."""
        import pydantic

        try:
            model = self.args_model().model_validate(dict(arguments))
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise InvalidInput(
                f"invalid arguments for tool {self.name}: {first['msg']}"
                f"{f' at {where}' if where else ''}"
            ) from None
        return {name: getattr(model, name) for name in self.signature.parameters}

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """A call's arguments by name, as JSON data (their repr if they are not JSON)."""
        try:
            bound = self.signature.bind(*args, **kwargs).arguments
            arguments: dict[str, Any] = json.loads(
                to_json(dict(bound), f"the arguments of tool {self.name}")
            )
        except Exception:
            arguments = {"repr": repr((args, kwargs))[:1000]}
        return arguments

    def _announce(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        called: dict[str, Any] = {"name": self.name, "risk": self.risk}
        if self.step.journal_args:
            called["arguments"] = self.arguments(args, kwargs)
        return EventKind.TOOL_CALLED, called


def make_tool(fn: Callable[..., Any], name: str | None, **options: Any) -> Any:
    """The callable ``@app.tool`` returns: a journaled step in a workflow, a plain call
    elsewhere; ``.tool`` is its :class:`ToolDef`."""
    td = ToolDef(fn, name or fn.__name__, **options)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        ctx = workflow_run()
        if ctx is None:
            return fn(*args, **kwargs)
        if td.requires_approval:
            from ratchet.engine.approvals import approve_then_call

            return approve_then_call(
                ctx, td.step, td.name, td.arguments(args, kwargs), args, kwargs
            )
        return ctx.call_step(td.step, args, kwargs)

    call.__ratchet_step__ = td.step  # type: ignore[attr-defined]
    call.tool = td  # type: ignore[attr-defined]
    return call


def tool_of(value: Any) -> ToolDef:
    td = getattr(value, "tool", None)
    if not isinstance(td, ToolDef):
        raise InvalidInput(f"{value!r} is not a tool: declare it with @app.tool")
    return td
