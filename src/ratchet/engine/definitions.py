"""What the decorators produce: workflow and step definitions."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ratchet.engine.retry import NO_RETRY, Retry
from ratchet.errors import InvalidInput, NotSerializable
from ratchet.model import dumps


def _model_type(fn: Callable[..., Any]) -> Any:
    """The return annotation when it is a pydantic model, so replayed outputs come back
    as that model rather than as its JSON form."""
    try:
        hint = inspect.signature(fn, eval_str=True).return_annotation
    except (NameError, TypeError, ValueError):
        return None
    return hint if callable(getattr(hint, "model_validate", None)) else None


@dataclass(slots=True)
class StepDef:
    """A function decorated with ``@app.step``."""

    fn: Callable[..., Any]
    name: str
    retry: Retry = NO_RETRY
    timeout_s: float | None = None
    is_async: bool = False
    model: Any = None

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.fn)
        self.model = _model_type(self.fn)
        if self.timeout_s is not None and (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, int | float)
            or self.timeout_s <= 0
        ):
            raise InvalidInput(f"step {self.name}: timeout_s must be a positive number, "
                               f"got {self.timeout_s!r}")

    def revive(self, value: Any) -> Any:
        return self.model.model_validate(value) if self.model is not None else value


@dataclass(slots=True)
class WorkflowDef:
    """A coroutine function decorated with ``@app.workflow``. Calling it directly runs
    it as plain code; ``app.start`` runs it durably."""

    fn: Callable[..., Any]
    name: str
    version: str = "1"
    signature: inspect.Signature = field(init=False)
    model: Any = None

    def __post_init__(self) -> None:
        if not inspect.iscoroutinefunction(self.fn):
            raise InvalidInput(f"workflow {self.name} must be an async def function")
        self.signature = inspect.signature(self.fn)
        self.model = _model_type(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The run's stored input, after checking the arguments fit the signature and
        serialise; raises before anything is written."""
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise InvalidInput(
                f"arguments do not fit workflow {self.name}{self.signature}: {e}"
            ) from e
        value = {"args": list(args), "kwargs": kwargs}
        stored: dict[str, Any] = json.loads(to_json(value, f"the input of workflow {self.name}"))
        return stored

    def revive(self, value: Any) -> Any:
        return self.model.model_validate(value) if self.model is not None else value


def to_json(value: Any, what: str) -> str:
    """``value`` as canonical JSON, or :class:`NotSerializable` naming ``what``."""
    try:
        return dumps(value)
    except (TypeError, ValueError) as e:
        raise NotSerializable(f"{what} is not JSON-serialisable: {e}") from e
