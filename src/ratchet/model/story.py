"""A run's story, read from its journal: the input as it was given, its drives (who drove
each and why each ended), and how long it took, for ``ratchet show``, the API and the run
page alike. A view for people, like the waterfall: the fold is still the run's state.

Old journals read too: a field a drive's or an end's event lacks (a cancel's ``by``, a
claim reason this version does not know) is left out of the label, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ratchet.model.events import Event, dumps
from ratchet.model.payloads import UNNAMED_CANCEL
from ratchet.model.states import TERMINAL_EVENTS, ClaimReason, EventKind

# Written by others than the drive (the API, a person), while it runs or parks.
_EXTERNAL = frozenset({EventKind.SIGNAL_RECEIVED, EventKind.APPROVAL_DECIDED, EventKind.RUN_QUEUED})
# How a drive took its run, in the words of the drive before it (see _ended_by).
_TAKEN_OVER: dict[str, str] = {
    ClaimReason.TAKEOVER: "worker killed, taken over by {w} after {s}",
    ClaimReason.SWEEP: "worker lost (killed or hung), lease expired, taken over by {w} after {s}",
    ClaimReason.RECLAIM: "worker restarted, run reclaimed by {w} after {s}",
}


def given_input(stored: Any) -> Any:
    """A run's stored input (``{"args": [...], "kwargs": {...}}``) in the shape it was
    started with: the arguments by name when it was given keyword arguments only, a
    list when positional ones only (the one value when there was one: a graph's input,
    a start with a single argument), both as stored when both were given."""
    if isinstance(stored, dict) and set(stored) == {"args", "kwargs"}:
        args, kwargs = stored["args"], stored["kwargs"]
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return stored
        if not args:
            return kwargs
        if not kwargs:
            return args[0] if len(args) == 1 else args
    return stored


@dataclass(slots=True)
class DriveStory:
    """One drive of a run: from its ``run_started``/``run_resumed`` to its last event."""

    drive: int
    worker_id: str | None
    reason: str | None  # the ClaimReason it took the run with
    start: float
    start_seq: int
    end: float  # its last event's time
    end_seq: int
    ended: str | None = None  # why it ended; None while it goes on

    @property
    def label(self) -> str:
        who = self.worker_id or "?"
        how = f" ({self.reason})" if self.reason and self.reason != ClaimReason.CLAIM else ""
        return f"drive {self.drive} by {who}{how}: {self.ended or 'running'}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "drive": self.drive,
            "worker_id": self.worker_id,
            "reason": self.reason,
            "start": self.start,
            "start_seq": self.start_seq,
            "end": self.end,
            "end_seq": self.end_seq,
            "ended": self.ended,
            "label": self.label,
        }


def _secs(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s" if s < 120 else f"{s / 60:.0f} min"


def _ended_by(prev: DriveStory, nxt: DriveStory, parked: str | None) -> str:
    """Why ``prev`` ended, as the drive after it tells."""
    gap = _secs(max(nxt.start - prev.end, 0.0))
    who = nxt.worker_id or "?"
    template = _TAKEN_OVER.get(nxt.reason or "")
    if template is not None:
        return template.format(w=who, s=gap)
    if parked is not None:
        return f"parked ({parked}), resumed by {who} after {gap}"
    if nxt.reason == ClaimReason.RETRY:
        return f"handed back, driven again by {who}"
    if nxt.reason in (None, ClaimReason.CLAIM, ClaimReason.SANDBOX):
        return f"handed back, resumed by {who} after {gap}"
    return f"ended, taken over by {who} ({nxt.reason}) after {gap}"


def _terminal(ev: Event) -> str:
    p = ev.payload
    if ev.kind == EventKind.RUN_SUCCEEDED:
        return "succeeded"
    if ev.kind == EventKind.RUN_CANCELLED:
        by = p.get("by")
        return f"cancelled by {by}" if by and by != UNNAMED_CANCEL else "cancelled"
    reason = p.get("reason")
    return f"failed, dead-lettered ({reason})" if reason else "failed"


def _unowned(ev: Event) -> bool:
    """A cancel of a run no worker held: the store wrote it, naming who asked and no
    more; the drive had ended before it (parked, or handed back). A worker's own cancel
    carries its ``error`` beside ``by``."""
    p = ev.payload
    return ev.kind == EventKind.RUN_CANCELLED and bool(p.get("by")) and "error" not in p


def drives(events: list[Event]) -> list[DriveStory]:
    """The drives of a journal (in seq order), each with why it ended."""
    out: list[DriveStory] = []
    current: DriveStory | None = None
    parked: str | None = None  # what the current drive's run waits for, once parked
    for ev in events:
        kind = ev.kind
        if kind in (EventKind.RUN_STARTED, EventKind.RUN_RESUMED):
            p = ev.payload
            number = p.get("drive")
            nxt = DriveStory(
                number if isinstance(number, int) else len(out) + 1,
                p.get("worker_id"),
                p.get("reason") or (ClaimReason.CLAIM if kind == EventKind.RUN_STARTED else None),
                ev.at,
                ev.seq,
                ev.at,
                ev.seq,
            )
            if current is not None and current.ended is None:
                current.ended = _ended_by(current, nxt, parked)
            out.append(nxt)
            current, parked = nxt, None
            continue
        if current is None:
            continue
        if kind == EventKind.RUN_QUEUED and ev.payload.get("reason") == "retry":
            by = ev.payload.get("by")
            current.ended = f"{current.ended or 'failed'}, retried by {by or 'a person'}"
        elif kind in TERMINAL_EVENTS:
            ended = _terminal(ev)
            if _unowned(ev) and current.ended is None:
                current.ended = f"parked ({parked}), {ended}" if parked else ended
            else:
                current.ended, current.end, current.end_seq = ended, ev.at, ev.seq
        elif kind not in _EXTERNAL and current.ended is None:
            current.end, current.end_seq = ev.at, ev.seq
            if kind == EventKind.STEP_WAITING:
                parked = str(ev.payload.get("reason") or "waiting")
            elif kind.startswith("step_"):
                parked = None
    return out


def duration(events: list[Event]) -> float | None:
    """From the first drive's start to the run's end (or its last event), in seconds."""
    start = next(
        (e.at for e in events if e.kind in (EventKind.RUN_STARTED, EventKind.RUN_RESUMED)), None
    )
    if start is None or not events:
        return None
    return max(events[-1].at - start, 0.0)


def failure(events: list[Event]) -> tuple[str | None, str | None]:
    """The step whose failure failed the run (None: the workflow's own code, or no
    failure) and the traceback journaled with it (None in journals older than tracebacks)."""
    step: str | None = None
    trace: str | None = None
    for ev in events:
        if ev.kind == EventKind.STEP_FAILED:
            step, trace = ev.step_id, ev.payload.get("traceback")
        elif ev.kind == EventKind.RUN_FAILED and ev.payload.get("traceback"):
            step, trace = None, ev.payload.get("traceback")
        elif ev.kind == EventKind.RUN_QUEUED and ev.payload.get("reason") == "retry":
            step, trace = None, None  # retried: the failure before is over
    return step, trace


def answer_text(output: Any) -> str | None:
    """A model call's answer as text, from the provider's response body a completed LLM
    step journals (OpenAI chat completions and responses, Anthropic messages): its text,
    and its tool calls as ``name(arguments)``; None when the body is none of those."""
    if isinstance(output, str):
        return output
    if not isinstance(output, dict):
        return None
    parts: list[str] = []
    choices = output.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict):
                parts += _texts(message.get("content"))
                for call in message.get("tool_calls") or []:
                    fn = call.get("function") if isinstance(call, dict) else None
                    if isinstance(fn, dict):
                        parts.append(f"{fn.get('name')}({fn.get('arguments') or ''})")
        return "\n".join(parts) if choices else None
    items = output.get("output")
    if isinstance(items, list):  # the Responses API
        for item in items:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message":
                parts += _texts(item.get("content"))
            elif item.get("type") == "function_call":
                parts.append(f"{item.get('name')}({item.get('arguments') or ''})")
        return "\n".join(parts)
    content = output.get("content")
    if isinstance(content, list) and output.get("type", "message") == "message":  # Anthropic
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                parts.append(f"{block.get('name')}({_compact(block.get('input'))})")
            else:
                parts += _texts([block])
        return "\n".join(parts)
    return None


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        str(block["text"])
        for block in content
        if isinstance(block, dict) and isinstance(block.get("text"), str)
    ]


def _compact(value: Any) -> str:
    return dumps(value) if value is not None else ""
