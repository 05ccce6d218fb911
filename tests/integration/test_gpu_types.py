"""Two GPU types declared on one cluster, with real learner processes: a job runs only on the
types it accepts, a gang on one type unless it allows more, and a type the cluster does not
have is refused at submit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for

TWO_TYPES = [
    {"name": "node-h100", "gpus": 2, "cpus": 8, "memory": "16GiB", "gpu_type": "h100"},
    {"name": "node-a100", "gpus": 2, "cpus": 8, "memory": "16GiB", "gpu_type": "a100"},
]
# Runs until told to stop (or for a minute at most).
HOLD = "python -c 'import time; from ffdl.sdk.api import should_stop\n" + (
    "for _ in range(600):\n    time.sleep(0.1)\n    if should_stop(): break'"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = Path(tmp_path_factory.mktemp("gpu-types")) / "home"
    with serving(LiveServer(home=home, config={**FAST_CONFIG, "nodes": TWO_TYPES})) as live:
        yield live


def _nodes_of(live: LiveServer, job_id: str) -> set[str]:
    model = live.wait_status(job_id, {"PROCESSING"}, timeout=60)
    return {str(p["node"]) for p in model["placement"]}


def _done(live: LiveServer, *job_ids: str) -> None:
    for job_id in job_ids:
        cancelled = live.client.patch(f"/v1/models/{job_id}", json={"status": "cancel"})
        assert cancelled.status_code == 202, cancelled.text
    for job_id in job_ids:
        live.wait_status(job_id, {"CANCELLED"}, timeout=60)


def test_a_job_restricted_to_one_type_waits_for_it_while_the_other_is_free(
    cluster: LiveServer,
) -> None:
    holder = cluster.submit_ok(manifest_yaml("true && " + HOLD, gpus=2, gpu_types=["a100"]))
    assert _nodes_of(cluster, holder) == {"node-a100"}
    waiter = cluster.submit_ok(manifest_yaml("true && " + HOLD, gpus=1, gpu_types=["a100"]))

    def queued_for_its_type() -> dict[str, Any] | None:
        model = cluster.model(waiter)
        reason = (model.get("queue") or {}).get("reason") or ""
        return model if "a100" in reason else None

    model = wait_for(queued_for_its_type, timeout=30, interval=0.1, what="a reason naming a100")
    assert model["training"]["training_status"]["status"] == "QUEUED"
    # The H100 node was free the whole time; the job starts once the A100s are.
    _done(cluster, holder)
    assert _nodes_of(cluster, waiter) == {"node-a100"}
    _done(cluster, waiter)


def test_a_gang_takes_one_type_unless_it_may_mix(cluster: LiveServer) -> None:
    refused = cluster.submit(manifest_yaml("true", learners=2, gpus=2))
    assert refused.status_code == 400, refused.text
    assert refused.json()["ffdl_code"] == "S100"
    assert refused.json()["description"] == (
        "job can never be scheduled on this cluster: needs 4 GPUs in total but the a100 nodes "
        "have 2, and a gang runs on GPUs of one type (mix_gpu_types allows more)"
    )
    mixed = cluster.submit_ok(
        manifest_yaml("true && " + HOLD, learners=2, gpus=2, mix_gpu_types=True)
    )
    assert _nodes_of(cluster, mixed) == {"node-h100", "node-a100"}
    _done(cluster, mixed)


def test_a_type_the_cluster_lacks_is_refused_naming_those_it_has(cluster: LiveServer) -> None:
    before = cluster.client.get("/v1/models").json()
    response = cluster.submit(manifest_yaml("true", gpu_types=["h100", "v100"]))
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["ffdl_code"] == "C104"
    assert body["description"] == (
        "invalid manifest: gpu_types: no node has GPU type v100 (the cluster's: a100, h100)"
    )
    assert cluster.client.get("/v1/models").json() == before
