"""How long the names a caller gives may be: a run id, a tenant, a workflow, a queue, a
signal, a step. Checked where each is taken (``app.start``, the HTTP API, the CLI), so an
oversized name is refused with a message that names it, before anything is written; a
step's name where code declares it (``@app.step``, ``@app.tool``), so a step whose id the
API could not take is never registered. And how long a value an error message quotes
may be (:func:`quote`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ratchet.errors import InvalidInput

MAX_RUN_ID = 200  # a run id a client chooses
MAX_RUN_PATH = 1000  # a run id as a path names it: a child's is its parent's plus /<step>
MAX_TENANT = 64
MAX_WORKFLOW = 200  # a workflow's or a graph's name
MAX_QUEUE = 200
MAX_SIGNAL = 200
MAX_STEP = 1000  # a step id (a graph's carries its loop iterations) or an approval's name
# A step's name as code declares it: its step id ``<n>:<name>`` (with a tool's
# ``approval:`` step beside it) then stays far within MAX_STEP.
MAX_STEP_NAME = 200
MAX_DECIDER = 200  # who decided an approval
MAX_COMMENT = 4000  # an approval's comment
# The most of a caller's value an error message repeats: a refused megabyte is not echoed.
MAX_QUOTE = 80


def quote(value: Any, limit: int = MAX_QUOTE) -> str:
    """``value`` as an error message shows it: its JSON (``"text"``, ``true``, ``null``:
    what an HTTP client sent), else its repr (a Python caller's object), cut to ``limit``
    characters ending in …"""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_length(value: Any, what: str, limit: int) -> Any:
    """``value``, unless it is a string longer than ``limit`` characters."""
    if isinstance(value, str) and len(value) > limit:
        raise InvalidInput(f"invalid {what}: {len(value)} characters, over the limit of {limit}")
    return value


def check_step_name(name: str, what: str) -> str:
    """``name``, a step's name as code declares it, unless it is longer than
    :data:`MAX_STEP_NAME`; ``what`` names the declaration (``step``, ``tool``)."""
    if len(name) > MAX_STEP_NAME:
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise InvalidInput(
            f"{what} {shown!r}: its name is {len(name)} characters, over the limit of "
            f"{MAX_STEP_NAME} for a step's name (its step id must fit in {MAX_STEP})"
        )
    return name


# A run's tags: a flat mapping of short keys to short values, stored with the run and
# matched exactly by the run listings' filters (``tag=k=v``).
MAX_TAGS = 20
MAX_TAG_KEY = 64
MAX_TAG_VALUE = 256
_TAG_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*")
_TAG_KEY_RULE = "letters, digits and _ . : / -, starting with a letter or digit"


def _check_tag(key: Any, value: Any) -> None:
    if not isinstance(key, str):
        raise InvalidInput(f"invalid tag key {key!r}: expected a string")
    if len(key) > MAX_TAG_KEY:
        raise InvalidInput(
            f"invalid tag key {key[:40]!r}...: {len(key)} characters, over the limit of "
            f"{MAX_TAG_KEY}"
        )
    if not _TAG_KEY.fullmatch(key):
        raise InvalidInput(f"invalid tag key {key!r}: use 1-{MAX_TAG_KEY} {_TAG_KEY_RULE}")
    if not isinstance(value, str):
        raise InvalidInput(
            f"invalid tag {key!r}: its value must be a string, got {type(value).__name__}"
        )
    if len(value) > MAX_TAG_VALUE:
        raise InvalidInput(
            f"invalid tag {key!r}: its value is {len(value)} characters, over the limit of "
            f"{MAX_TAG_VALUE}"
        )
    if any(c < " " or c == "\x7f" for c in value):
        raise InvalidInput(f"invalid tag {key!r}: its value contains a control character")


def check_tags(tags: Any) -> dict[str, str]:
    """``tags`` as a run stores them, unless they break a rule: at most :data:`MAX_TAGS`,
    each key 1-64 letters, digits and ``_ . : / -`` (starting with a letter or digit),
    each value a string of at most 256 characters without control characters."""
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise InvalidInput(
            f"invalid tags: expected a mapping of names to strings, got {type(tags).__name__}"
        )
    if len(tags) > MAX_TAGS:
        raise InvalidInput(f"invalid tags: {len(tags)} of them, over the limit of {MAX_TAGS}")
    for key, value in tags.items():
        _check_tag(key, value)
    return dict(tags)


def parse_tag(text: str) -> tuple[str, str]:
    """A tag filter as the CLI and the HTTP API take it, ``key=value`` (the first ``=``
    ends the key, which cannot hold one), checked as a run's tag is."""
    key, sep, value = text.partition("=")
    if not sep:
        raise InvalidInput(f"invalid tag filter {text[:80]!r}: expected key=value")
    _check_tag(key, value)
    return key, value
