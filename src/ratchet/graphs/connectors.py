"""Connector nodes: an HTTP request, or a webhook or email delivery behind a receipt.

``http`` is a request (httpx) whose answer is the step's output; it is retried under the
node's policy (class ``connector``: a transport error, a 429 or a 5xx). ``webhook`` and
``email`` are deliveries (:func:`ratchet.deliver`): the ``side_effect_receipts`` row is
claimed before anything is sent, a settled receipt is returned on any later attempt or
drive without sending again, and the request carries ``Idempotency-Key`` (the email, a
header of that name and a Message-ID made from it) so a receiver can drop a re-send.
Email goes over SMTP to ``RATCHET_SMTP_URL`` (``smtp://host:port``, default
``smtp://127.0.0.1:25``).
"""

from __future__ import annotations

import asyncio
import email.policy
import os
import smtplib
from email.message import EmailMessage
from typing import Any
from urllib.parse import urlsplit

import httpx

from ratchet.effects.deliver import deliver
from ratchet.errors import ConnectorError, RatchetError, RetryClass


class RequestRefused(RatchetError):
    """The receiver answered 4xx (other than 429): sending again will not help."""

    retry_class = RetryClass.NEVER


async def send(request: dict[str, Any]) -> Any:
    """The connector step's code."""
    kind = request["kind"]
    if kind == "http":
        return await _http(request, None)
    if kind == "webhook":
        return await deliver(lambda key: _http(request, key), policy=request["policy"])
    return await deliver(
        lambda key: asyncio.to_thread(_email, request, key), policy=request["policy"]
    )


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


async def _http(request: dict[str, Any], key: str | None) -> dict[str, Any]:
    headers = dict(request.get("headers") or {})
    if key is not None:
        headers["Idempotency-Key"] = key
    body = request.get("body")
    try:
        async with httpx.AsyncClient() as client:
            response = await client.request(
                request.get("method") or "POST",
                request["url"],
                headers=headers,
                json=body if body is not None and request.get("method") != "GET" else None,
            )
    except httpx.HTTPError as e:
        raise ConnectorError(
            f"{request.get('method')} {request['url']}: {type(e).__name__}: {e}"
        ) from e
    if response.status_code == 429 or response.status_code >= 500:
        raise ConnectorError(
            f"{request.get('method')} {request['url']} answered "
            f"{response.status_code}: {response.text[:200]}"
        )
    if response.status_code >= 400:
        raise RequestRefused(
            f"{request.get('method')} {request['url']} answered "
            f"{response.status_code}: {response.text[:200]}"
        )
    return {"status": response.status_code, "body": _body(response)}


def _email(request: dict[str, Any], key: str) -> dict[str, Any]:
    url = urlsplit(os.environ.get("RATCHET_SMTP_URL") or "smtp://127.0.0.1:25")
    # A header is folded past 78 characters, and a 64-character key would be: a receiver
    # that dedupes on the header's raw text must see the key whole (RFC 5322 allows 998).
    message = EmailMessage(policy=email.policy.SMTP.clone(max_line_length=998))
    message["From"] = request.get("sender") or "ratchet@localhost"
    message["To"] = request["to"]
    message["Subject"] = request.get("subject") or ""
    message["Idempotency-Key"] = key
    message["Message-ID"] = f"<{key}@ratchet>"
    body = request.get("body")
    message.set_content(body if isinstance(body, str) else str(body or ""))
    try:
        with smtplib.SMTP(url.hostname or "127.0.0.1", url.port or 25, timeout=30) as smtp:
            smtp.send_message(message)
    except (OSError, smtplib.SMTPException) as e:
        raise ConnectorError(f"email to {request['to']}: {type(e).__name__}: {e}") from e
    return {"to": request["to"], "message_id": message["Message-ID"]}
