"""Bearer tokens: who is asking (the token's tenant) and what they may do (its scopes).
``admin`` includes the other scopes. The token itself is never logged."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ratchet.api.errors import ApiError
from ratchet.store import tokens
from ratchet.store.tokens import Token

_bearer = HTTPBearer(auto_error=False, description="A token from `ratchet tokens create`.")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]


def scope(needed: str) -> Callable[..., Awaitable[Token]]:
    """A dependency: the caller's token, which must carry ``needed`` (or admin)."""

    async def check(request: Request, creds: Bearer) -> Token:
        if creds is None:
            raise ApiError(401, "missing bearer token: send Authorization: Bearer <token>",
                           headers=_CHALLENGE)
        token = await tokens.authenticate(request.app.state.store, creds.credentials)
        if token is None:
            raise ApiError(401, "invalid or revoked token", headers=_CHALLENGE)
        if needed not in token.scopes and "admin" not in token.scopes:
            raise ApiError(403, f"this token lacks the {needed} scope",
                           details={"needed": needed, "scopes": list(token.scopes)})
        return token

    check.__name__ = f"scope_{needed.replace(':', '_')}"
    return check
