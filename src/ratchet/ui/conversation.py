"""A run's model calls as a conversation, for the run page: one turn per LLM step, with
the messages it was sent (as :func:`ratchet.model.requests.requests_of` reads them from
the journal), the model's reply (from the provider's response body the step completed
with), its tokens, cost and latency, and how each attempt of it ended (retried, failed, or
cut short by its worker's death, in the words of :func:`ratchet.model.story.drives`).

Messages are normalised across providers (OpenAI chat completions and Responses, Anthropic
messages) into a role, text, tool calls and tool results; what is none of those is kept
as JSON text. A view for people, like the waterfall: everything in it came from a journal,
so it is data to escape, never markup.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ratchet.model import Event, EventKind
from ratchet.model.states import TERMINAL_EVENTS
from ratchet.model.story import DriveStory, drives

# The request's parameters shown beside a turn (the rest stays in its raw JSON).
_SHOWN_PARAMS = ("tool_choice", "response_format", "temperature", "max_tokens", "top_p")


@dataclass(slots=True)
class ToolCall:
    """A tool call an assistant message makes: its id, the tool, its arguments as text."""

    id: str | None
    name: str
    arguments: str


@dataclass(slots=True)
class Message:
    """One message: ``role`` is system, user, assistant or tool (a tool's result, which
    Anthropic sends as a user message of ``tool_result`` blocks)."""

    role: str
    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    answers: str | None = None  # a tool result's call id
    tool: str | None = None  # the tool whose call it answers, when the call was seen


@dataclass(slots=True)
class Attempt:
    """One attempt of a turn's step and how it ended: completed, retrying (it failed and
    was tried again), failed, interrupted (its drive ended before it did: ``note`` says
    how, a crash most often), waiting or running."""

    attempt: int
    outcome: str
    seq: int
    error: str | None = None
    note: str | None = None


@dataclass(slots=True)
class Turn:
    """One LLM step of the run, as a turn of its conversation."""

    number: int  # its place among the run's LLM steps, from 1
    step_id: str
    status: str
    provider: str | None
    model: str | None
    journaled: bool  # whether the step's request is in the journal
    messages: list[Message]  # what it was sent (from ``skipped`` on)
    skipped: int  # messages left out: those the turn it continues showed already
    continues: str | None  # the step whose conversation it continues
    tools: list[str]
    params: dict[str, Any]
    reply: Message | None
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    latency_ms: float | None
    attempts: list[Attempt]
    # What a replay found changed in its request (``request_drifted``), in the journal's words.
    drifts: list[str] = field(default_factory=list)

    @property
    def attempts_shown(self) -> bool:
        """Whether the attempts are worth telling: more than one, or one that did not
        simply complete."""
        return len(self.attempts) > 1 or any(a.outcome != "completed" for a in self.attempts)


def _text(content: Any) -> str:
    """A message's content as text: a string as it is, text parts joined, any other
    part (an image, a file) as its JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                parts.append(_json(part))
        return "\n".join(parts)
    return _json(content)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _arguments(raw: Any) -> str:
    """Tool call arguments as indented JSON when they are JSON, else as they came."""
    if isinstance(raw, str):
        text = raw
        try:
            raw = json.loads(text)
        except ValueError:
            return text
    return json.dumps(raw, indent=2, ensure_ascii=False, default=str)


def message(raw: Any) -> Message:
    """A request's message (OpenAI or Anthropic, or a Responses API input item) as shown."""
    if not isinstance(raw, dict):
        return Message("user", _text(raw))
    role = str(raw.get("role") or raw.get("type") or "message")
    content = raw.get("content")
    kind = raw.get("type")
    if kind == "function_call":  # Responses API items
        call = ToolCall(raw.get("call_id"), str(raw.get("name")), _arguments(raw.get("arguments")))
        return Message("assistant", calls=[call])
    if kind == "function_call_output":
        return Message("tool", _text(raw.get("output")), answers=raw.get("call_id"))
    if role == "developer":
        role = "system"
    if role == "tool" or role == "function":  # OpenAI tool results
        return Message(
            "tool", _text(content), answers=raw.get("tool_call_id"), tool=raw.get("name")
        )
    msg = Message(role)
    if isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result") for b in content
    ):  # Anthropic blocks
        texts = []
        for block in content:
            if not isinstance(block, dict):
                texts.append(_text(block))
            elif block.get("type") == "tool_use":
                msg.calls.append(
                    ToolCall(
                        block.get("id"), str(block.get("name")), _arguments(block.get("input"))
                    )
                )
            elif block.get("type") == "tool_result":
                msg.role, msg.answers = "tool", block.get("tool_use_id")
                texts.append(_text(block.get("content")))
            else:
                texts.append(_text([block]))
        msg.text = "\n".join(t for t in texts if t)
        return msg
    msg.text = _text(content)
    for call in raw.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            msg.calls.append(
                ToolCall(call.get("id"), str(fn.get("name")), _arguments(fn.get("arguments")))
            )
    return msg


