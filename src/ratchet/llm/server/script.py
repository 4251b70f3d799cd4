"""The script a local provider follows: reply rules and queued faults, validated by pydantic.

A script is a YAML or JSON file (or the same as a dict) with two optional lists::

    rules:                                   # first match wins
      - match: {contains: "weather", endpoint: chat}
        reply: {tool_calls: [{name: get_weather, arguments: {city: "Paris"}}]}
      - match: {last_role: tool}
        reply: {text: "It is sunny in Paris."}
        times: 1                             # used once, then skipped
    faults:                                  # the arguments of LocalProvider.fail
      - {kind: "429", times: 2, retry_after: 1}

Unknown keys are refused, so a typo is an error that names it rather than a rule that
silently never matches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ratchet.errors import ConfigError

#: The endpoints a rule can be limited to (``any`` is every model endpoint with replies).
RuleEndpoint = Literal["chat", "responses", "messages", "any"]
#: The endpoints a fault can be limited to; ``None`` or ``any`` is every model endpoint.
FaultEndpoint = Literal["chat", "responses", "messages", "embeddings", "any"]
FaultKind = Literal["429", "500", "slow", "drop", "stall", "cut"]


class ScriptError(ConfigError):
    """Invalid local provider script."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Match(_Strict):
    """When a rule applies; every field given must hold (an empty match always holds).

    ``contains`` looks in the last user message, and so only matches a conversation that
    ends with one; with ``last_role: tool`` it looks in the tool result instead. That way
    a rule that answers "weather" with a tool call does not fire again on the tool's result.
    """

    contains: str | None = None
    model: str | None = None
    endpoint: RuleEndpoint = "any"
    last_role: Literal["user", "tool"] | None = None


class ToolCallSpec(_Strict):
    """One tool call the model makes: the tool's name and its arguments."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ReplySpec(_Strict):
    """What the model answers. ``text`` and ``json`` (a value replied as JSON text) exclude
    each other; ``tool_calls`` may come with text. With neither, the default reply is
    given (the echo, or a JSON value fitting the requested schema). The token fields
    override the counts computed from the text."""

    text: str | None = None
    json_value: Any = Field(default=None, alias="json")
    tool_calls: list[ToolCallSpec] | None = None
    input_tokens: int | None = Field(default=None, ge=1)
    output_tokens: int | None = Field(default=None, ge=1)
    cached_tokens: int = Field(default=0, ge=0)
    reasoning_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _one_body(self) -> ReplySpec:
        if self.text is not None and self.json_value is not None:
            raise ValueError("a reply has either text or json, not both")
        if self.tool_calls is not None and not self.tool_calls:
            raise ValueError("tool_calls is empty: give at least one call or leave it out")
        if self.output_tokens is not None and self.reasoning_tokens > self.output_tokens:
            raise ValueError(
                f"reasoning_tokens ({self.reasoning_tokens}) exceeds "
                f"output_tokens ({self.output_tokens})"
            )
        return self


class Rule(_Strict):
    """A reply for the requests its match holds for, ``times`` times (None: always)."""

    match: Match = Field(default_factory=Match)
    reply: ReplySpec
    times: int | None = Field(default=None, ge=1)


class FaultSpec(_Strict):
    """A fault for the next ``times`` requests on ``endpoint`` (None: any model endpoint).

    ``429`` and ``500`` answer with that error (not billed, nothing stored); ``slow``
    answers after ``delay_s``; ``drop`` computes, stores and bills the answer, then closes
    the connection without sending it; ``stall`` sends a stream's first ``after_events``
    events (default 1), then waits ``delay_s`` before the rest (an answer that is not a
    stream waits before it is sent); ``cut`` sends a stream's first ``after_events`` events
    (default 1), then closes the connection (billed and stored: the whole answer). ``delay_s``
    may delay any other kind; ``retry_after`` (seconds) is sent as the ``retry-after``
    header of a 429 or 500.
    """

    kind: FaultKind
    times: int = Field(default=1, ge=1)
    retry_after: float | None = Field(default=None, ge=0)
    delay_s: float | None = Field(default=None, gt=0)
    after_events: int | None = Field(default=None, ge=0)
    endpoint: FaultEndpoint | None = None

    @field_validator("kind", mode="before")
    @classmethod
    def _kind_as_text(cls, value: Any) -> Any:
        # YAML reads `kind: 429` as a number.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _fits_kind(self) -> FaultSpec:
        if self.kind == "slow" and self.delay_s is None:
            raise ValueError("a slow fault needs delay_s (seconds before it answers)")
        if self.kind == "stall" and self.delay_s is None:
            raise ValueError("a stall fault needs delay_s (seconds the stream pauses)")
        if self.after_events is not None and self.kind not in ("stall", "cut"):
            raise ValueError(f"after_events is for stall and cut faults, not {self.kind!r}")
        if self.retry_after is not None and self.kind not in ("429", "500"):
            raise ValueError(f"retry_after is for 429 and 500 faults, not {self.kind!r}")
        return self

    def applies_to(self, endpoint: str) -> bool:
        """Whether this fault is for a request on ``endpoint``."""
        return self.endpoint in (None, "any", endpoint)


class Script(_Strict):
    """A whole script: the reply rules, in order, and the faults queued at start."""

    rules: list[Rule] = Field(default_factory=list)
    faults: list[FaultSpec] = Field(default_factory=list)


def describe(error: ValidationError) -> str:
    """One line naming each problem: where it is and what is wrong."""
    problems = []
    for item in error.errors(include_url=False):
        where = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


def load_script(source: str | Path | dict[str, Any] | None) -> Script:
    """A validated script from a YAML/JSON file path, a dict, or nothing (no rules).

    Raises :class:`ScriptError` naming the file and the problem.
    """
    if source is None:
        return Script()
    if isinstance(source, dict):
        return _validate(source, "invalid script")
    if not isinstance(source, (str, Path)):
        raise ScriptError(
            f"invalid script: expected a file path or a dict, got {type(source).__name__}"
        )
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScriptError(f"script file {str(path)!r} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScriptError(f"cannot read script file {str(path)!r}: {e}") from e
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        detail = " ".join(str(e).split())
        raise ScriptError(
            f"script file {str(path)!r} is not valid "
            f"{'JSON' if path.suffix.lower() == '.json' else 'YAML'}: {detail}"
        ) from e
    if data is None:
        return Script()
    if not isinstance(data, dict):
        raise ScriptError(
            f"invalid script file {str(path)!r}: expected a mapping with rules "
            f"and/or faults, got {type(data).__name__}"
        )
    return _validate(data, f"invalid script file {str(path)!r}")


def _validate(data: dict[str, Any], prefix: str) -> Script:
    try:
        return Script.model_validate(data)
    except ValidationError as e:
        raise ScriptError(f"{prefix}: {describe(e)}") from None


def fault_spec(**fields: Any) -> FaultSpec:
    """A validated fault from the arguments of ``LocalProvider.fail`` (or its JSON)."""
    try:
        return FaultSpec.model_validate(fields)
    except ValidationError as e:
        raise ScriptError(f"invalid fault: {describe(e)}") from None
