"""Fixtures shared by every test package: a real ffdl server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.live import LiveServer, serving


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path / "home")) as live:
        yield live
