"""How long the names a caller gives may be: a run id, a tenant, a workflow, a queue, a
signal, a step. Checked where each is taken (``app.start``, the HTTP API, the CLI), so an
oversized name is refused with a message that names it, before anything is written; a
step's name where code declares it (``@app.step``, ``@app.tool``), so a step whose id the
API could not take is never registered. And how long a value an error message quotes
may be (:func:`quote`)."""

from __future__ import annotations

import json
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
