"""OpenAI Responses (``POST /v1/responses``): the request read into a prompt, the reply
written as a ``response`` object (a message with ``output_text``, ``function_call``
items) or as the Responses event sequence, ``response.created`` to ``response.completed``."""

from __future__ import annotations

import time
from typing import Any

from ratchet.llm.server.answer import Answer, json_pieces, new_id, sse, text_pieces
from ratchet.llm.server.prompt import (
    BadRequest,
    LastRole,
    Prompt,
    optional_bool,
    require_model,
    require_object,
    text_of,
    tools_chars,
)
from ratchet.llm.server.replies import Reply, Usage


def read_responses(raw: Any) -> Prompt:
    """The prompt of a Responses request; refuses a body the API would refuse."""
    body = require_object(raw)
    model = require_model(body)
    items = body.get("input")
    if items is None and not body.get("previous_response_id"):
        raise BadRequest("'input' is required (a string or an array of input items)", "input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if items is not None and not isinstance(items, list):
        raise BadRequest("'input' must be a string or an array of input items", "input")
    instructions = body.get("instructions")
    chars = tools_chars(body) + (len(instructions) if isinstance(instructions, str) else 0)
    last_user, last_text = "", ""
    last_role: LastRole = "none"
    for i, item in enumerate(items or ()):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            text = text_of(item.get("content"), f"input[{i}].content")
            role = item.get("role")
            last_role = "user" if role == "user" else "assistant" if role == "assistant" else "none"
            if role == "user":
                last_user = text
        elif kind == "function_call":
            text = f"{item.get('name', '')}{item.get('arguments', '')}"
            last_role = "assistant"
        elif kind == "function_call_output":
            output = item.get("output")
            text = text_of(output, f"input[{i}].output")
            last_role = "tool"
        else:
            continue
        chars += len(text)
        last_text = text
    schema, json_object = _text_format(body.get("text"))
    return Prompt(
        endpoint="responses",
        model=model,
        last_user_text=last_user,
        last_role=last_role,
        tool_result_text=last_text if last_role == "tool" else "",
        chars=chars,
        stream=optional_bool(body, "stream"),
        json_schema=schema,
        json_object=json_object,
    )


def _text_format(text: Any) -> tuple[dict[str, Any] | None, bool]:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return None, False
    if fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        return (schema if isinstance(schema, dict) else {}), False
    return None, fmt.get("type") == "json_object"


def usage_body(usage: Usage) -> dict[str, Any]:
    """Responses ``usage``: input/output/total tokens and their details."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def render_responses(body: dict[str, Any], prompt: Prompt, reply: Reply) -> Answer:
    """The answer: a ``response`` object, or its stream of events."""
    output: list[dict[str, Any]] = []
    if reply.text is not None:
        output.append(
            {
                "id": new_id("msg_"),
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}
                ],
            }
        )
    output += [
        {
            "id": new_id("fc_"),
            "type": "function_call",
            "status": "completed",
            "call_id": new_id("call_"),
            "name": c.name,
            "arguments": c.arguments,
        }
        for c in reply.tool_calls
    ]
    now = int(time.time())
    fmt = body.get("text") if isinstance(body.get("text"), dict) else None
    response = {
        "id": new_id("resp_"),
        "object": "response",
        "created_at": now,
        "status": "completed",
        "completed_at": now,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "max_output_tokens": body.get("max_output_tokens"),
        "model": prompt.model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": fmt or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": usage_body(reply.usage),
        "user": None,
    }
    if not prompt.stream:
        return Answer(usage=reply.usage, body=response)
    return Answer(usage=reply.usage, events=_events(response))


def _events(response: dict[str, Any]) -> tuple[bytes, ...]:
    events: list[bytes] = []

    def emit(kind: str, **data: Any) -> None:
        events.append(sse({"type": kind, "sequence_number": len(events), **data}, kind))

    started = {
        **response,
        "status": "in_progress",
        "completed_at": None,
        "output": [],
        "usage": None,
    }
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            emit("response.content_part.added", **where, content_index=0, part={**part, "text": ""})
            for piece in text_pieces(part["text"]):
                emit(
                    "response.output_text.delta", **where, content_index=0, delta=piece, logprobs=[]
                )
            emit(
                "response.output_text.done",
                **where,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            emit("response.content_part.done", **where, content_index=0, part=part)
        else:
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            for piece in json_pieces(item["arguments"]):
                emit("response.function_call_arguments.delta", **where, delta=piece)
            emit(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response=response)
    return tuple(events)
