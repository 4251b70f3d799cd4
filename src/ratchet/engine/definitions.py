"""What the decorators produce: workflow and step definitions.

Values cross the journal as JSON. A definition's annotations say what they become again:
each parameter and each return annotation gets a pydantic ``TypeAdapter``, built on first
use (so a forward reference to a class defined later in the module resolves), which checks
a workflow's arguments at start, stores their JSON form, and revives stored arguments and
outputs as the annotated types (a model, ``User | None``, ``list[User]``, a datetime).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ratchet.engine.guards import Guards
from ratchet.engine.retry import NO_RETRY, Retry
from ratchet.errors import InvalidInput, NotSerializable
from ratchet.model import dumps
from ratchet.sandbox.spec import Sandbox

if TYPE_CHECKING:
    from pydantic import TypeAdapter, ValidationError

_EMPTY = inspect.Parameter.empty
# The JSON escape of a NUL character, not preceded by a backslash that escapes its own.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# Annotations that say nothing about a JSON value: the value is used as it is.
_OPAQUE: tuple[Any, ...] = (_EMPTY, Any, object)
_OPAQUE_NAMES = frozenset({"Any", "typing.Any", "object"})
# A value of exactly this type already is what the annotation asks for: no validation
# (and no copy) on the per-step hot path for the commonest annotations.
_NATIVE = {int: int, str: str, bool: bool, float: float, dict: dict, list: list,
           None: type(None), type(None): type(None)}
# Of those, the ones whose value is its own JSON form (a dict or list may hold values that
# the adapter would turn into JSON, a datetime say).
_SCALARS = frozenset({int, str, bool, float, type(None)})


def check_name(value: Any, what: str) -> str:
    """``value`` if it is a non-empty string the database can store, else
    :class:`InvalidInput` naming ``what`` (PostgreSQL text refuses NUL, and UTF-8 cannot
    hold a lone surrogate)."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"invalid {what} {value!r}: expected a non-empty string")
    if "\x00" in value:
        raise InvalidInput(f"invalid {what} {value!r}: it contains a NUL character, "
                           "which the database cannot store")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidInput(f"invalid {what} {value!r}: it contains a lone surrogate, "
                               "which UTF-8 cannot store") from None
    return value


def to_json(value: Any, what: str) -> str:
    """``value`` as canonical JSON, or :class:`NotSerializable` naming ``what``."""
    try:
        text = dumps(value)
    except (TypeError, ValueError) as e:
        raise NotSerializable(f"{what} is not JSON-serialisable: {e}") from e
    # A NUL character is written \u0000, and PostgreSQL's jsonb refuses it: refused here on
    # both backends, so a value stores the same everywhere. (An escaped backslash before
    # "u0000" is text, not a NUL: the regex asks for an even run of backslashes before it.)
    if "\\u0000" in text and _NUL.search(text):
        raise NotSerializable(f"{what} is not JSON-serialisable: it holds a NUL character "
                              "(\\u0000), which PostgreSQL's jsonb cannot store")
    # str.isascii() is O(1) in CPython, so only text with non-ASCII characters pays for
    # the check that it can be stored as UTF-8 (a lone surrogate cannot).
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as e:
            raise NotSerializable(
                f"{what} is not JSON-serialisable: it holds a lone surrogate "
                f"{text[e.start]!r}, which UTF-8 cannot store") from None
    return text


class _Codec:
    """One annotation's way between a value and its JSON form. The pydantic adapter is
    built on first need: a value whose type already is the annotation's (an ``int`` for
    ``int``) never needs one, and building the first adapter of a process costs
    milliseconds (pydantic looks for plugins), which a recovering worker should not pay."""

    __slots__ = ("_adapter", "annotation", "native")

    _UNBUILT: Any = object()

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        self.native = _NATIVE.get(annotation) if _hashable(annotation) else None
        opaque = any(annotation is o for o in _OPAQUE)
        self._adapter: TypeAdapter[Any] | None = None if opaque else self._UNBUILT

    @property
    def adapter(self) -> TypeAdapter[Any] | None:
        if self._adapter is self._UNBUILT:
            # Imported here: a process whose values are all plain JSON never loads pydantic.
            from pydantic import TypeAdapter
            from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError

            try:
                self._adapter = TypeAdapter(self.annotation)
            except (PydanticSchemaGenerationError, PydanticUserError):
                # A type pydantic cannot describe (a queue, a callable): it cannot come
                # from JSON either, so the value is left as the journal holds it.
                self._adapter = None
        return self._adapter

    def check(self, value: Any) -> Any:
        """Validate a caller's value; return its JSON form."""
        if self._adapter is None or (type(value) is self.native and self.native in _SCALARS):
            return value
        adapter = self.adapter
        if adapter is None:
            return value
        return _validated(lambda: adapter.dump_python(adapter.validate_python(value),
                                                      mode="json"))

    def revive(self, value: Any) -> Any:
        """The annotated type from a JSON value."""
        if self._adapter is None or type(value) is self.native:
            return value
        adapter = self.adapter
        return value if adapter is None else _validated(lambda: adapter.validate_python(value))


