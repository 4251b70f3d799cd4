"""How long the names a caller gives may be: a run id, a tenant, a workflow, a queue, a
signal, a step. Checked where each is taken (``app.start``, the HTTP API, the CLI), so an
oversized name is refused with a message that names it, before anything is written."""

from __future__ import annotations

from typing import Any

from ratchet.errors import InvalidInput

MAX_RUN_ID = 200  # a run id a client chooses
MAX_RUN_PATH = 1000  # a run id as a path names it: a child's is its parent's plus /<step>
MAX_TENANT = 64
MAX_WORKFLOW = 200  # a workflow's or a graph's name
MAX_QUEUE = 200
MAX_SIGNAL = 200
MAX_STEP = 1000  # a step id (a graph's carries its loop iterations) or an approval's name
MAX_DECIDER = 200  # who decided an approval
MAX_COMMENT = 4000  # an approval's comment


def check_length(value: Any, what: str, limit: int) -> Any:
    """``value``, unless it is a string longer than ``limit`` characters."""
    if isinstance(value, str) and len(value) > limit:
        raise InvalidInput(f"invalid {what}: {len(value)} characters, over the limit of {limit}")
    return value
