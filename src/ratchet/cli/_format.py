"""How the ``ratchet`` command prints values: times, durations, statuses in colour,
JSON shortened for a table cell, the note under a list cut short.

User strings always go out as :class:`rich.text.Text`, never as markup, so ``[/bold]`` or
``:child:`` in a step name prints as typed."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import typer
from rich.text import Text

from ratchet.model import RunRecord, RunStatus, WaitKey, WaitKind, dumps

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


def utc_text(ts: float, now: float | None = None) -> str:
    """A moment as ``12:03:04 UTC``, with its date when it is not today's (UTC)."""
    at = datetime.fromtimestamp(ts, UTC)
    today = datetime.fromtimestamp(now, UTC) if now is not None else datetime.now(UTC)
    return at.strftime("%H:%M:%S UTC" if at.date() == today.date() else "%Y-%m-%d %H:%M:%S UTC")


def waiting_text(rec: RunRecord, now: float | None = None) -> str | None:
    """What a waiting run waits for, and until when where a time applies: ``waiting for
    signal approve``, ``sleeping until 12:03:04 UTC``, ``backing off until ...``; None
    for a run that is not waiting."""
    if rec.status == RunStatus.WAITING and not rec.waiting_for and rec.not_before is not None:
        # Waiting on no key: a delayed or debounced start, not begun yet.
        return f"starts at {utc_text(rec.not_before, now)}"
    if rec.status != RunStatus.WAITING or not rec.waiting_for:
        return None
    try:
        members = WaitKey.parse(rec.waiting_for).members
    except ValueError:
        return f"waiting for {rec.waiting_for}"
    until = None if rec.not_before is None else utc_text(rec.not_before, now)
    timed = {WaitKind.SLEEP: "sleeping", WaitKind.BACKOFF: "backing off"}
    said = []
    for key in members:
        if key.kind in timed:
            said.append(timed[key.kind] + (f" until {until}" if until else ""))
        elif key.kind == WaitKind.CHILD:
            said.append(f"waiting for child run {key.value}")
        else:
            said.append(f"waiting for {key.kind} {key.value}")
    text = " or ".join(said)
    # A signal or an approval with a deadline: the time it gives up waiting.
    if until and not any(k.kind in timed for k in members):
        text += f" (times out at {until})"
    return text


def cost_text(usd: float) -> str:
    """Dollars rounded for reading: cents from $1 (``$12.35``), else three significant
    digits (``$0.00123``); JSON output keeps the exact sum."""
    if usd >= 1 or usd <= 0:
        return f"${usd:,.2f}"
    places = max(2, 2 - math.floor(math.log10(usd)))
    text = f"{usd:.{places}f}".rstrip("0")
    return "$" + (text if len(text.partition(".")[2]) >= 2 else f"{usd:.2f}")


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


def status_text(status: str, note: str | None = None) -> Text:
    """A status in its colour, with ``note`` after it (what a waiting run waits for)."""
    text = Text(status, style=STATUS_STYLE.get(status, ""))
    if note:
        text.append(f" ({note})")
    return text


def more_note(shown: int, total: int, what: str) -> str:
    """The note under a list cut at ``--limit``."""
    return f"showing {shown:,} of {total:,} {what}; --limit to see more"


def echo_json(value: Any) -> None:
    """Print ``value`` as one line of JSON."""
    typer.echo(json.dumps(value, ensure_ascii=False, default=str))
