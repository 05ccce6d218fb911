"""A replica freezes what start-up made, so that garbage collections stop walking it."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.live import FAST_CONFIG, LiveServer, serving


def test_a_replica_freezes_its_start_up_objects(tmp_path: Path) -> None:
    server = LiveServer(home=tmp_path / "home", config=dict(FAST_CONFIG))
    with serving(server):
        page = server.client.get("/metrics").text
        frozen = next(
            sample.value
            for family in text_string_to_metric_families(page)
            for sample in family.samples
            if sample.name == "ffdl_process_frozen_objects"
        )
        # The modules and the app: well over 50,000 objects in any build of the server.
        assert frozen > 50_000, frozen
