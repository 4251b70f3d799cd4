"""How the ``ratchet`` command prints values: times, durations, statuses in colour,
JSON shortened for a table cell, the note under a list cut short.

User strings always go out as :class:`rich.text.Text`, never as markup, so ``[/bold]`` or
``:child:`` in a step name prints as typed."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import typer
from rich.text import Text

from ratchet.model import dumps

STATUS_STYLE = {
    "queued": "cyan",
    "running": "blue",
    "waiting": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "completed": "green",
    "started": "blue",
    "retrying": "yellow",
    "pending": "dim",
}


def when(ts: float | None) -> str:
    """A timestamp as local ``YYYY-MM-DD HH:MM:SS``; ``-`` for None."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def duration_text(seconds: float | None) -> str:
    """``850 ms``, ``2.50 s`` or ``3m07s``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def shorten(text: str, limit: int | None) -> str:
    """``text`` cut to ``limit`` characters, ending in …; whole when ``limit`` is None."""
    if limit is not None and len(text) > limit:
        return text[: limit - 1] + "…"
    return text


def compact(value: Any, limit: int | None = 100) -> str:
    """``value`` as compact JSON, shortened to ``limit``."""
    return shorten(dumps(value), limit)


def status_text(status: str) -> Text:
    """A status in its colour."""
    return Text(status, style=STATUS_STYLE.get(status, ""))


def more_note(shown: int, total: int, what: str) -> str:
    """The note under a list cut at ``--limit``."""
    return f"showing {shown:,} of {total:,} {what}; --limit to see more"


def echo_json(value: Any) -> None:
    """Print ``value`` as one line of JSON."""
    typer.echo(json.dumps(value, ensure_ascii=False, default=str))
