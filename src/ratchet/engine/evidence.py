"""What the journal keeps to debug a step from it alone: the arguments a step was called
with (``step_started``'s ``args``) and the traceback of a step that failed
(``step_failed``'s and ``step_retrying``'s ``traceback``, ``run_failed``'s for an error
of the workflow's own code).

Both are bounded, both are for people: a replay never reads them (the journal's state
does not depend on them), and a journal written before they existed has neither.

- ``args``: the arguments by parameter name (positional ones named after the parameters
  they bind to; extra positional ones as a list under the ``*args`` parameter's name),
  as JSON. A value JSON cannot hold is written as ``"<TypeName>"``. Past
  :data:`MAX_ARGS_BYTES` of JSON the value is ``{"_truncated": true, "bytes": N,
  "head": "<the first characters of the JSON>"}``. Values under keys that name a
  secret (``api_key``, ``authorization``, ``password``, ``token``, ...) and text that looks
  like a key (``sk-...``, ``Bearer ...``) are replaced by ``"[redacted]"``.
- ``traceback``: the exception chain as Python prints it (causes and contexts first, the
  exception raised last), without Ratchet's own frames and without locals; past
  :data:`MAX_TRACEBACK_CHARS` its middle is cut with a marker line, keeping its start and
  the exception raised. Text that looks like a credential, and the values of environment
  variables whose names say they are secret, are replaced by ``[redacted]``.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ratchet.engine.values import to_json
from ratchet.errors import NotSerializable
from ratchet.model import dumps

MAX_ARGS_BYTES = 4096
MAX_TRACEBACK_CHARS = 8192
REDACTED = "[redacted]"

# Ratchet's own frames say nothing about the user's failure: they are left out.
_OWN = str(Path(__file__).resolve().parent.parent) + os.sep
# Frames of the machinery a step runs through (the event loop, the thread pool).
_STDLIB = str(Path(inspect.getfile(traceback)).resolve().parent) + os.sep
_PLUMBING = tuple(_STDLIB + sub + os.sep for sub in ("asyncio", "concurrent"))

# An environment variable's name that says its value is secret.
_SECRET_NAME = re.compile(
    r"(api[_-]?key|apikey|authorization|password|passwd|secret|token|credential|private[_-]?key)",
    re.IGNORECASE,
)
# An argument's name (a key at any depth) that says its value is secret; max_tokens is not.
_SECRET_KEY = re.compile(
    r"(?:.*[_-])?(?:api[_-]?key|apikey|authorization|password|passwd|secret|token"
    r"|private[_-]?key|credentials?)",
    re.IGNORECASE,
)
# Substrings of the lowercased JSON of arguments without which they hold nothing to
# redact: a plain substring search is cheap on the per-step hot path, the regexes are not.
_HINTS = (
    'key"',
    "authorization",
    "password",
    "passwd",
    "secret",
    'token"',
    "credential",
    "sk-",
    "bearer",
    "ghp_",
    "gho_",
    "ghs_",
    "github_pat",
    "xox",
    "akia",
)
_SECRET_TEXT = re.compile(
    r"(?:\bsk-[A-Za-z0-9_\-]{16,}"
    r"|\b(?:ghp|gho|ghs|github_pat|xox[abprs])[-_][A-Za-z0-9_\-]{16,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|(?i:bearer)\s+[A-Za-z0-9._\-~+/]{8,}=*)"
)
_SECRET_ASSIGN = re.compile(
    r"((?:api[_-]?key|apikey|password|passwd|secret|token|authorization)[\"']?\s*[:=]\s*[\"']?)"
    r"[^\s\"',;)}\]]{4,}",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with what looks like a credential replaced by ``[redacted]``."""
    text = _SECRET_TEXT.sub(REDACTED, text)
    return _SECRET_ASSIGN.sub(lambda m: m.group(1) + REDACTED, text)


def _env_secrets() -> list[str]:
    """Values of environment variables whose names say they are secret (long enough
    that replacing them cannot mangle ordinary text)."""
    return sorted(
        (v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= 8),
        key=len,
        reverse=True,
    )


