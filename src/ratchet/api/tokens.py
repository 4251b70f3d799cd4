"""``/v1/tokens``: an admin's tokens of its own tenant, made, listed and revoked over the
API as ``ratchet tokens`` does from the database's side. A token of another tenant is
unknown here (404), as its runs are."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from ratchet.api.auth import scope
from ratchet.api.runs import ERRORS
from ratchet.api.schemas import NewToken, TokenCreated, TokenOut
from ratchet.errors import InvalidInput
from ratchet.store import Store, tokens
from ratchet.store.tokens import Token
from ratchet.web.errors import ApiError

router = APIRouter(prefix="/v1", tags=["tokens"], responses=ERRORS)
Admin = Annotated[Token, Depends(scope("admin"))]


def _out(t: Token) -> TokenOut:
    return TokenOut(
        id=t.token_id,
        tenant=t.tenant_id,
        scopes=list(t.scopes),
        name=t.name,
        created_at=t.created_at,
        revoked_at=t.revoked_at,
        expires_at=t.expires_at,
    )


@router.post("/tokens", response_model=TokenCreated, status_code=201)
async def create(body: NewToken, request: Request, token: Admin) -> TokenCreated:
    """A new token of the caller's tenant; its secret is in this answer only."""
    store: Store = request.app.state.store
    try:
        scopes = tokens.parse_scopes(",".join(body.scopes))
        made, secret = await tokens.create_token(
            store, token.tenant_id, scopes, body.name, body.expires_in
        )
    except InvalidInput as e:
        raise ApiError(422, str(e)) from e
    return TokenCreated(**_out(made).model_dump(), token=secret)


@router.get("/tokens", response_model=list[TokenOut])
async def list_(request: Request, token: Admin) -> list[TokenOut]:
    """The tenant's tokens, oldest first (never a secret)."""
    return [_out(t) for t in await tokens.list_tokens(request.app.state.store, token.tenant_id)]


@router.post("/tokens/{token_id}/revoke", response_model=TokenOut)
async def revoke(
    token_id: Annotated[str, Path(max_length=100)], request: Request, token: Admin
) -> TokenOut:
    """Revoke one of the tenant's tokens: refused 401 from now on, and its open event
    streams end."""
    return _out(await tokens.revoke_token(request.app.state.store, token_id, token.tenant_id))
