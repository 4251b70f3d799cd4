"""A value that fits a JSON schema, made deterministically: the default answer to a request
for structured output (``response_format`` / ``text.format`` of type ``json_schema``).

Objects get every property, arrays their minimum number of items (at least one), strings
the reply text, numbers their minimum or 0, enums and constants their first value. It aims
at the schemas the SDKs derive from pydantic models, not at every corner of JSON Schema.
"""

from __future__ import annotations

from typing import Any

_MAX_DEPTH = 12  # a recursive model ($ref to itself) stops here with null
_FORMATS = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "email": "user@example.com",
    "uri": "https://example.com/",
}


def sample(schema: Any, text: str) -> Any:
    """A value fitting ``schema``; its strings are ``text``."""
    defs: dict[str, Any] = {}
    if isinstance(schema, dict):
        for key in ("$defs", "definitions"):
            if isinstance(schema.get(key), dict):
                defs.update(schema[key])
    return _value(schema, defs, text, 0)


def _value(schema: Any, defs: dict[str, Any], text: str, depth: int) -> Any:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None if depth > _MAX_DEPTH else text
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1])
        return _value(target, defs, text, depth + 1) if target is not None else None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            chosen = next((o for o in options if not _is_null(o)), options[0])
            return _value(chosen, defs, text, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {name: _value(sub, defs, text, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 1)
        if isinstance(schema.get("maxItems"), int):
            count = min(count, schema["maxItems"])
        return [_value(schema.get("items", {}), defs, text, depth + 1) for _ in range(count)]
    if kind == "string":
        return _string(schema, text)
    if kind in ("integer", "number"):
        return _number(schema, integer=kind == "integer")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return text


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


def _string(schema: dict[str, Any], text: str) -> str:
    value = _FORMATS.get(str(schema.get("format")), text)
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(low, int) and len(value) < low:
        value = value + "." * (low - len(value))
    if isinstance(high, int) and len(value) > high:
        value = value[:high]
    return value


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    """0, moved into the bounds the schema sets."""
    value = 0.0
    low, high = _bound(schema, "minimum"), _bound(schema, "maximum")
    above, below = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    if low is not None and value < low:
        value = low
    if above is not None and value <= above:
        value = above + 1
    if high is not None and value > high:
        value = high
    if below is not None and value >= below:
        value = below - 1
    return int(value) if integer else value


def _bound(schema: dict[str, Any], name: str) -> float | None:
    value = schema.get(name)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
