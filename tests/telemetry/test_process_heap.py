"""A serving process freezes what start-up made, so that garbage collections stop walking
it: the one-process server, and each worker of an API pool (which builds its app after the
fork)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.live import FAST_CONFIG, LiveServer, serving
from tests.pool.load import PoolServer


def frozen_objects(server: LiveServer) -> float:
    page = server.client.get("/metrics").text
    return next(
        sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == "ffdl_process_frozen_objects"
    )


def test_a_replica_freezes_its_start_up_objects(tmp_path: Path) -> None:
    server = LiveServer(home=tmp_path / "home", config=dict(FAST_CONFIG))
    with serving(server):
        # The modules and the app: well over 50,000 objects in any build of the server.
        frozen = frozen_objects(server)
        assert frozen > 50_000, frozen


def test_a_pool_worker_freezes_its_start_up_objects(tmp_path: Path) -> None:
    server = PoolServer(home=tmp_path / "home", config=dict(FAST_CONFIG))
    server.workers = "1..1"
    with serving(server):
        frozen = frozen_objects(server)
        assert frozen > 50_000, frozen
