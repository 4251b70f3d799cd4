"""Anthropic Messages (``POST /v1/messages``): the request read into a prompt, the reply
written as a ``message`` (``text`` and ``tool_use`` blocks) or as its event stream,
``message_start`` to ``message_stop``."""

from __future__ import annotations

import json
from typing import Any

from ratchet.llm.server.answer import Answer, json_pieces, new_id, sse, text_pieces
from ratchet.llm.server.prompt import (
    BadRequest,
    LastRole,
    Prompt,
    compact,
    optional_bool,
    require_list,
    require_model,
    require_object,
    text_of,
    tools_chars,
)
from ratchet.llm.server.replies import Reply, Usage


def read_messages(raw: Any) -> Prompt:
    """The prompt of a Messages request; refuses a body the API would refuse."""
    body = require_object(raw)
    model = require_model(body)
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest("'max_tokens' is required: a positive integer", "max_tokens")
    messages = require_list(body, "messages")
    chars = tools_chars(body) + len(text_of(body.get("system"), "system"))
    last_user, tool_text = "", ""
    last_role: LastRole = "none"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise BadRequest(
                f"messages[{i}] must be an object with role user or assistant", "messages"
            )
        text, results = _blocks(message.get("content"), f"messages[{i}].content")
        chars += len(text) + len(results)
        if message["role"] == "assistant":
            last_role = "assistant"
            continue
        # A user turn that only carries tool results answers the model; it is not the
        # user's own message.
        has_results = _has_tool_results(message.get("content"))
        last_role = "tool" if has_results else "user"
        tool_text = results
        if text or not has_results:
            last_user = text
    schema = _output_schema(body)
    return Prompt(
        endpoint="messages",
        model=model,
        last_user_text=last_user,
        last_role=last_role,
        tool_result_text=tool_text if last_role == "tool" else "",
        chars=chars,
        stream=optional_bool(body, "stream"),
        json_schema=schema,
    )


def _blocks(content: Any, where: str) -> tuple[str, str]:
    """(the text of the content's text and tool_use blocks, the text of its tool results)"""
    if content is None or isinstance(content, str):
        return content or "", ""
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or an array of content blocks", where)
    texts, results = [], []
    for j, block in enumerate(content):
        if not isinstance(block, dict):
            raise BadRequest(f"{where}[{j}] must be an object", where)
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            texts.append(f"{block.get('name', '')}{compact(block.get('input', {}))}")
        elif kind == "tool_result":
            results.append(text_of(block.get("content"), f"{where}[{j}].content"))
    return "\n".join(texts), "\n".join(results)


def _has_tool_results(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _output_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else body.get("output_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        return schema if isinstance(schema, dict) else {}
    return None


def usage_body(usage: Usage) -> dict[str, Any]:
    """Messages ``usage``: cache reads are counted apart from ``input_tokens``."""
    return {
        "input_tokens": usage.input_tokens - usage.cached_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "service_tier": "standard",
    }


def render_messages(body: dict[str, Any], prompt: Prompt, reply: Reply) -> Answer:
    """The answer: a ``message``, or its stream of events."""
    content: list[dict[str, Any]] = []
    if reply.text is not None:
        content.append({"type": "text", "text": reply.text})
    content += [
        {
            "type": "tool_use",
            "id": new_id("toolu_"),
            "name": c.name,
            "input": json.loads(c.arguments),
        }
        for c in reply.tool_calls
    ]
    message = {
        "id": new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": prompt.model,
        "content": content,
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": usage_body(reply.usage),
    }
    if not prompt.stream:
        return Answer(usage=reply.usage, body=message)
    return Answer(usage=reply.usage, events=_events(message))


def _events(message: dict[str, Any]) -> tuple[bytes, ...]:
    events: list[bytes] = []

    def emit(kind: str, **data: Any) -> None:
        events.append(sse({"type": kind, **data}, kind))

    usage = message["usage"]
    emit(
        "message_start",
        message={
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        },
    )
    emit("ping")
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
            for piece in text_pieces(block["text"]):
                emit(
                    "content_block_delta", index=index, delta={"type": "text_delta", "text": piece}
                )
        else:
            emit("content_block_start", index=index, content_block={**block, "input": {}})
            for piece in json_pieces(
                json.dumps(block["input"], ensure_ascii=False, separators=(",", ":"))
            ):
                emit(
                    "content_block_delta",
                    index=index,
                    delta={"type": "input_json_delta", "partial_json": piece},
                )
        emit("content_block_stop", index=index)
    emit(
        "message_delta",
        delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
        usage={
            k: usage[k]
            for k in (
                "input_tokens",
                "output_tokens",
                "cache_creation_input_tokens",
                "cache_read_input_tokens",
            )
        },
    )
    emit("message_stop")
    return tuple(events)
