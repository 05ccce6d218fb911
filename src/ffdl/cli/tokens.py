"""``ffdl token list|create|revoke`` and ``ffdl audit``: API tokens and the audit log."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ffdl.cli.context import client_of

console = Console(highlight=False)
token_app = typer.Typer(
    help="API tokens: your own, and (admins) those of your users.", no_args_is_help=True
)


def _when(value: Any) -> str:
    """An ISO time to the minute, in UTC as the server gives it; '-' for none."""
    if not value:
        return "-"
    return str(value)[:16].replace("T", " ")


@token_app.command("list")
def token_list(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option(help="Only this user's tokens (admins).")] = None,
) -> None:
    """List tokens: id, user, name, created, expires, last used (never the secret)."""
    with client_of(ctx) as client:
        body = client.tokens(user=user)
    tokens = body.get("tokens") or []
    if not tokens:
        console.print("No tokens.")
        return
    table = Table(title="Tokens (UTC)")
    for column in ("id", "user", "name", "created", "expires", "last used"):
        table.add_column(column)
    for token in tokens:
        token_id = str(token.get("id") or "-") + (" (this one)" if token.get("current") else "")
        expires = _when(token.get("expires")) + (" (expired)" if token.get("expired") else "")
        table.add_row(
            token_id,
            str(token.get("user", "")),
            str(token.get("name") or ""),
            _when(token.get("created")),
            expires,
            _when(token.get("last_used")),
        )
    console.print(table)


@token_app.command("create")
def token_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Option(help="What the token is for (up to 200 characters).")] = "",
    days: Annotated[
        float | None,
        typer.Option(min=0, help="Lifetime in days (default and maximum: the platform's)."),
    ] = None,
) -> None:
    """Create a token for yourself and print it (shown only this once)."""
    with client_of(ctx) as client:
        created = client.create_token(name=name, ttl_days=days)
    typer.echo(f"Created token {created.get('id')} (expires {_when(created.get('expires'))} UTC)")
    typer.echo(f"Token: {created['token']}")


@token_app.command("revoke")
def token_revoke(
    ctx: typer.Context,
    token_id: Annotated[
        str, typer.Argument(metavar="ID", help="Token id (see `ffdl token list`).")
    ],
) -> None:
    """Revoke a token: the next request with it is refused."""
    with client_of(ctx) as client:
        revoked = client.revoke_token(token_id)
    typer.echo(f"Revoked token {token_id} of {revoked.get('user', '?')}")


def audit_command(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Events to show.")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="Newest events to skip.")] = 0,
    action: Annotated[str | None, typer.Option(help="Only this action, e.g. token.revoke.")] = None,
) -> None:
    """Show the audit log of administrative actions, newest first (admins only)."""
    with client_of(ctx) as client:
        body = client.audit(pagesize=limit, offset=offset, action=action)
    events = body.get("events") or []
    if not events:
        console.print("No audit events.")
        return
    table = Table(title=f"Audit log ({len(events)} of {body.get('total', len(events))}, UTC)")
    for column in ("time", "actor", "action", "target", "detail"):
        table.add_column(column)
    for event in events:
        table.add_row(
            _when(event.get("time")),
            str(event.get("actor", "")),
            str(event.get("action", "")),
            str(event.get("target", "")),
            str(event.get("detail") or ""),
        )
    console.print(table)
