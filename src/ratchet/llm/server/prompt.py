"""What a model request asks, whatever its wire format: the part rules match on and the
size usage is counted from.

Each endpoint module reads its own body into a :class:`Prompt`; a body that cannot be
read raises :class:`BadRequest` naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

LastRole = Literal["user", "tool", "assistant", "none"]


class BadRequest(Exception):
    """A request body the provider refuses (400), with the parameter at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class Prompt:
    """A model request, read.

    ``chars`` counts the prompt text (messages, system, tools JSON) that input tokens are
    computed from. ``last_role`` is who spoke last: ``tool`` when the conversation ends
    with a tool result, ``user`` when it ends with the user's words.
    """

    endpoint: str
    model: str
    last_user_text: str
    last_role: LastRole
    tool_result_text: str
    chars: int
    stream: bool = False
    include_usage: bool = False
    json_schema: dict[str, Any] | None = None
    json_object: bool = False


def tokens(chars: int) -> int:
    """Tokens for ``chars`` characters: a quarter, rounded up, at least one."""
    return max(1, math.ceil(chars / 4))


def compact(value: Any) -> str:
    """Canonical compact JSON (sorted keys), the form tool JSON is counted in."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {_kind(body)}")
    return body


def require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required: a non-empty string", "model")
    return model


def require_list(body: dict[str, Any], name: str) -> list[Any]:
    value = body.get(name)
    if not isinstance(value, list) or not value:
        raise BadRequest(f"'{name}' is required: a non-empty array", name)
    return value


def optional_bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be a boolean, got {_kind(value)}", name)
    return value


def tools_chars(body: dict[str, Any]) -> int:
    tools = body.get("tools")
    if tools is None:
        return 0
    if not isinstance(tools, list):
        raise BadRequest(f"'tools' must be an array, got {_kind(tools)}", "tools")
    return len(compact(tools)) if tools else 0


def text_of(content: Any, where: str) -> str:
    """The text of a message content: a string, or the ``text`` of its parts (other parts,
    images and files, carry no text here)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise BadRequest(f"{where}[{i}] must be an object, got {_kind(part)}", where)
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
        return "\n".join(texts)
    raise BadRequest(f"{where} must be a string or an array of parts, got {_kind(content)}", where)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)
