"""``ffdl nodes``, ``queue`` and ``status`` read in an 80-column terminal, against a real
server on a host without GPUs: ids and numbers stay whole on their line, the
host's slots are called CPU slots, and every job on a node is shown holding it, CPU-only
jobs included."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.integration.live import FAST_CONFIG, LiveServer, ffdl_output, manifest_yaml, serving

SLEEP = 'python -c "import time; time.sleep(120)"'
ID = re.compile(r"training-[a-z0-9]{10}")


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, list[str]]]:
    # node-a: 4 CPU slots (gpu_type cpu). Four one-slot jobs fill it, a job without GPUs
    # runs on its CPUs, and one more one-slot job waits.
    home = tmp_path_factory.mktemp("eighty") / "home"
    with serving(LiveServer(home=home, config=dict(FAST_CONFIG))) as server:
        slot_job = manifest_yaml(SLEEP, gpus=1, memory="1908MiB")
        ids = [server.submit_ok(slot_job) for _ in range(4)]
        ids.append(server.submit_ok(manifest_yaml(SLEEP, gpus=0, name="cpu-only")))
        for job_id in ids:
            server.wait_status(job_id, {"PROCESSING"}, timeout=60)
        ids.append(server.submit_ok(slot_job))
        yield server, ids
        for job_id in ids:
            server.client.delete(f"/v1/models/{job_id}")


def _whole_ids(text: str) -> set[str]:
    return set(ID.findall(text))


def test_nodes_names_cpu_slots_and_shows_every_holder(busy: tuple[LiveServer, list[str]]) -> None:
    server, ids = busy
    shown = ffdl_output(server, "nodes", columns=80)
    assert max(len(line) for line in shown.splitlines()) <= 80
    assert "4/4 CPU slots" in shown and "GPUs" not in shown, shown
    assert re.search(r"\b\d+\.\d/32\.0 GiB\b", shown), shown
    holders = [line for line in shown.splitlines() if ID.search(line)]
    assert _whole_ids("\n".join(holders)) == set(ids[:5]), shown
    cpu_only = next(line for line in holders if ids[4] in line)
    assert "CPUs only" in cpu_only, cpu_only
    assert any(f"CPU slot {slot}" in shown for slot in range(4)), shown


def test_queue_keeps_ids_whole_and_says_cpu_slots(busy: tuple[LiveServer, list[str]]) -> None:
    server, ids = busy
    shown = ffdl_output(server, "queue", columns=80)
    assert max(len(line) for line in shown.splitlines()) <= 80
    assert _whole_ids(shown) == {ids[5]}, shown
    assert "needs 1 CPU slot" in " ".join(shown.split()), shown


def test_status_keeps_replica_ids_and_urls_whole(busy: tuple[LiveServer, list[str]]) -> None:
    server, _ids = busy
    shown = ffdl_output(server, "status", columns=80)
    replica = server.client.get("/v1/replicas").json()["replicas"][0]
    row = next(line for line in shown.splitlines() if line.lstrip().startswith(replica["id"]))
    assert server.url in row, shown