def reply(output: Any) -> Message | None:
    """The model's answer in a step's output: the assistant message of an OpenAI chat
    completion, a Responses API body, an Anthropic message (whole, or streamed: the
    response inside the stream's output) or a Pydantic AI model response; None for
    anything else."""
    inner = output.get("response") if isinstance(output, dict) else None
    if isinstance(inner, dict) and not {"choices", "content", "parts"} & set(output):
        output = inner  # a stream's output, or Pydantic AI's: the response inside
    if isinstance(output, str):
        return Message("assistant", output)
    if not isinstance(output, dict):
        return None
    choices = output.get("choices")
    if isinstance(choices, list):
        first = choices[0] if choices and isinstance(choices[0], dict) else {}
        raw = first.get("message")
        return message({**raw, "role": "assistant"}) if isinstance(raw, dict) else None
    items = output.get("output")
    if isinstance(items, list):  # the Responses API
        msg = Message("assistant")
        texts = []
        for item in items:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message":
                texts.append(_text(item.get("content")))
            elif item.get("type") == "function_call":
                msg.calls += message(item).calls
        msg.text = "\n".join(t for t in texts if t)
        return msg
    parts = output.get("parts")
    if isinstance(parts, list):  # Pydantic AI's ModelResponse
        msg = Message("assistant")
        texts = []
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("part_kind") == "text":
                texts.append(_text(part.get("content")))
            elif part.get("part_kind") == "tool-call":
                name, args = str(part.get("tool_name")), _arguments(part.get("args"))
                msg.calls.append(ToolCall(part.get("tool_call_id"), name, args))
        msg.text = "\n".join(t for t in texts if t)
        return msg
    content = output.get("content")
    if isinstance(content, list) and output.get("type", "message") == "message":  # Anthropic
        got = message({"role": "assistant", "content": content})
        got.role = "assistant"
        return got
    return None


def _same(a: Message, b: Message) -> bool:
    return (a.role, a.text, [(c.name, c.arguments) for c in a.calls]) == (
        b.role,
        b.text,
        [(c.name, c.arguments) for c in b.calls],
    )


