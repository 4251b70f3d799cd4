"""API tokens and tenant-scoped reads: what ``ratchet server`` asks of the store.

A token is a random secret handed out once; only its sha256 is stored, so the database
cannot give a token back, and a leaked table cannot be replayed against the API. A token
carries a tenant, its scopes and optionally an expiry (past it, the token is refused as a
revoked one is); revoking one stamps ``revoked_at`` and keeps the row, so ``ratchet tokens
list`` says what existed. Every read here is confined to one tenant: a
token never sees another tenant's runs, not even to learn that they exist.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratchet.errors import InvalidInput, UnknownToken
from ratchet.model import DeadLetter, RunRecord
from ratchet.names import MAX_TENANT
from ratchet.store.dialect import Dialect
from ratchet.store.rows import record_from_row
from ratchet.store.runs import tags_param

SCOPES = ("runs:read", "runs:write", "admin")
TOKEN_PREFIX = "rt_"
_TENANT = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_TENANT - 1}}}")
MAX_TOKEN_NAME = 100
_NAME = re.compile(rf"[A-Za-z0-9][^\x00-\x1f\x7f]{{0,{MAX_TOKEN_NAME - 1}}}")
MAX_EXPIRES_IN = 10 * 366 * 86400.0


@dataclass(frozen=True, slots=True)
class Token:
    """A row of ``api_tokens``, without the hash."""

    token_id: str
    tenant_id: str
    scopes: tuple[str, ...]
    name: str | None
    created_at: float
    revoked_at: float | None
    expires_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.token_id,
            "tenant": self.tenant_id,
            "scopes": list(self.scopes),
            "name": self.name,
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
            "expires_at": self.expires_at,
        }


def token_from_row(row: Any) -> Token:
    return Token(
        row["token_id"],
        row["tenant_id"],
        tuple(row["scopes"].split(",")),
        row["name"],
        float(row["created_at"]),
        None if row["revoked_at"] is None else float(row["revoked_at"]),
        None if row["expires_at"] is None else float(row["expires_at"]),
    )


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_scopes(text: str) -> tuple[str, ...]:
    """``runs:read,runs:write`` → the scopes, each checked; refused with the valid ones."""
    scopes = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [s for s in scopes if s not in SCOPES]
    if not scopes or bad:
        raise InvalidInput(
            f"invalid scopes {text!r}: expected a comma-separated list of {', '.join(SCOPES)}"
        )
    return scopes


def check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise InvalidInput(
            f"invalid tenant {tenant!r}: use 1-64 letters, digits and . _ -, "
            "starting with a letter or digit"
        )
    return tenant


def check_token_name(name: str | None) -> str | None:
    """A token's name (what its decisions are journaled as), checked; None is no name."""
    if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
        raise InvalidInput(
            f"invalid token name {name!r}: use 1-{MAX_TOKEN_NAME} printable "
            "characters, starting with a letter or digit"
        )
    return name


def check_expires_in(seconds: Any) -> float | None:
    """A token's lifetime in seconds, checked: positive, finite, at most ten years."""
    if seconds is None:
        return None
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not 0 < seconds <= MAX_EXPIRES_IN
    ):
        raise InvalidInput(
            f"invalid expiry {seconds!r}: expected a number of seconds from 1 "
            f"to {MAX_EXPIRES_IN:.0f} (ten years)"
        )
    return float(seconds)


async def create_token(
    store: Dialect,
    tenant: str,
    scopes: Sequence[str],
    name: str | None = None,
    expires_in: float | None = None,
) -> tuple[Token, str]:
    """A new token for ``tenant``: its row and the secret, which is not stored. With
    ``expires_in`` (seconds), it is refused from then on, as a revoked one is."""
    check_tenant(tenant)
    check_token_name(name)
    expires_in = check_expires_in(expires_in)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = "tok_" + secrets.token_hex(6)
    params = {
        "token_id": token_id,
        "token_hash": token_hash(secret),
        "tenant_id": tenant,
        "scopes": ",".join(scopes),
        "name": name,
        "expires_in": expires_in,
    }

    def body(tx: Any) -> Token:
        tx.send("token_insert", params)
        return token_from_row(tx.one("token_get", {"token_id": token_id}))

    return await store._run(body), secret


