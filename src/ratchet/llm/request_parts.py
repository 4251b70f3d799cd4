"""What of a model call is journaled as its request (:mod:`ratchet.model.requests`): its
messages, one by one, and every other argument of ``create`` as its params, all as JSON.

Left out: what is not the request the model answers (headers, query parameters, the
client's timeout) and anything named like a credential. Messages and params the SDK
accepts as its own typed objects (a pydantic model, such as the assistant message of an
earlier answer) are journaled as the JSON the SDK sends for them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ratchet.llm.endpoints import RESPONSES, Endpoint

# Arguments of create() that are not part of what the model is asked.
_LEFT_OUT = frozenset({"extra_headers", "extra_query", "timeout", "stream_cls"})
_SECRET = re.compile(r"(?:.*[_-])?(?:api[_-]?key|apikey|authorization|password|secret)", re.I)


def as_json(value: Any) -> Any:
    """``value`` as the JSON the SDK would send: mappings and sequences walked, pydantic
    models dumped as the SDKs dump them (the fields that were set), anything else JSON
    cannot hold named by its type."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return as_json(dump(mode="json", exclude_unset=True))
    return f"<{type(value).__name__}>"


def split_request(
    endpoint: Endpoint, kwargs: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The messages and the params of a call of ``endpoint`` with ``kwargs``. The Responses
    API's ``input`` counts as its messages when it is a list of items; a text input, and an
    embedding's, is a param."""
    field = "input" if endpoint is RESPONSES else "messages"
    raw = kwargs.get(field)
    messages: list[Any] = []
    if endpoint.streams and isinstance(raw, list | tuple):
        messages = [as_json(m) for m in raw]
    else:
        field = ""
    params = {
        name: as_json(value)
        for name, value in kwargs.items()
        if name != field and name not in _LEFT_OUT and not _SECRET.fullmatch(name)
    }
    return messages, params