def _prefix(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _drive_of(seq: int, all_drives: list[DriveStory]) -> DriveStory | None:
    found = None
    for d in all_drives:
        if d.start_seq <= seq:
            found = d
    return found


def _cut_short(attempt: Attempt, all_drives: list[DriveStory]) -> None:
    """``attempt`` never ended: its drive did first (a crash, a cancel), as the drive says."""
    attempt.outcome = "interrupted"
    drive = _drive_of(attempt.seq, all_drives)
    if drive is not None and drive.ended:
        attempt.note = f"drive {drive.drive} by {drive.worker_id or '?'}: {drive.ended}"


def _attempts(events: list[Event], all_drives: list[DriveStory], over: bool) -> list[Attempt]:
    """Each attempt of one step (its events in seq order) and how it ended; ``over``:
    the run has ended, so an attempt still going was cut short."""
    out: list[Attempt] = []
    current: Attempt | None = None
    for ev in events:
        if ev.kind == EventKind.STEP_STARTED:
            if current is not None and current.outcome == "running":
                _cut_short(current, all_drives)
            current = Attempt(ev.attempt or len(out) + 1, "running", ev.seq)
            out.append(current)
        elif current is None:
            continue
        elif ev.kind == EventKind.STEP_COMPLETED:
            current.outcome = "completed"
        elif ev.kind in (EventKind.STEP_RETRYING, EventKind.STEP_FAILED):
            current.outcome = "retrying" if ev.kind == EventKind.STEP_RETRYING else "failed"
            current.error = ev.payload.get("error")
        elif ev.kind == EventKind.STEP_WAITING:
            current.outcome = "waiting"
    if over and current is not None and current.outcome == "running":
        _cut_short(current, all_drives)
    return out


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _tokens(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return int(value) if isinstance(value, int | float) else None


def turns(
    events: list[Event], requests: dict[str, dict[str, Any]], whole: str | None = None
) -> list[Turn]:
    """The run's LLM steps as turns, in the order they first started. ``requests`` is
    :func:`ratchet.model.requests.requests_of` of ``events``. Each turn holds only the
    messages the turn it continues did not (a conversation of 200 turns shows each
    message once); the model's reply, echoed back as the next request's first new
    message, is not shown twice. With ``whole``, that step's turn alone, with every
    message it was sent."""
    all_drives = drives(events)
    over = any(ev.kind in TERMINAL_EVENTS for ev in events)
    by_step: dict[str, list[Event]] = {}
    started: dict[str, dict[str, Any]] = {}
    kinds: dict[str, str | None] = {}
    drifts: dict[str, list[str]] = {}
    for ev in events:
        if ev.kind == EventKind.REQUEST_DRIFTED and ev.step_id is not None:
            drifts.setdefault(ev.step_id, []).append(str(ev.payload.get("message") or "changed"))
        if ev.step_id is None or not ev.kind.startswith("step_"):
            continue
        by_step.setdefault(ev.step_id, []).append(ev)
        if ev.kind == EventKind.STEP_STARTED:
            started[ev.step_id] = ev.payload
            kinds[ev.step_id] = ev.payload.get("kind", kinds.get(ev.step_id))
    out: list[Turn] = []
    full: dict[str, list[Any]] = {}  # each turn's whole message list, as sent
    replies: dict[str, Message | None] = {}
    names: dict[str, str] = {}  # tool call id -> tool
    previous: str | None = None
    for step_id, step_events in by_step.items():
        if kinds.get(step_id) != "llm":
            continue
        payload = started[step_id]
        request = requests.get(step_id)
        sent = list(request.get("messages") or []) if request else []
        full[step_id] = sent
        base = None if step_id == whole else _base(payload, previous, full)
        skipped = _prefix(full[base], sent) if base is not None else 0
        shown = [message(m) for m in sent[skipped:]]
        before = replies.get(base) if base is not None else None
        if shown and before is not None and _same(shown[0], before):
            shown, skipped = shown[1:], skipped + 1
        completed = next(
            (e.payload for e in reversed(step_events) if e.kind == EventKind.STEP_COMPLETED), None
        )
        answer = reply(completed.get("output")) if completed is not None else None
        for m in [*shown, *([answer] if answer else [])]:
            for c in m.calls:
                if c.id:
                    names[c.id] = c.name
            if m.answers and not m.tool:
                m.tool = names.get(m.answers)
        status = _status(step_events)
        meta = (completed or {}).get("llm") or {}
        usage = meta.get("usage") or {}
        params = {k: v for k, v in (request or {}).items() if k != "messages"}
        system = params.pop("system", None)  # Anthropic's system prompt
        if system and not skipped:
            shown.insert(0, Message("system", _text(system)))
        out.append(
            Turn(
                number=len(out) + 1,
                step_id=step_id,
                status="interrupted" if over and status == "running" else status,
                provider=meta.get("provider") or payload.get("provider"),
                model=meta.get("model") or payload.get("model"),
                journaled=request is not None,
                messages=shown,
                skipped=skipped,
                continues=base if skipped else None,
                tools=_tool_names(params.get("tools")),
                params={k: params[k] for k in _SHOWN_PARAMS if params.get(k) is not None},
                reply=answer,
                input_tokens=_tokens(usage, "input_tokens"),
                output_tokens=_tokens(usage, "output_tokens"),
                cost_usd=_number(meta.get("cost_usd")),
                latency_ms=_number(meta.get("latency_ms")),
                attempts=_attempts(step_events, all_drives, over),
                drifts=drifts.get(step_id, []),
            )
        )
        replies[step_id] = answer
        previous = step_id
    return out if whole is None else [t for t in out if t.step_id == whole]


def _base(payload: dict[str, Any], previous: str | None, full: dict[str, list[Any]]) -> str | None:
    """The turn a request continues: the step its journaled messages were built from, or
    else the turn before it."""
    request = payload.get("request")
    messages = request.get("messages") if isinstance(request, dict) else None
    source = messages.get("from") if isinstance(messages, dict) else None
    if isinstance(source, str) and source in full:
        return source
    return previous


_STATUS: dict[str, str] = {
    EventKind.STEP_STARTED: "running",
    EventKind.STEP_COMPLETED: "completed",
    EventKind.STEP_FAILED: "failed",
    EventKind.STEP_RETRYING: "retrying",
    EventKind.STEP_WAITING: "waiting",
}


def _status(events: list[Event]) -> str:
    last = str(events[-1].kind)
    return _STATUS.get(last, last)


def _tool_names(tools: Any) -> list[str]:
    if not isinstance(tools, list):
        return []
    names = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
        names.append(str(name or tool.get("type") or "?"))
    return names