class _Invalid(Exception):
    """A value does not fit its annotation; the message says where and why."""


def _validated(call: Callable[[], Any]) -> Any:
    import pydantic

    try:
        return call()
    except pydantic.ValidationError as e:
        raise _Invalid(_message(e)) from None


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _annotation(fn: Callable[..., Any], key: str, what: str) -> Any:
    """The annotation ``key`` (a parameter's name, or ``return``) of ``fn``, evaluated if
    it is a string (``from __future__ import annotations``, forward references)."""
    fn = inspect.unwrap(fn)
    raw = getattr(fn, "__annotations__", {}).get(key, _EMPTY)
    if not isinstance(raw, str):
        return raw
    if raw in _OPAQUE_NAMES:
        return Any
    try:
        scope = dict(inspect.getclosurevars(fn).nonlocals)
        return eval(raw, getattr(fn, "__globals__", {}), scope)
    except Exception as e:
        raise InvalidInput(f"cannot resolve the annotation {raw!r} of {what}: "
                           f"{type(e).__name__}: {e} (define the types it names at module "
                           "level)") from e


def _message(e: ValidationError) -> str:
    first = e.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{first['msg']}{f' at {where}' if where else ''}{more}"


@dataclass(frozen=True, slots=True)
class StepKey:
    """What a step's own idempotency key may be made of."""

    run_id: str
    step_id: str
    attempt: int  # the attempt whose key it is: after an unknown outcome, the one before
    workflow: str


@dataclass(slots=True)
class StepDef:
    """A function decorated with ``@app.step``."""

    fn: Callable[..., Any]
    name: str
    retry: Retry = NO_RETRY
    timeout_s: float | None = None
    is_async: bool = False
    # What kind of step it is in the journal ("llm", "tool"; None for a plain step).
    kind: str | None = None
    # Splits what the code returned into the output to journal and more fields for the
    # step_completed event (an LLM call's usage and cost); None: the return value is the output.
    encode: Callable[[Any], tuple[Any, dict[str, Any]]] | None = None
    # Rebuilds the step's value from its journaled output; None: from the return annotation.
    decode: Callable[[Any], Any] | None = None
    # The step's idempotency key from (run id, step id, attempt), in place of the default
    # sha256 of the three; None: the default.
    key: Callable[[StepKey], str] | None = None
    # An event to journal before each attempt starts: (kind, payload) from the call's
    # arguments (a tool's ``tool_called``); None: none.
    announce: Callable[[tuple[Any, ...], dict[str, Any]], tuple[str, dict[str, Any]]] | None = None
    # The most a call may spend, from its arguments: (tokens, USD or None when unpriced),
    # which the budgets check before it is sent; None: the step spends nothing they count.
    worst_case: Callable[[tuple[Any, ...], dict[str, Any]], tuple[int, float | None]] | None = None
    _returns: _Codec | None = None

    def __post_init__(self) -> None:
        check_name(self.name, "step name")
        self.is_async = inspect.iscoroutinefunction(self.fn)
        if self.timeout_s is not None and (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, int | float)
            or self.timeout_s <= 0
        ):
            raise InvalidInput(f"step {self.name}: timeout_s must be a positive number, "
                               f"got {self.timeout_s!r}")

    def revive(self, value: Any) -> Any:
        """The step's output as its return annotation says, from its JSON form."""
        if self.decode is not None:
            return self.decode(value)
        codec = self._returns
        if codec is None:
            what = f"step {self.name}"
            codec = self._returns = _Codec(_annotation(self.fn, "return", what))
        try:
            return codec.revive(value)
        except _Invalid as e:
            raise NotSerializable(f"the output of step {self.name} does not fit its return "
                                  f"annotation {codec.annotation!r}: {e}") from None


