"""Bearer tokens: who is asking (the token's tenant) and what they may do (its scopes).
``admin`` includes the other scopes. The token itself is never logged.

A browser signed in to the dashboard sends its session cookie instead (EventSource cannot
send headers); the session stands for the token it was opened with. A cookie is sent by
the browser whoever made the page ask, so a state-changing request on a session must
also carry the session's CSRF token in ``X-CSRF-Token``, which only the dashboard's own
pages know."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ratchet.store import sessions, tokens
from ratchet.store.tokens import Token
from ratchet.web.errors import ApiError

_bearer = HTTPBearer(auto_error=False, description="A token from `ratchet tokens create`.")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
SESSION_COOKIE = "ratchet_session"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def _caller(request: Request, creds: HTTPAuthorizationCredentials | None) -> Token:
    token = await _token(request, creds)
    # The error handler speaks the caller's run ids (see ratchet.store.tenants).
    request.state.tenant = token.tenant_id
    return token


async def _token(request: Request, creds: HTTPAuthorizationCredentials | None) -> Token:
    store = request.app.state.store
    if creds is not None:
        token = await tokens.authenticate(store, creds.credentials)
        if token is None:
            raise ApiError(401, "invalid, revoked or expired token", headers=_CHALLENGE)
        return token
    secret = request.cookies.get(SESSION_COOKIE)
    if secret is None:
        raise ApiError(
            401, "missing bearer token: send Authorization: Bearer <token>", headers=_CHALLENGE
        )
    token = await sessions.session_token(store, secret)
    if token is None:
        raise ApiError(
            401, "the session has expired or was signed out: sign in again", headers=_CHALLENGE
        )
    if request.method not in SAFE_METHODS and not sessions.csrf_matches(
        secret, request.headers.get(CSRF_HEADER)
    ):
        raise ApiError(
            403,
            f"missing or wrong CSRF token: a request on a session must send "
            f"the page's token in {CSRF_HEADER}",
        )
    return token


def scope(needed: str) -> Callable[..., Awaitable[Token]]:
    """A dependency: the caller's token, which must carry ``needed`` (or admin)."""

    async def check(request: Request, creds: Bearer) -> Token:
        token = await _caller(request, creds)
        if not allows(token, needed):
            raise ApiError(
                403,
                f"this token lacks the {needed} scope",
                details={"needed": needed, "scopes": list(token.scopes)},
            )
        return token

    check.__name__ = f"scope_{needed.replace(':', '_')}"
    return check


def allows(token: Token, needed: str) -> bool:
    """Whether ``token`` carries ``needed`` (or admin)."""
    return needed in token.scopes or "admin" in token.scopes


def decider(token: Token) -> str:
    """Who a decision made with ``token`` is journaled as: the token's name
    (``ratchet tokens create --name ana``), else its id. Every decision the API records
    (approvals, a confidence gate turned off at start, going over a budget) names this,
    never a name from the request's body, which is kept only as a note."""
    return token.name or token.token_id
