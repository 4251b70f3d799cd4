"""OpenAI Chat Completions (``POST /v1/chat/completions``): the request read into a prompt,
the reply written as a ``chat.completion`` or as ``chat.completion.chunk`` events."""

from __future__ import annotations

import time
from typing import Any

from ratchet.llm.server.answer import Answer, json_pieces, new_id, sse, text_pieces
from ratchet.llm.server.prompt import (
    BadRequest,
    LastRole,
    Prompt,
    optional_bool,
    require_list,
    require_model,
    require_object,
    text_of,
    tools_chars,
)
from ratchet.llm.server.replies import Reply, Usage

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def read_chat(raw: Any) -> Prompt:
    """The prompt of a chat completions request; refuses a body the API would refuse."""
    body = require_object(raw)
    model = require_model(body)
    messages = require_list(body, "messages")
    chars = tools_chars(body)
    last_user = ""
    texts: list[str] = []
    roles: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object", "messages")
        role = message.get("role")
        if role not in _ROLES:
            raise BadRequest(
                f"messages[{i}].role must be one of {', '.join(sorted(_ROLES))}, got {role!r}",
                "messages",
            )
        text = text_of(message.get("content"), f"messages[{i}].content")
        chars += len(text)
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                chars += len(f"{function.get('name', '')}{function.get('arguments', '')}")
        if role == "user":
            last_user = text
        texts.append(text)
        roles.append(role)
    n = body.get("n")
    if n is not None and n != 1:
        raise BadRequest(f"n={n!r} is not supported: the local provider gives one choice", "n")
    stream = optional_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    schema, json_object = _response_format(body.get("response_format"))
    last_role = _last_role(roles[-1])
    return Prompt(
        endpoint="chat",
        model=model,
        last_user_text=last_user,
        last_role=last_role,
        tool_result_text=texts[-1] if last_role == "tool" else "",
        chars=chars,
        stream=stream,
        include_usage=include_usage,
        json_schema=schema,
        json_object=json_object,
    )


def _last_role(role: str) -> LastRole:
    if role in ("tool", "function"):
        return "tool"
    if role in ("user", "assistant"):
        return "user" if role == "user" else "assistant"
    return "none"


def _response_format(value: Any) -> tuple[dict[str, Any] | None, bool]:
    if value is None:
        return None, False
    if not isinstance(value, dict) or value.get("type") not in (
        "text",
        "json_object",
        "json_schema",
    ):
        raise BadRequest(
            "response_format.type must be text, json_object or json_schema", "response_format"
        )
    if value["type"] == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return (schema if isinstance(schema, dict) else {}), False
    return None, value["type"] == "json_object"


def usage_body(usage: Usage) -> dict[str, Any]:
    """Chat ``usage``: prompt/completion/total tokens and their details."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def render_chat(body: dict[str, Any], prompt: Prompt, reply: Reply) -> Answer:
    """The answer: a ``chat.completion`` body, or its chunks ending in ``[DONE]``."""
    head = {
        "id": new_id("chatcmpl-"),
        "created": int(time.time()),
        "model": prompt.model,
        "service_tier": "default",
        "system_fingerprint": "fp_ratchet_local",
    }
    calls = [
        {
            "id": new_id("call_"),
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for c in reply.tool_calls
    ]
    finish = "tool_calls" if calls else "stop"
    if not prompt.stream:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text,
            "refusal": None,
            "annotations": [],
        }
        if calls:
            message["tool_calls"] = calls
        body = {
            **head,
            "object": "chat.completion",
            "usage": usage_body(reply.usage),
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
        }
        return Answer(usage=reply.usage, body=body)
    return Answer(usage=reply.usage, events=_chunks(prompt, reply, head, calls, finish))


def _chunks(
    prompt: Prompt, reply: Reply, head: dict[str, Any], calls: list[dict[str, Any]], finish: str
) -> tuple[bytes, ...]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        data: dict[str, Any] = {
            **head,
            "object": "chat.completion.chunk",
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if prompt.include_usage:
            data["usage"] = None
        return sse(data)

    events = [
        chunk(
            {
                "role": "assistant",
                "content": "" if reply.text is not None else None,
                "refusal": None,
            }
        )
    ]
    events += [chunk({"content": piece}) for piece in text_pieces(reply.text or "")]
    for index, call in enumerate(calls):
        function = call["function"]
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": function["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        events += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in json_pieces(function["arguments"])
        ]
    events.append(chunk({}, finish))
    if prompt.include_usage:
        events.append(
            sse(
                {
                    **head,
                    "object": "chat.completion.chunk",
                    "choices": [],
                    "usage": usage_body(reply.usage),
                }
            )
        )
    events.append(sse("[DONE]"))
    return tuple(events)
