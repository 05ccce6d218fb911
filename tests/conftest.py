"""Fixtures shared by every test package: a real ffdl server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.live import LiveServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(home=tmp_path / "home")
    live.start()
    try:
        yield live
    finally:
        live.stop()
        live.kill_learners()
