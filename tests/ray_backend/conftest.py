"""The Ray backend's tests share one real multi-node Ray cluster (``cluster.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.live import free_port

pytest.importorskip("ray", reason="the Ray backend's tests need Ray: pip install 'ffdl[ray]'")

from tests.ray_backend.cluster import RayTestCluster


@pytest.fixture(scope="module")
def ray_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def ray_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray")


@pytest.fixture(scope="module")
def ray_cluster(ray_port: int, ray_root: Path) -> Iterator[RayTestCluster]:
    cluster = RayTestCluster(port=ray_port, root=ray_root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.shutdown()
