"""``ffdl user list|password``: users, and their passwords for HTTP Basic (FfDL's clients).

Passwords are never taken from the command line (they would land in shell history and
process listings): they come from a hidden prompt, or with ``--password-stdin`` from
standard input.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ffdl.cli.context import client_of
from ffdl.client.http import ApiError
from ffdl.core.errors import BadRequest

console = Console(highlight=False)
user_app = typer.Typer(
    help="Users, and their passwords for HTTP Basic sign-in.", no_args_is_help=True
)


@user_app.command("list")
def user_list(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's users.")] = None,
) -> None:
    """List users (admins: their tenant's): id, role, whether they have a password."""
    with client_of(ctx) as client:
        users = client.users(tenant).get("users") or []
    table = Table(title="Users")
    for column in ("user", "tenant", "role", "password", "created (UTC)"):
        table.add_column(column)
    for user in users:
        table.add_row(
            str(user.get("user", "")),
            str(user.get("tenant", "")),
            str(user.get("role", "")),
            "yes" if user.get("has_password") else "-",
            str(user.get("created") or "-")[:16].replace("T", " "),
        )
    console.print(table)


def _needs_current(error: ApiError) -> bool:
    detail = error.detail
    return (
        error.status == 400
        and isinstance(detail, dict)
        and (detail.get("field") == "current_password")
    )


def _stdin_lines() -> tuple[str, str | None]:
    lines = sys.stdin.read().splitlines()
    if not lines or not lines[0]:
        raise BadRequest("--password-stdin: standard input holds no password")
    current = lines[1] if len(lines) > 1 and lines[1] else None
    return lines[0], current


@user_app.command("password")
def user_password(
    ctx: typer.Context,
    user: Annotated[
        str, typer.Argument(help="User id (tenant.name; a default-tenant user's bare name).")
    ],
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="Read the new password from the first line of standard input (and your "
            "current one, when changing your own, from the second).",
        ),
    ] = False,
    remove: Annotated[
        bool, typer.Option("--remove", help="Remove the password: Basic sign-in is refused.")
    ] = False,
) -> None:
    """Set a user's password (admins), or change your own (asks for the current one)."""
    with client_of(ctx) as client:
        if remove:
            client.remove_password(user)
            typer.echo(f"Removed the password of {user}")
            return
        if password_stdin:
            password, current = _stdin_lines()
        else:
            password = typer.prompt(
                f"New password for {user}", hide_input=True, confirmation_prompt=True
            )
            current = None
        try:
            result = client.set_password(user, password, current_password=current)
        except ApiError as error:
            if password_stdin or not _needs_current(error):
                raise
            current = typer.prompt("Your current password", hide_input=True)
            result = client.set_password(user, password, current_password=current)
    typer.echo(f"Password set for {result.get('user', user)}")