async def authenticate(store: Dialect, secret: str) -> Token | None:
    """The live token whose secret this is, or None."""
    row = await store._read(lambda tx: tx.one("token_by_hash", {"token_hash": token_hash(secret)}))
    return token_from_row(row) if row is not None else None


async def list_tokens(store: Dialect, tenant: str | None = None) -> list[Token]:
    """Every token, or ``tenant``'s."""
    if tenant is None:
        rows = await store._read(lambda tx: tx.all("tokens_list", {}))
    else:
        rows = await store._read(lambda tx: tx.all("tokens_of_tenant", {"tenant_id": tenant}))
    return [token_from_row(r) for r in rows]


async def revoke_token(store: Dialect, token_id: str, tenant: str | None = None) -> Token:
    """Revoke a token (of ``tenant``, when given: another tenant's is unknown); refused
    for an unknown id (a revoked one stays revoked, once)."""

    def body(tx: Any) -> Token:
        row = tx.one("token_get", {"token_id": token_id})
        if row is None or (tenant is not None and row["tenant_id"] != tenant):
            raise UnknownToken(f"unknown token id {token_id!r}; see ratchet tokens list")
        tx.run("token_revoke", {"token_id": token_id})
        return token_from_row(tx.one("token_get", {"token_id": token_id}))

    return await store._run(body)


async def ended_tokens(store: Dialect, token_ids: Sequence[str]) -> tuple[set[str], float | None]:
    """Of ``token_ids``: those revoked, expired or gone by now, and the earliest expiry
    among the others (None: none expires)."""
    ids = store._ids(list(token_ids))
    rows = await store._read(lambda tx: tx.all("tokens_ended", {"ids": ids}))
    live = {r["token_id"]: r["expires_at"] for r in rows if not r["ended"]}
    expiries = [float(at) for at in live.values() if at is not None]
    return set(token_ids) - set(live), min(expiries, default=None)


async def runs_page(
    store: Dialect,
    tenant: str,
    *,
    status: str | None = None,
    workflow: str | None = None,
    parent: str | None = None,
    text: str | None = None,
    tags: Mapping[str, str] | None = None,
    created_after: float | None = None,
    created_before: float | None = None,
    cursor: tuple[float, str] | None = None,
    limit: int = 50,
) -> list[RunRecord]:
    """A tenant's runs, newest first, after ``cursor`` (the last one's created_at, run_id);
    ``text``: only those whose run id contains it; ``tags``: only those with all of them."""

    params = {
        "tenant_id": tenant,
        "status": status,
        "workflow": workflow,
        "parent": parent,
        "text": text,
        "created_after": created_after,
        "created_before": created_before,
        "cursor_at": cursor[0] if cursor else None,
        "cursor_id": cursor[1] if cursor else None,
        "limit": limit,
    }
    if tags:
        # Tagged runs are found along an index first (see runs_filter_tagged).
        params["tags"] = tags_param(tags)
        rows = await store._read(lambda tx: tx.all("runs_page_tagged", params))
    else:
        rows = await store._read(lambda tx: tx.all("runs_page", params))
    return [record_from_row(r) for r in rows]


async def dead_letters(store: Dialect, tenant: str, limit: int = 100) -> list[DeadLetter]:
    rows = await store._read(
        lambda tx: tx.all("dead_letters_of_tenant", {"tenant_id": tenant, "limit": limit})
    )
    return [
        DeadLetter(r["run_id"], r["workflow"], r["reason"], r["error"], float(r["at"]))
        for r in rows
    ]
