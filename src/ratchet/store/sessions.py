"""Dashboard sessions: what a browser holds instead of an API token.

A browser's EventSource cannot send an Authorization header, so signing in trades an API
token for a session: a random secret set as an HttpOnly cookie. Only the secret's sha256
is stored, beside the token it stands for; a session ends when it expires, when its owner
signs out (the row is deleted) or when its token is revoked. The CSRF token that
state-changing requests carry is derived from the secret, so it needs no storage and a
page can hold it without holding the cookie's value (the derivation is one-way).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from ratchet.store.dialect import Dialect
from ratchet.store.tokens import Token, token_from_row, token_hash

SESSION_TTL_S = 12 * 3600.0


def csrf_token(secret: str) -> str:
    """The CSRF token of the session whose cookie holds ``secret``."""
    return hashlib.sha256(f"ratchet-csrf|{secret}".encode()).hexdigest()


def csrf_matches(secret: str, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(csrf_token(secret), sent)


async def open_session(store: Dialect, token: Token, ttl_s: float = SESSION_TTL_S) -> str:
    """A new session for ``token``; returns its secret (the cookie's value)."""
    secret = secrets.token_urlsafe(32)
    params = {"session_hash": token_hash(secret), "token_id": token.token_id, "ttl_s": ttl_s}

    def body(tx: Any) -> None:
        tx.send("ui_sessions_expire", {})
        tx.send("ui_session_insert", params)

    await store._run(body)
    return secret


async def session_token(store: Dialect, secret: str) -> Token | None:
    """The live token of the live session ``secret`` opened, or None."""
    row = await store._read(
        lambda tx: tx.one("ui_session_token", {"session_hash": token_hash(secret)})
    )
    return token_from_row(row) if row is not None else None


async def close_session(store: Dialect, secret: str) -> None:
    await store._run(lambda tx: tx.send("ui_session_delete", {"session_hash": token_hash(secret)}))
