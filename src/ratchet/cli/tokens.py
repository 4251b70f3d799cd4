"""``ratchet tokens create|list|revoke``: the bearer tokens of ``ratchet server``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ratchet.cli._common import DbOption, JsonOption, ReadableGroup, client, make_console
from ratchet.cli._format import echo_json, when
from ratchet.config import parse_age
from ratchet.store import tokens as store_tokens

tokens_cli = typer.Typer(
    cls=ReadableGroup,
    help="API tokens for ratchet server: create, list, revoke.",
    no_args_is_help=True,
)


@tokens_cli.command("create")
def create(
    ctx: typer.Context,
    tenant: Annotated[
        str, typer.Option("--tenant", metavar="TENANT", help="The tenant the token acts for.")
    ],
    scopes: Annotated[
        str,
        typer.Option(
            "--scopes", metavar="SCOPES", help="Comma-separated: runs:read, runs:write, admin."
        ),
    ] = "runs:read",
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            metavar="NAME",
            help="Who the token is, e.g. ana or ci: the decisions made with it "
            "(approvals, a gate turned off) are journaled under this name.",
        ),
    ] = None,
    expires: Annotated[
        str | None,
        typer.Option(
            "--expires",
            metavar="AGE",
            help="Refuse the token after AGE (30d, 12h, 15m); an open event stream bearing it "
            "ends then. Never, unless set.",
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Create a token. It is printed once, alone on the last line; only its hash is kept."""
    with client(ctx, db) as app:
        parsed = store_tokens.parse_scopes(scopes)
        store_tokens.check_tenant(tenant)
        store_tokens.check_token_name(name)
        expires_in = parse_age(expires) if expires is not None else None
        token, secret = app.portal.call(
            store_tokens.create_token(app.store, tenant, parsed, name, expires_in)
        )
    until = f", expires {when(token.expires_at)}" if token.expires_at is not None else ""
    typer.echo(
        f"token {token.token_id} for tenant {token.tenant_id} "
        f"(scopes {','.join(token.scopes)}{until}); it is shown once:"
    )
    typer.echo(secret)


@tokens_cli.command("list")
def list_(ctx: typer.Context, as_json: JsonOption = False, db: DbOption = None) -> None:
    """Every token: id, tenant, scopes, name, created, revoked, expires (never the
    secret)."""
    with client(ctx, db, read_only=True) as app:
        found = app.portal.call(store_tokens.list_tokens(app.store))
    if as_json:
        echo_json([t.as_dict() for t in found])
        return
    console = make_console()
    if not found:
        console.print("no tokens; create one with ratchet tokens create --tenant NAME")
        return
    table = Table("id", "tenant", "scopes", "name", "created", "revoked", "expires")
    for t in found:
        table.add_row(
            Text(t.token_id),
            Text(t.tenant_id),
            Text(",".join(t.scopes)),
            Text(t.name or "-"),
            when(t.created_at),
            when(t.revoked_at),
            when(t.expires_at),
        )
    console.print(table)


@tokens_cli.command("revoke")
def revoke(
    ctx: typer.Context,
    token_id: Annotated[str, typer.Argument(metavar="ID", help="A token id (tok_...).")],
    db: DbOption = None,
) -> None:
    """Revoke a token: requests bearing it are refused (401) from now on."""
    with client(ctx, db) as app:
        token = app.portal.call(store_tokens.revoke_token(app.store, token_id))
    typer.echo(f"token {token.token_id} (tenant {token.tenant_id}) is revoked")