@dataclass(slots=True)
class WorkflowDef:
    """A coroutine function decorated with ``@app.workflow``. Calling it directly runs
    it as plain code; ``app.start`` runs it durably."""

    fn: Callable[..., Any]
    name: str
    version: str = "1"
    guards: Guards | None = None  # None: the defaults
    # Set for the isolated tier: each attempt runs in a sandbox of this shape.
    sandbox: Sandbox | None = None
    signature: inspect.Signature = field(init=False)
    _returns: _Codec | None = None
    _params: dict[str, _Codec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name, "workflow name")
        check_name(self.version, f"version of workflow {self.name}")
        if not inspect.iscoroutinefunction(self.fn):
            raise InvalidInput(f"workflow {self.name} must be an async def function")
        self.signature = inspect.signature(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def _param_for(self, position: int | None, keyword: str | None) -> inspect.Parameter | None:
        """The parameter a positional argument (by position) or a keyword argument binds to."""
        params = list(self.signature.parameters.values())
        if position is not None:
            positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                          p.POSITIONAL_OR_KEYWORD)]
            if position < len(positional):
                return positional[position]
            return next((p for p in params if p.kind == p.VAR_POSITIONAL), None)
        for p in params:
            if p.name == keyword and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                return p
        return next((p for p in params if p.kind == p.VAR_KEYWORD), None)

    def _codec(self, param: inspect.Parameter | None) -> _Codec | None:
        if param is None:
            return None
        codec = self._params.get(param.name)
        if codec is None:
            what = f"parameter {param.name!r} of workflow {self.name}"
            codec = self._params[param.name] = _Codec(_annotation(self.fn, param.name, what))
        return codec

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The run's stored input, after checking the arguments fit the signature and the
        annotations, and serialise; raises before anything is written."""
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise InvalidInput(
                f"arguments do not fit workflow {self.name}{self.signature}: {e}"
            ) from e
        value = {"args": [self._check(self._param_for(i, None), v) for i, v in enumerate(args)],
                 "kwargs": {k: self._check(self._param_for(None, k), v)
                            for k, v in kwargs.items()}}
        stored: dict[str, Any] = json.loads(to_json(value, f"the input of workflow {self.name}"))
        return stored

    def _check(self, param: inspect.Parameter | None, value: Any) -> Any:
        codec = self._codec(param)
        if codec is None or param is None:
            return value
        try:
            return codec.check(value)
        except _Invalid as e:
            raise InvalidInput(f"invalid argument {param.name!r} of workflow {self.name}: "
                               f"expected {codec.annotation!r}, got {value!r}: "
                               f"{e}") from None

    def call_args(self, stored: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The arguments to call the workflow with, revived from its stored input through
        the same annotations that checked them at start (a model parameter gets the model)."""
        args = [self._revive(self._param_for(i, None), v)
                for i, v in enumerate(stored.get("args", []))]
        kwargs = {k: self._revive(self._param_for(None, k), v)
                  for k, v in stored.get("kwargs", {}).items()}
        return args, kwargs

    def _revive(self, param: inspect.Parameter | None, value: Any) -> Any:
        codec = self._codec(param)
        if codec is None or param is None:
            return value
        try:
            return codec.revive(value)
        except _Invalid as e:
            raise NotSerializable(f"the stored argument {param.name!r} of workflow "
                                  f"{self.name} does not fit its annotation "
                                  f"{codec.annotation!r}: {e}") from None

    def revive(self, value: Any) -> Any:
        """The workflow's result as its return annotation says, from its JSON form."""
        codec = self._returns
        if codec is None:
            what = f"workflow {self.name}"
            codec = self._returns = _Codec(_annotation(self.fn, "return", what))
        try:
            return codec.revive(value)
        except _Invalid as e:
            raise NotSerializable(f"the result of workflow {self.name} does not fit its "
                                  f"return annotation {codec.annotation!r}: "
                                  f"{e}") from None
