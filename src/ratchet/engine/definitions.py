"""What the decorators produce: workflow and step definitions.

Values cross the journal as JSON (see :mod:`ratchet.engine.values`). A definition's
annotations say what they become again: each parameter and each return annotation gets a
:class:`~ratchet.engine.values.Codec`, built on first use (so a forward reference to a
class defined later in the module resolves), which checks a workflow's arguments at start,
writes their JSON form and a step's output and a workflow's result through the
annotation's pydantic ``TypeAdapter``, and revives stored values as the annotated types (a
model, ``User | None``, ``list[User]``, a datetime, a dataclass).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ratchet.engine import evidence
from ratchet.engine.guards import Guards
from ratchet.engine.retry import NO_RETRY, Retry
from ratchet.engine.values import Codec, Invalid, opaque_name
from ratchet.engine.values import to_json as to_json  # where the features import it from
from ratchet.errors import InvalidInput, NotSerializable
from ratchet.names import quote

_EMPTY = inspect.Parameter.empty
# What a workflow may ask a replay to do with a model request that drifted.
REQUEST_DRIFT = ("error", "warn")


def check_name(value: Any, what: str) -> str:
    """``value`` if it is a non-empty string the database can store, else
    :class:`InvalidInput` naming ``what`` (PostgreSQL text refuses NUL, and UTF-8 cannot
    hold a lone surrogate)."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"invalid {what} {value!r}: expected a non-empty string")
    if "\x00" in value:
        raise InvalidInput(
            f"invalid {what} {value!r}: it contains a NUL character, "
            "which the database cannot store"
        )
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidInput(
                f"invalid {what} {value!r}: it contains a lone surrogate, which UTF-8 cannot store"
            ) from None
    return value


