"""What every CLI command shares: how to build a client, and the global options given.

Tests pass their own ``CliContext(client_factory=...)`` as the Typer context object to run
commands against a fake transport.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import typer

from ffdl.client.config import ClientConfig, client_for, resolve_client_config
from ffdl.client.http import Client

ClientFactory = Callable[[ClientConfig], Client]


def default_client_factory(config: ClientConfig) -> Client:
    return client_for(config)


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
