"""What every CLI command shares: how to build a client, and the global options given.

Tests pass their own ``CliContext(client_factory=...)`` as the Typer context object to run
commands against a fake transport.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import typer

from ffdl.client.config import ClientConfig, client_for, resolve_client_config
from ffdl.client.http import ApiError, Client

ClientFactory = Callable[[ClientConfig], Client]
# While the platform answers 503, say so on stderr at most this often.
UNAVAILABLE_NOTICE_EVERY_S = 30.0


class UnavailableNotice:
    """Tells the user, now and then, that the CLI is waiting out an unavailable platform."""

    def __init__(self) -> None:
        self._last = -UNAVAILABLE_NOTICE_EVERY_S

    def __call__(self, error: ApiError, delay: float) -> None:
        now = time.monotonic()
        if now - self._last < UNAVAILABLE_NOTICE_EVERY_S:
            return
        self._last = now
        typer.echo(f"{error.message}; waiting and retrying (next try in {delay:g} s)", err=True)


def default_client_factory(config: ClientConfig) -> Client:
    return client_for(config, on_unavailable=UnavailableNotice())


@dataclass
class CliContext:
    client_factory: ClientFactory = default_client_factory
    url: str | None = None
    token: str | None = None

    def client(self) -> Client:
        return self.client_factory(resolve_client_config(self.url, self.token))


def state_of(ctx: typer.Context) -> CliContext:
    return ctx.ensure_object(CliContext)


def client_of(ctx: typer.Context) -> Client:
    return state_of(ctx).client()
