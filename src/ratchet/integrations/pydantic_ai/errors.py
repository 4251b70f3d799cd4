"""Pydantic AI's model errors as Ratchet's retry classes, the way :mod:`ratchet.llm.sdk_errors`
maps the SDKs' own: rate limits, server errors (5xx), a conflict or a request timeout
answered by the provider, and lost connections are ``llm``; timeouts are ``timeout``; a
request the provider refused (any other 4xx, exhausted quota) is ``never``. A lost
connection or a timeout leaves open whether the provider got the request
(``outcome_unknown``): its retry sends the same Idempotency-Key.
"""

from __future__ import annotations

from pydantic_ai import exceptions as pai

from ratchet.errors import LLMError, LLMRequestError, LLMTimeout

_RETRIED_STATUSES = frozenset({408, 409, 429})


def as_ratchet_error(e: BaseException) -> BaseException:
    """The Ratchet error for a model request's exception; any other exception is returned
    as it is (its retry class is then ``any``)."""
    if not isinstance(e, pai.ModelAPIError):
        return e
    provider = _provider_of(e)
    message = f"{type(e).__name__} from model {e.model_name}: {e.message}"
    if isinstance(e, pai.ModelTimeoutError | pai.ModelRequestTimeout):
        return LLMTimeout(message, provider=provider)
    status = e.status_code if isinstance(e, pai.ModelHTTPError) else None
    if status is not None:
        cls = LLMError if status in _RETRIED_STATUSES or status >= 500 else LLMRequestError
    elif isinstance(e, pai.ModelRequestRejectedError | pai.ModelQuotaExceededError):
        cls = LLMRequestError
    elif isinstance(e, pai.ModelConnectionError):  # sent or not: nobody answered
        return LLMError(message, provider=provider, outcome_unknown=True)
    else:  # rate limits, unavailable, server errors, uncategorised
        cls = LLMError
    return cls(message, provider=provider, status_code=status, retry_after_s=e.retry_after)


def _provider_of(e: BaseException) -> str | None:
    """The SDK that raised the error under Pydantic AI's (``openai``, ``anthropic``), if any."""
    cause = e.__cause__
    return type(cause).__module__.split(".")[0] if cause is not None else None
