"""``Idempotency-Key`` on a model request's HTTP request, not in its model settings.

The model's settings are the user's: the model sees them as given, inside a workflow as
outside. The key is added where it belongs, to the HTTP request the model's SDK client
sends from inside the request's step: a request hook on that client's HTTP client (an
``OpenAIChatModel``'s, ``OpenAIResponsesModel``'s or ``AnthropicModel``'s, and those of the
OpenAI-compatible providers) adds the step's key to the requests sent while the step runs,
and to nothing else the client sends.
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any

# The key of the model request step running in this context.
request_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ratchet_pai_request_key", default=None
)

_HOOKED: weakref.WeakSet[Any] = weakref.WeakSet()


async def _add_key(request: Any) -> None:
    key = request_key.get()
    # A key the user put in the request's headers is theirs to keep.
    if key is not None and "idempotency-key" not in request.headers:
        request.headers["Idempotency-Key"] = key


def send_keys(http_client: Any) -> None:
    """Have ``http_client`` (an ``httpx``-style async client) send the running model
    request step's key; once per client."""
    hooks = getattr(http_client, "event_hooks", None)
    if not isinstance(hooks, dict) or http_client in _HOOKED:
        return
    requests = hooks.get("request")
    if isinstance(requests, list):
        requests.append(_add_key)
        _HOOKED.add(http_client)
