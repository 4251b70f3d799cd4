"""A graph's ``inputs`` schema, checked: the JSON Schema keywords a form of inputs needs
(type, properties, required, additionalProperties, items, enum, minimum, maximum,
minLength, maxLength). Other keywords are not checked."""

from __future__ import annotations

from typing import Any

from ratchet.names import quote

_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
    "number": (int, float),
    "integer": int,
}


def _is(value: Any, kind: str) -> bool:
    if kind in ("number", "integer") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(kind, object))


def json_type(value: Any) -> str:
    """A value's JSON type as the schema names it (``object``, ``string``, ``null``)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    for kind in ("object", "array", "string", "null"):
        if isinstance(value, _TYPES[kind]):
            return kind
    return type(value).__name__


def schema_errors(schema: Any, value: Any, at: str = "input") -> list[str]:
    """Every way ``value`` breaks ``schema``, each naming where (``input.accounts[2]``)."""
    if not isinstance(schema, dict):
        return []
    errors: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_is(value, k) for k in kinds):
            return [f"{at} must be {' or '.join(kinds)}, got {json_type(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{at} must be one of {quote(schema['enum'])}, got {quote(value)}")
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{at}.{name} is required")
        props = schema.get("properties", {})
        for name, item in value.items():
            if name in props:
                errors += schema_errors(props[name], item, f"{at}.{name}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{at}.{name} is not allowed")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += schema_errors(schema["items"], item, f"{at}[{i}]")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{at} must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{at} must be <= {schema['maximum']}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{at} must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{at} must have at most {schema['maxLength']} characters")
    return errors
