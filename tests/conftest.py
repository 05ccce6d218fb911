"""Fixtures shared by every test package: a real ffdl server on 127.0.0.1, and the test
session's PostgreSQL server."""

from __future__ import annotations

import os

# Set before any test imports Ray, which reads it once: without it Ray replaces 127.0.0.1
# with the host's primary address, and tests must never leave loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import postgres as pg
from tests.integration.live import LiveServer, serving


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path / "home")) as live:
        yield live


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.PostgresServer]:
    """One throwaway PostgreSQL server on 127.0.0.1 for the session (``tests/postgres.py``):
    ``postgres.create_database()`` gives a fresh database's URL."""
    yield pg.shared()
    pg.stop_shared()
