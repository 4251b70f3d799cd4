"""Values across the journal: what user code hands Ratchet, its JSON form, and back.

Every value Ratchet stores for user code (a step's output, a workflow's input and result,
a signal's data, an approval's data) is stored as canonical JSON (:func:`ratchet.model.dumps`).
Where the code says what a value is (a step's or a workflow's return annotation, a
workflow parameter's, ``wait_for_signal(type=...)``), it is written through that
annotation's pydantic ``TypeAdapter`` and read back through the same adapter in JSON mode,
so what comes back is the annotated type: a datetime, a UUID, a Decimal, an Enum, bytes, a
dataclass, a TypedDict, a NamedTuple, a model, nested in lists and dicts. Read back from the
journal on the first drive and on every replay alike, it is the same value both times.
Where nothing says, the value is written in pydantic's JSON form
(``pydantic_core.to_jsonable_python``) and read back as that JSON.

Bytes are written as URL-safe base64 wherever Ratchet sets the adapter's configuration
(``bytes``, and dataclasses, TypedDicts and NamedTuples of their own, at any depth), so any
bytes round-trip; a pydantic model's or pydantic dataclass's bytes follow its own
``ser_json_bytes``/``val_json_bytes`` (pydantic's default is UTF-8 text).

What neither json nor pydantic can encode (an open file, a generator, a lambda, a socket,
a set of such objects) is refused with :class:`NotSerializable` naming what it was.

This runs at every step boundary. A codec is built once per annotation and its adapter
on first need; an annotation that only allows plain JSON (none, ``Any``, ``int``, ``str``,
``dict``, ``list[str]``, ``dict[str, Any]``, ...) never uses the adapter to encode: the
json module writes the value, and pydantic is asked only for the leaves json cannot write.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from ratchet.errors import NotSerializable
from ratchet.model import dumps

if TYPE_CHECKING:
    from pydantic import TypeAdapter, ValidationError

# No annotation at all.
EMPTY: Any = inspect.Parameter.empty
# Annotations that say nothing about a JSON value: the value is used as it is.
_OPAQUE_NAMES = frozenset({"Any", "typing.Any", "object"})
# A value of exactly this type already is what the annotation asks for: no validation
# (and no copy) on the per-step hot path for the commonest annotations.
_NATIVE = {
    int: int,
    str: str,
    bool: bool,
    float: float,
    dict: dict,
    list: list,
    None: type(None),
    type(None): type(None),
}
# Of those, the ones whose value is its own JSON form (a dict or list may hold values that
# the adapter would turn into JSON, a datetime say).
_SCALARS = frozenset({int, str, bool, float, type(None)})
# Leaves of an annotation whose values the json module writes as the adapter would.
_PLAIN_LEAVES = frozenset({int, str, bool, float, type(None), None, dict, list, Any, object})
# How json says that it cannot write a dict's keys, or cannot sort them.
_KEY_ERRORS = ("keys must be", "'<' not supported between instances")
# The JSON escape of a NUL character, not preceded by a backslash that escapes its own.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def jsonable(value: Any) -> Any:
    """The JSON form of a value the json module cannot write: a pydantic model's own,
    else pydantic's (``to_jsonable_python``, bytes as base64); raises TypeError naming the
    type where neither can. Containers pydantic would walk itself (dataclasses, sets) are
    handed back to json as a dict or a list, so json walks them and comes back here for
    each leaf: an iterator is refused at any depth, not drained into the journal."""
    cls = type(value)
    if hasattr(cls, "__next__"):
        raise TypeError(
            f"a {cls.__name__} is an iterator (an open file, a generator), "
            "not a value: return what it holds (a list, the text read)"
        )
    if not hasattr(cls, "__pydantic_serializer__"):  # pydantic dataclasses serialise their way
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if isinstance(value, set | frozenset):
            # Sorted where it can be: a set's order depends on the process's string hashes,
            # and the same input must give the same JSON in every process (an idempotent
            # start compares them).
            try:
                return sorted(value)
            except TypeError:
                return list(value)
    from pydantic_core import PydanticSerializationError, to_jsonable_python

    try:
        dump = getattr(value, "model_dump", None)
        if callable(dump):  # a pydantic model: its JSON form, as Ratchet has always written it
            return dump(mode="json")
        return to_jsonable_python(value, bytes_mode="base64")
    except (PydanticSerializationError, UnicodeError) as e:
        raise TypeError(cannot_encode(value, e)) from None


def cannot_encode(value: Any, error: BaseException) -> str:
    """Why pydantic could not encode ``value``, naming its type."""
    hint = ""
    if isinstance(error, UnicodeError):
        hint = (
            "; a model's bytes are UTF-8 text in its JSON form unless its config says "
            "ser_json_bytes='base64' (and val_json_bytes='base64' to read them back)"
        )
    return f"pydantic cannot encode a {type(value).__name__} ({error}{hint})"


def to_json(value: Any, what: str) -> str:
    """``value`` as canonical JSON (pydantic's JSON form for what json cannot write), or
    :class:`NotSerializable` naming ``what``."""
    try:
        try:
            text = dumps(value, jsonable)
        except TypeError as e:
            if not str(e).startswith(_KEY_ERRORS):
                raise
            # A dict keyed by what json cannot write as a key (an Enum, a date, a UUID) or
            # cannot sort (an int beside a str): every key as text, on this second try only.
            text = dumps(_keyed(value), _keyed_jsonable)
    except (TypeError, ValueError, RecursionError) as e:
        raise NotSerializable(f"{what} is not JSON-serialisable: {e}") from e
    # A NUL character is written \u0000, and PostgreSQL's jsonb refuses it: refused here on
    # both backends, so a value stores the same everywhere. (An escaped backslash before
    # "u0000" is text, not a NUL: the regex asks for an even run of backslashes before it.)
    if "\\u0000" in text and _NUL.search(text):
        raise NotSerializable(
            f"{what} is not JSON-serialisable: it holds a NUL character "
            "(\\u0000), which PostgreSQL's jsonb cannot store"
        )
    # str.isascii() is O(1) in CPython, so only text with non-ASCII characters pays for
    # the check that it can be stored as UTF-8 (a lone surrogate cannot).
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as e:
            raise NotSerializable(
                f"{what} is not JSON-serialisable: it holds a lone surrogate "
                f"{text[e.start]!r}, which UTF-8 cannot store"
            ) from None
    return text


def _keyed(value: Any) -> Any:
    """``value`` with every dict's keys as json can write them (see :func:`to_json`)."""
    if isinstance(value, dict):
        return {_key(k): _keyed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_keyed(v) for v in value]
    return value


def _keyed_jsonable(value: Any) -> Any:
    return _keyed(jsonable(value))


def _key(key: Any) -> str:
    """A dict key as text: as json writes it where json can, else as pydantic does."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        return json.dumps(key, allow_nan=False)
    from pydantic_core import PydanticSerializationError, to_jsonable_python

    try:
        return str(next(iter(to_jsonable_python({key: None}, bytes_mode="base64"))))
    except PydanticSerializationError as e:
        raise TypeError(cannot_encode(key, e)) from None


class Invalid(Exception):
    """A value does not fit its annotation; the message says where and why."""


class Codec:
    """One annotation's way between a value and its JSON form. The pydantic adapter is
    built on first need: a value whose type already is the annotation's (an ``int`` for
    ``int``) never needs one, and building the first adapter of a process costs
    milliseconds (pydantic looks for plugins), which a recovering worker should not pay."""

    __slots__ = ("_adapter", "_boxed", "annotation", "native", "plain")

    _UNBUILT: Any = object()

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        self.native = _NATIVE.get(annotation) if _hashable(annotation) else None
        self.plain = _plain(annotation)
        opaque = annotation is EMPTY or annotation is Any or annotation is object
        self._adapter: TypeAdapter[Any] | None = None if opaque else self._UNBUILT
        # The adapter is of a 1-tuple of the annotation (see _build).
        self._boxed = False

    @property
    def name(self) -> str:
        """The annotation as a person reads it: ``datetime``, ``list[User]``."""
        return type_name(self.annotation)

    @property
    def adapter(self) -> TypeAdapter[Any] | None:
        if self._adapter is self._UNBUILT:
            self._adapter = self._build()
        return self._adapter

    def _build(self) -> TypeAdapter[Any] | None:
        # Imported here: a process whose values are all plain JSON never loads pydantic.
        from pydantic import ConfigDict, TypeAdapter
        from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError

        binary = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")
        a = self.annotation
        try:
            try:
                return TypeAdapter(a, config=binary)
            except PydanticUserError as e:
                if e.code != "type-adapter-config-unused":
                    raise
            if _own_config(a):  # a model: its configuration decides
                return TypeAdapter(a)
            # A stdlib dataclass or TypedDict takes its configuration from what holds it,
            # and pydantic refuses one for it alone: inside a 1-tuple it gets base64
            # bytes as it does inside a list.
            self._boxed = True
            return TypeAdapter(tuple[a], config=binary)  # type: ignore[valid-type]
        except PydanticUserError as e:
            if e.code == "typed-dict-version":
                raise NotSerializable(
                    f"values of {self.name} cannot be journaled: {e.message}"
                ) from None
            return None
        except PydanticSchemaGenerationError:
            # A type pydantic cannot describe (a queue, a callable): it cannot come from
            # JSON either, so the value is left as the journal holds it.
            return None

    def encode(self, value: Any, what: str) -> str:
        """``value``'s canonical JSON, written through the annotation's adapter unless
        the annotation only allows plain JSON; :class:`NotSerializable` naming ``what``
        and the type where it cannot be written."""
        adapter = None if self.plain else self.adapter
        if adapter is None:
            return to_json(value, what)
        if hasattr(type(value), "__next__"):
            return to_json(value, what)  # refused there, as an iterator
        from pydantic_core import PydanticSerializationError

        try:
            data = adapter.dump_python(
                (value,) if self._boxed else value, mode="json", warnings=False
            )
        except (PydanticSerializationError, UnicodeError, TypeError, ValueError) as e:
            raise NotSerializable(
                f"{what} is not JSON-serialisable as {self.name}: {cannot_encode(value, e)}"
            ) from None
        return to_json(data[0] if self._boxed else data, what)

    def check(self, value: Any) -> Any:
        """Validate a caller's value; return its JSON form (JSON data, not text yet)."""
        if self._adapter is None or (type(value) is self.native and self.native in _SCALARS):
            return value
        adapter = self.adapter
        if adapter is None:
            return value
        boxed = self._boxed
        try:
            valid = adapter.validate_python((value,) if boxed else value)
        except _validation_error() as e:
            raise Invalid(_message(e, boxed)) from None
        try:
            data = adapter.dump_python(valid, mode="json")
        except Exception as e:  # a serialiser of the user's own raised
            raise Invalid(f"its JSON form cannot be written: {e}") from None
        return data[0] if boxed else data

    def check_json(self, value: Any) -> None:
        """Validate a value that came as JSON (the HTTP API, ``ratchet start``) in
        pydantic's strict mode for JSON: only what the annotation names is taken (``true``
        is no ``int``, nor is ``"3"`` or ``3.5``), though text still stands for the types
        JSON writes as text (a datetime, a UUID, an Enum's value, base64 bytes)."""
        if self._adapter is None or (type(value) is self.native and self.native in _SCALARS):
            return
        adapter = self.adapter
        if adapter is None:
            return
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise Invalid(f"not a JSON value: {e}") from None
        boxed = self._boxed
        try:
            adapter.validate_json(f"[{text}]" if boxed else text, strict=True)
        except _validation_error() as e:
            raise Invalid(_message(e, boxed)) from None

    def revive(self, value: Any, text: str | None = None) -> Any:
        """The annotated type from a JSON value (``text``: its JSON, if at hand), read
        through the adapter in JSON mode: the inverse of :meth:`encode` (a strict model's
        datetime is a string in JSON, bytes are base64)."""
        if self._adapter is None or type(value) is self.native:
            return value
        adapter = self.adapter
        if adapter is None:
            return value
        # A journaled value is JSON data: pydantic's own writer (several times faster than
        # the json module's for it) gives its JSON back to read.
        data: str | bytes = _json_bytes(value) if text is None else text
        boxed = self._boxed
        if boxed:
            data = b"[%b]" % data if isinstance(data, bytes) else f"[{data}]"
        try:
            revived = adapter.validate_json(data)
        except _validation_error() as e:
            raise Invalid(_message(e, boxed)) from None
        return revived[0] if boxed else revived