def _annotation(
    fn: Callable[..., Any], key: str, what: str, error: type[InvalidInput] = InvalidInput
) -> Any:
    """The annotation ``key`` (a parameter's name, or ``return``) of ``fn``, evaluated if
    it is a string (``from __future__ import annotations``, forward references); raises
    ``error`` where it cannot be."""
    fn = inspect.unwrap(fn)
    raw = getattr(fn, "__annotations__", {}).get(key, _EMPTY)
    if not isinstance(raw, str):
        return raw
    if opaque_name(raw):
        return Any
    try:
        scope = dict(inspect.getclosurevars(fn).nonlocals)
        return eval(raw, getattr(fn, "__globals__", {}), scope)
    except Exception as e:
        raise error(
            f"cannot resolve the annotation {raw!r} of {what}: "
            f"{type(e).__name__}: {e} (define the types it names at module "
            "level)"
        ) from e


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
    # Whether step_started journals the arguments (see ratchet.engine.evidence); False for
    # a step whose arguments must not be stored.
    journal_args: bool = True
    # The model request a call makes, from its arguments: (messages, params) as JSON,
    # journaled in step_started content-addressed (see ratchet.model.requests) and checked
    # against the journal when a completed call is replayed; None: not a model call.
    request: (
        Callable[[tuple[Any, ...], dict[str, Any]], tuple[list[Any], dict[str, Any]]] | None
    ) = None
    _returns: Codec | None = None
    _params: tuple[tuple[str, ...], str] | None = None

    def __post_init__(self) -> None:
        check_name(self.name, "step name")
        if not isinstance(self.journal_args, bool):
            raise InvalidInput(
                f"step {self.name}: journal_args must be True or False, got {self.journal_args!r}"
            )
        self.is_async = inspect.iscoroutinefunction(self.fn)
        if self.timeout_s is not None and (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, int | float)
            or self.timeout_s <= 0
        ):
            raise InvalidInput(
                f"step {self.name}: timeout_s must be a positive number, got {self.timeout_s!r}"
            )

    def _codec(self) -> Codec:
        codec = self._returns
        if codec is None:
            # Asked for once the step's code has returned: never retried (its code would
            # run again for nothing), as no later attempt could resolve it either.
            annotation = _annotation(self.fn, "return", f"step {self.name}", NotSerializable)
            codec = self._returns = Codec(annotation)
        return codec

    def args_json(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """The JSON of the call's arguments for its ``step_started``, or None when the
        step keeps them out of the journal."""
        if not self.journal_args:
            return None
        params = self._params
        if params is None:
            params = self._params = evidence.parameters(self.fn)
        return evidence.args_json(evidence.named(params, args, kwargs))

    def output_json(self, result: Any, step_id: str) -> str:
        """The canonical JSON of what the step returned (after :attr:`encode`, which
        already gives the journal's form), through its return annotation's adapter;
        :class:`NotSerializable` naming the step and the type where it cannot be written."""
        what = f"the output of step {step_id}"
        if self.encode is not None:
            return to_json(result, what)
        return self._codec().encode(result, what)

    def revive(self, value: Any, text: str | None = None) -> Any:
        """The step's output as its return annotation says, from its JSON form (``text``:
        that JSON, if at hand)."""
        if self.decode is not None:
            return self.decode(value)
        codec = self._codec()
        try:
            return codec.revive(value, text)
        except Invalid as e:
            raise NotSerializable(
                f"the output of step {self.name} does not fit its return "
                f"annotation {codec.name}: {e}"
            ) from None


@dataclass(slots=True)
class WorkflowDef:
    """A coroutine function decorated with ``@app.workflow``. Calling it directly runs
    it as plain code; ``app.start`` runs it durably."""

    fn: Callable[..., Any]
    name: str
    version: str = "1"
    guards: Guards | None = None  # None: the defaults
    # Set for the isolated tier: each attempt runs in a sandbox of this shape (a
    # ratchet.sandbox.Sandbox, which the sandbox feature reads; the engine only asks
    # whether there is one, so it knows nothing of sandboxes).
    sandbox: object | None = None
    # What a replay does when a completed model call's request differs from the journaled
    # one (the prompt changed under the run): "error" fails the run (non-determinism),
    # "warn" journals request_drifted and goes on with the journaled answer.
    request_drift: str = "error"
    # The queue its runs join unless a start names one (None: "default"); a worker serves
    # the queues of its workflows (ratchet.store.queues has the queues' limits).
    queue: str | None = None
    signature: inspect.Signature = field(init=False)
    _returns: Codec | None = None
    _params: dict[str, Codec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name, "workflow name")
        check_name(self.version, f"version of workflow {self.name}")
        if self.request_drift not in REQUEST_DRIFT:
            raise InvalidInput(
                f"workflow {self.name}: request_drift must be one of "
                f"{', '.join(map(repr, REQUEST_DRIFT))}, got {self.request_drift!r}"
            )
        if self.queue is not None:
            check_name(self.queue, f"queue of workflow {self.name}")
        if not inspect.iscoroutinefunction(self.fn):
            raise InvalidInput(f"workflow {self.name} must be an async def function")
        self.signature = inspect.signature(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def _param_for(self, position: int | None, keyword: str | None) -> inspect.Parameter | None:
        """The parameter a positional argument (by position) or a keyword argument binds to."""
        params = list(self.signature.parameters.values())
        if position is not None:
            positional = [
                p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            if position < len(positional):
                return positional[position]
            return next((p for p in params if p.kind == p.VAR_POSITIONAL), None)
        for p in params:
            if p.name == keyword and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                return p
        return next((p for p in params if p.kind == p.VAR_KEYWORD), None)

    def _codec(self, param: inspect.Parameter | None) -> Codec | None:
        if param is None:
            return None
        codec = self._params.get(param.name)
        if codec is None:
            what = f"parameter {param.name!r} of workflow {self.name}"
            codec = self._params[param.name] = Codec(_annotation(self.fn, param.name, what))
        return codec

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The run's stored input, after checking the arguments fit the signature and the
        annotations, and serialise; raises before anything is written. A Python caller's
        values go through pydantic's lax mode (``"3"`` for an ``int`` becomes 3); input
        that came as JSON is checked strictly first (:meth:`check_json`)."""
        self._fit(args, kwargs)
        value = {
            "args": [self._check(self._param_for(i, None), v) for i, v in enumerate(args)],
            "kwargs": {k: self._check(self._param_for(None, k), v) for k, v in kwargs.items()},
        }
        stored: dict[str, Any] = json.loads(to_json(value, f"the input of workflow {self.name}"))
        return stored

    def check_json(self, kwargs: dict[str, Any]) -> None:
        """Check arguments by name that came as JSON (the HTTP API, ``ratchet start``)
        against the signature and, strictly, the annotations: pydantic's strict mode for
        JSON, so ``true`` is no ``int`` and ``"3"`` none either (see
        :meth:`~ratchet.engine.values.Codec.check_json`). :class:`InvalidInput` as
        :meth:`bind` raises it; nothing is converted."""
        self._fit((), kwargs)
        for k, v in kwargs.items():
            param = self._param_for(None, k)
            codec = self._codec(param)
            if codec is None or param is None:
                continue
            try:
                codec.check_json(v)
            except Invalid as e:
                raise InvalidInput(self._unfit(param, codec, v, e)) from None

    def _fit(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise InvalidInput(
                f"arguments do not fit workflow {self.name}{self.signature}: {e}"
            ) from e

    def _check(self, param: inspect.Parameter | None, value: Any) -> Any:
        codec = self._codec(param)
        if codec is None or param is None:
            return value
        try:
            return codec.check(value)
        except Invalid as e:
            raise InvalidInput(self._unfit(param, codec, value, e)) from None

    def _unfit(self, param: inspect.Parameter, codec: Codec, value: Any, e: Invalid) -> str:
        # The annotation as a person reads it, and the value cut short: a refused
        # megabyte is not echoed back.
        return (
            f"invalid argument {param.name!r} of workflow {self.name}: "
            f"expected {codec.name}, got {quote(value)}: {e}"
        )

    def call_args(self, stored: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The arguments to call the workflow with, revived from its stored input through
        the same annotations that checked them at start (a model parameter gets the model)."""
        args = [
            self._revive(self._param_for(i, None), v) for i, v in enumerate(stored.get("args", []))
        ]
        kwargs = {
            k: self._revive(self._param_for(None, k), v)
            for k, v in stored.get("kwargs", {}).items()
        }
        return args, kwargs

    def _revive(self, param: inspect.Parameter | None, value: Any) -> Any:
        codec = self._codec(param)
        if codec is None or param is None:
            return value
        try:
            return codec.revive(value)
        except Invalid as e:
            raise NotSerializable(
                f"the stored argument {param.name!r} of workflow "
                f"{self.name} does not fit its annotation "
                f"{codec.name}: {e}"
            ) from None

    def _result_codec(self) -> Codec:
        codec = self._returns
        if codec is None:
            what = f"workflow {self.name}"
            codec = self._returns = Codec(_annotation(self.fn, "return", what))
        return codec

    def result_json(self, result: Any) -> str:
        """The canonical JSON of the workflow's result, through its return annotation's
        adapter; :class:`NotSerializable` naming the workflow and the type where it
        cannot be written."""
        return self._result_codec().encode(result, f"the result of workflow {self.name}")

    def revive(self, value: Any, text: str | None = None) -> Any:
        """The workflow's result as its return annotation says, from its JSON form
        (``text``: that JSON, if at hand)."""
        codec = self._result_codec()
        try:
            return codec.revive(value, text)
        except Invalid as e:
            raise NotSerializable(
                f"the result of workflow {self.name} does not fit its "
                f"return annotation {codec.name}: {e}"
            ) from None
