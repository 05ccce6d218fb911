"""Fixtures shared by every test package: a real ffdl server on 127.0.0.1 (one per test,
``server``, or one per module, ``shared_server``), and the test session's PostgreSQL
server."""

from __future__ import annotations

import os

# Set before any test imports Ray, which reads it once: without it Ray replaces 127.0.0.1
# with the host's primary address, and tests must never leave loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# A console made while COLUMNS is set keeps that width for good; the CLI's consoles are made
# on import, and a parallel run's workers inherit COLUMNS=80. Without it they read the width
# each time they print, so a test's own COLUMNS applies.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import postgres as pg
from tests.integration.live import LiveServer, serving

# The longest test files (minutes each), in the order a parallel run should start them:
# workers take whole files in collection order (`make test` keeps it), and one of these
# left for last would keep one worker busy long after the other has finished.
LONGEST_FIRST = (
    "ray_backend/test_ray_backend.py",
    "integration/test_elastic.py",
    "integration/test_log_delivery.py",
    "examples/test_elastic_example.py",
    "server/test_openapi_conformance.py",
    # Not beside the Ray module: two Ray clusters starting at once on two cores is slow.
    "integration/test_backends_alike.py",
    "replicas/test_database_faults.py",
    "replicas/test_replicas_live.py",
)

# Run before everything else of their run: timing-bound tests that a machine still busy with
# an earlier test (writing back a large database, say) throws off.
QUIET_FIRST = ("integration/test_sim_fidelity.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests_root = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        if not item.path.is_relative_to(tests_root):
            return len(LONGEST_FIRST)
        path = item.path.relative_to(tests_root).as_posix()
        if path in QUIET_FIRST:
            return -1
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    # A stable sort: each file's tests keep their order, and stay together.
    items.sort(key=rank)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path / "home")) as live:
        yield live


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server for a whole test module, for tests that look only at the jobs they submit
    and check a refused request against what the server held before it: a server start
    costs more CPU than most such tests do."""
    with serving(LiveServer(home=tmp_path_factory.mktemp("shared") / "home")) as live:
        yield live


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.PostgresServer]:
    """One throwaway PostgreSQL server on 127.0.0.1 for the session (``tests/postgres.py``):
    ``postgres.create_database()`` gives a fresh database's URL."""
    yield pg.shared()
    pg.stop_shared()