# -- tracebacks --------------------------------------------------------------------------


def _user_frames(tb: traceback.TracebackException) -> None:
    """Drop Ratchet's frames and the event loop's from each exception of the chain."""
    seen: set[int] = set()
    todo: list[traceback.TracebackException | None] = [tb]
    while todo:
        t = todo.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        frames = [
            f
            for f in t.stack
            if not f.filename.startswith(_OWN) and not f.filename.startswith(_PLUMBING)
        ]
        t.stack = traceback.StackSummary.from_list(frames)
        todo += [t.__cause__, t.__context__]


def traceback_text(e: BaseException) -> str:
    """The journal's traceback of ``e`` (see the module's docstring)."""
    try:
        tb = traceback.TracebackException.from_exception(e, capture_locals=False)
        _user_frames(tb)
        text = "".join(tb.format())
    except Exception:  # a broken __str__ or a cycle must not hide the failure itself
        text = f"{type(e).__name__}: <the traceback could not be formatted>\n"
    for value in _env_secrets():
        text = text.replace(value, REDACTED)
    text = redact(text).replace("\x00", "\\x00")
    return _bounded(_storable(text), MAX_TRACEBACK_CHARS)


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head - 80
    cut = len(text) - head - tail
    return f"{text[:head]}\n... [{cut} characters cut] ...\n{text[-tail:]}"


def _storable(text: str) -> str:
    """``text`` as UTF-8 can store it (a lone surrogate becomes ``?``)."""
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


# -- arguments ---------------------------------------------------------------------------


def parameters(fn: Callable[..., Any]) -> tuple[tuple[str, ...], str]:
    """The names positional arguments of ``fn`` bind to, and the name the extra ones go
    under (its ``*args`` parameter's, else ``*args``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return (), "*args"
    positional = tuple(
        p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )
    rest = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "*args")
    return positional, rest


def named(
    params: tuple[tuple[str, ...], str], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The call's arguments by parameter name."""
    if not args:
        return kwargs
    positional, rest = params
    out: dict[str, Any] = {}
    extra: list[Any] = []
    for i, value in enumerate(args):
        if i < len(positional):
            out[positional[i]] = value
        else:
            extra.append(value)
    if extra:
        out[rest] = extra
    out.update(kwargs)
    return out


def args_json(values: dict[str, Any]) -> str:
    """The canonical JSON of ``step_started``'s ``args`` (see the module's docstring).
    Never raises: what is journaled for people must not fail the step."""
    try:
        return _args_json(values)
    except Exception as e:
        return dumps({"_unjournalable": type(e).__name__})


def _args_json(values: dict[str, Any]) -> str:
    try:
        text = to_json(values, "a step's arguments")
    except (NotSerializable, TypeError, ValueError, RecursionError):
        text = _lenient(values)
    low = text.lower()
    if any(hint in low for hint in _HINTS):
        text = dumps(_scrubbed(json.loads(text)))
    if len(text) > MAX_ARGS_BYTES and len(text.encode()) > MAX_ARGS_BYTES:
        head = text[: MAX_ARGS_BYTES - 100]
        return dumps({"_truncated": True, "bytes": len(text.encode()), "head": head})
    return text


def _lenient(values: dict[str, Any]) -> str:
    """What JSON can hold of ``values``: the rest as ``"<TypeName>"``."""
    from pydantic_core import to_jsonable_python

    def mark(v: Any) -> str:
        return f"<{type(v).__name__}>"

    try:
        plain = to_jsonable_python(values, fallback=mark)
        text = dumps(plain, mark)
    except (TypeError, ValueError, RecursionError):
        text = dumps({k: mark(v) for k, v in values.items()})
    # Stored the same on both backends: PostgreSQL's jsonb refuses NUL, UTF-8 a surrogate.
    if "\\u0000" in text:
        text = dumps(json.loads(text.replace("\\u0000", "\\\\x00")))
    return _storable(text)


def _scrubbed(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: REDACTED
            if _SECRET_KEY.fullmatch(k) and not isinstance(v, dict | list)
            else _scrubbed(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    if isinstance(value, str):
        return redact(value)
    return value