_CODECS: dict[Any, Codec] = {}


def codec_for(annotation: Any) -> Codec:
    """The codec of ``annotation``, built once per process (by annotation) where it can
    be kept."""
    if not _hashable(annotation):
        return Codec(annotation)
    codec = _CODECS.get(annotation)
    if codec is None:
        if len(_CODECS) >= 1024:  # annotations made on the fly: keep memory bounded
            _CODECS.clear()
        codec = _CODECS[annotation] = Codec(annotation)
    return codec


def opaque_name(raw: str) -> bool:
    """Whether a string annotation names ``Any`` or ``object``."""
    return raw in _OPAQUE_NAMES


def _json_bytes(value: Any) -> bytes:
    global _json_bytes
    from pydantic_core import to_json

    _json_bytes = to_json  # from now on, called directly
    return to_json(value)


def _validation_error() -> type[ValidationError]:
    from pydantic import ValidationError

    return ValidationError


def _message(e: ValidationError, boxed: bool = False) -> str:
    first = e.errors()[0]
    loc = tuple(first.get("loc", ()))
    if boxed:
        loc = loc[1:]  # the 1-tuple's index
    where = ".".join(str(p) for p in loc)
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{first['msg']}{f' at {where}' if where else ''}{more}"


def type_name(annotation: Any) -> str:
    """An annotation as a person reads it, never a Python repr: ``int``, ``list[User]``,
    ``str | None``, ``"a" | "b"`` (a Literal's values as JSON), ``any`` for none."""
    a = annotation
    if a is EMPTY or a is Any or a is object:
        return "any"
    if a is None or a is type(None):
        return "None"
    if a is Ellipsis:
        return "..."
    origin, args = typing.get_origin(a), typing.get_args(a)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Union or origin is types.UnionType:
        return " | ".join(type_name(x) for x in args)
    if origin is Literal:
        return " | ".join(
            json.dumps(x) if isinstance(x, str | int | None) else str(x) for x in args
        )
    if origin is not None:
        head = getattr(origin, "__name__", None) or str(origin).replace("typing.", "")
        return f"{head}[{', '.join(type_name(x) for x in args)}]" if args else head
    if isinstance(a, type):
        return a.__name__
    if isinstance(a, typing.ForwardRef):
        return a.__forward_arg__
    return str(a).replace("typing.", "")


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _plain(annotation: Any) -> bool:
    """Whether every value the annotation allows is plain JSON, which the json module
    writes just as the adapter would (so encoding needs no adapter)."""
    if annotation is EMPTY or (_hashable(annotation) and annotation in _PLAIN_LEAVES):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list:
        return all(_plain(a) for a in args)
    if origin is dict:
        return not args or (args[0] is str and _plain(args[1]))
    if origin is Union or origin is types.UnionType:
        return all(_plain(a) for a in args)
    if origin is Literal:
        return all(a is None or type(a) in (str, int, bool) for a in args)
    return False


def _own_config(annotation: Any) -> bool:
    """Whether the type carries a pydantic configuration of its own (a model, a pydantic
    dataclass, a class given one with ``pydantic.with_config``)."""
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if hasattr(annotation, "__pydantic_config__"):
        return True
    from pydantic import BaseModel

    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
