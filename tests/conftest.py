"""Fixtures shared by every test package: a real ffdl server on 127.0.0.1."""

from __future__ import annotations

import os

# Set before any test imports Ray, which reads it once: without it Ray replaces 127.0.0.1
# with the host's primary address, and tests must never leave loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.live import LiveServer, serving


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path / "home")) as live:
        yield live
