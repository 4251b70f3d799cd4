"""SDK exceptions as Ratchet's retry classes.

Rate limits, server errors (5xx), a conflict or a request timeout answered by the provider,
and lost connections are ``llm`` (retried); the SDK's own timeouts are ``timeout``; any other
4xx is the request's fault and is not retried, with the provider's message in
``step_failed``. A lost connection and a timeout leave the outcome unknown (the provider may
have received the request, answered and billed it): their retry sends the same
Idempotency-Key, so a provider that honours it answers from what it stored and bills once.
Only an answer from the provider (any status) earns the next attempt a key of its own.
"""

from __future__ import annotations

import email.utils
import importlib
import time
from typing import Any

from ratchet.errors import LLMError, LLMRequestError, LLMTimeout

_RETRIED_STATUSES = frozenset({408, 409, 429})


def as_llm_error(provider: str, e: Exception) -> Exception:
    """The Ratchet error for an exception the ``provider``'s SDK raised; any other
    exception is returned as it is."""
    sdk = importlib.import_module(provider)
    name = type(e).__name__
    if isinstance(e, sdk.APITimeoutError):
        return LLMTimeout(f"{provider} {name}: the request timed out", provider=provider)
    if isinstance(e, sdk.APIConnectionError):
        return LLMError(f"{provider} {name}: {e}", provider=provider, outcome_unknown=True)
    if not isinstance(e, sdk.APIStatusError):
        return e
    status = int(e.status_code)
    response = getattr(e, "response", None)
    headers = getattr(response, "headers", None) or {}
    request_id = getattr(e, "request_id", None)
    message = f"{provider} {status} {name}: {_provider_message(e)}"
    cls = LLMError if status in _RETRIED_STATUSES or status >= 500 else LLMRequestError
    return cls(
        message,
        provider=provider,
        status_code=status,
        retry_after_s=_retry_after(headers),
        request_id=request_id,
    )


def _provider_message(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return str(getattr(e, "message", None) or e)


def _retry_after(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, AttributeError):
        return None
