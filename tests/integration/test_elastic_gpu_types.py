"""Elastic jobs on a cluster of two GPU types, with real learner processes: the autoscaler
moves a job to the faster type when it frees up, ``ffdl scale --gpu-type`` pins a job to a
type (and ``any`` lifts the pin), and a type the job refuses is a 400 naming those it
accepts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.live import LiveServer, manifest_yaml, serving, wait_for
from tests.integration.test_cli import ffdl
from tests.integration.test_elastic import ELASTIC_STEPS, _reported_steps, elastic_config
from tests.integration.test_gpu_types import HOLD, TWO_TYPES


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    config = {
        **elastic_config(min_rescale_interval_s=1.0),
        "nodes": TWO_TYPES,
        "gpu_speeds": {"h100": 4.0, "a100": 1.0},
    }
    home = Path(tmp_path_factory.mktemp("elastic-gpu-types")) / "home"
    with serving(LiveServer(home=home, config=config)) as live:
        yield live


def _elastic(total_steps: int, **extra: Any) -> tuple[str, dict[str, str]]:
    manifest = manifest_yaml(
        "python steps.py",
        elastic={"gpus": {"min": 1, "max": 2}, "batch_size": {"min": 64, "max": 128}},
        **extra,
    )
    return manifest, {"steps.py": ELASTIC_STEPS.replace("TOTAL", str(total_steps))}


def _running_on(live: LiveServer, job_id: str, node: str, timeout: float = 60) -> dict[str, Any]:
    def there() -> dict[str, Any] | None:
        model = live.model(job_id)
        status = model["training"]["training_status"]["status"]
        assert status not in {"FAILED", "CANCELLED", "COMPLETED"}, model["training"]
        nodes = {str(p["node"]) for p in model["placement"]}
        return model if status == "PROCESSING" and nodes == {node} else None

    found: dict[str, Any] = wait_for(
        there, timeout=timeout, interval=0.1, what=f"{job_id} on {node}"
    )
    return found


def _cancel(live: LiveServer, *job_ids: str) -> None:
    for job_id in job_ids:
        live.client.patch(f"/v1/models/{job_id}", json={"status": "cancel"})
    for job_id in job_ids:
        live.wait_status(job_id, {"CANCELLED", "COMPLETED"}, timeout=60)


def test_an_elastic_job_moves_to_the_faster_type_when_it_frees_up(cluster: LiveServer) -> None:
    holder = cluster.submit_ok(manifest_yaml("true && " + HOLD, gpus=2, gpu_types=["h100"]))
    _running_on(cluster, holder, "node-h100")
    manifest, files = _elastic(2000)
    job_id = cluster.submit_ok(manifest, files)
    _running_on(cluster, job_id, "node-a100")
    wait_for(lambda: _reported_steps(cluster, job_id) >= 5, what="steps on the A100s")

    _cancel(cluster, holder)
    model = _running_on(cluster, job_id, "node-h100")
    moves = [e["reason"] for e in model["events"] if e["to"] == "RESCALING"]
    assert any(reason.startswith("move a100→h100 GPUs") for reason in moves), moves
    resumed_at = _reported_steps(cluster, job_id)
    wait_for(lambda: _reported_steps(cluster, job_id) > resumed_at, what="steps on the H100s")
    _cancel(cluster, job_id)


def test_scale_pins_a_job_to_a_type_and_any_lifts_the_pin(cluster: LiveServer) -> None:
    manifest, files = _elastic(2000)
    job_id = cluster.submit_ok(manifest, files)
    _running_on(cluster, job_id, "node-h100")

    pinned = cluster.client.patch(f"/v1/models/{job_id}", json={"gpu_type": "a100"})
    assert pinned.status_code == 202, pinned.text
    assert pinned.json()["pinned"] == {"gpus": None, "gpu_type": "a100"}
    model = _running_on(cluster, job_id, "node-a100")
    moves = [e["reason"] for e in model["events"] if e["to"] == "RESCALING"]
    assert any("h100→a100" in reason and "pinned" in reason for reason in moves), moves
    # Slower, but pinned: it stays on the A100s while it makes progress there.
    resumed_at = _reported_steps(cluster, job_id)
    wait_for(lambda: _reported_steps(cluster, job_id) > resumed_at + 10, what="steps on A100s")
    assert {p["node"] for p in cluster.model(job_id)["placement"]} == {"node-a100"}

    lifted = cluster.client.patch(f"/v1/models/{job_id}", json={"gpu_type": "any"})
    assert lifted.status_code == 202, lifted.text
    assert lifted.json()["pinned"]["gpu_type"] is None
    _running_on(cluster, job_id, "node-h100")
    _cancel(cluster, job_id)


def test_scale_to_a_type_the_job_refuses_names_those_it_accepts(cluster: LiveServer) -> None:
    manifest, files = _elastic(2000, gpu_types=["a100"])
    job_id = cluster.submit_ok(manifest, files)
    before = cluster.model(job_id)["pinned"]

    refused = cluster.client.patch(f"/v1/models/{job_id}", json={"gpus": 2, "gpu_type": "h100"})
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert body["ffdl_code"] == "C104"
    assert body["description"] == (
        f"{job_id} does not accept GPU type 'h100'; the types it accepts: a100"
    )
    unknown = cluster.client.patch(f"/v1/models/{job_id}", json={"gpu_type": "v100"})
    assert unknown.status_code == 400, unknown.text
    assert unknown.json()["description"].endswith("the types it accepts: a100")
    # The command line says the same, and asks for something to change.
    command = ffdl(cluster, "scale", job_id, "--gpu-type", "h100")
    assert command.returncode != 0
    assert "the types it accepts: a100" in command.stderr + command.stdout
    command = ffdl(cluster, "scale", job_id)
    assert command.returncode != 0 and "give --gpus, --gpu-type or both" in command.stderr
    # Nothing changed: neither the GPU count of the refused request nor a type was pinned.
    assert cluster.model(job_id)["pinned"] == before == {"gpus": None, "gpu_type": None}

    fixed = cluster.submit_ok(manifest_yaml("true && " + HOLD, gpus=1))
    not_elastic = cluster.client.patch(f"/v1/models/{fixed}", json={"gpu_type": "a100"})
    assert not_elastic.status_code == 400, not_elastic.text
    assert "is not elastic" in not_elastic.json()["description"]
    _cancel(cluster, job_id, fixed)


# Prints how it was told to run its batch, then holds until told to stop.
TOLD = (
    "python -c 'import os, time; from ffdl.sdk.api import should_stop\n"
    'print("told", os.environ["FFDL_MICRO_BATCH_SIZE"], os.environ["FFDL_ACCUMULATION_STEPS"],'
    " flush=True)\n"
    "for _ in range(600):\n    time.sleep(0.1)\n    if should_stop(): break'"
)
BY_TYPE = {"min": 1, "max": 16, "h100": {"min": 1, "max": 64}}


def _told(live: LiveServer, job_id: str) -> str:
    def line() -> str | None:
        found = [item["line"] for item in live.loglines(job_id) if item["line"].startswith("told")]
        return found[0] if found else None

    text: str = wait_for(line, timeout=60, interval=0.1, what=f"{job_id}'s batch layout")
    return text


def test_each_gpu_type_runs_a_job_within_its_own_per_gpu_batch_limits(
    cluster: LiveServer,
) -> None:
    elastic = {
        "gpus": {"min": 1, "max": 1},
        "batch_size": {"min": 64, "max": 64},
        "local_batch_size": BY_TYPE,
        "accumulate_gradients": True,
    }
    # Both accept both types, each with its own first choice.
    on_h100 = cluster.submit_ok(manifest_yaml(TOLD, elastic=elastic, gpu_types=["h100", "a100"]))
    on_a100 = cluster.submit_ok(manifest_yaml(TOLD, elastic=elastic, gpu_types=["a100", "h100"]))
    # 64 samples on one GPU: in one go on an H100 (up to 64), in 4 x 16 on an A100.
    assert _told(cluster, on_h100) == "told 64 1"
    assert _told(cluster, on_a100) == "told 16 4"
    _cancel(cluster, on_h100, on_a100)


def test_per_gpu_batch_limits_for_a_type_the_job_cannot_run_on_are_refused(
    cluster: LiveServer,
) -> None:
    before = cluster.client.get("/v1/models").json()["total"]
    elastic = {
        "gpus": {"min": 1, "max": 2},
        "batch_size": {"min": 64, "max": 128},
        "accumulate_gradients": True,
    }
    unknown = {**elastic, "local_batch_size": {**BY_TYPE, "v100": {"min": 1, "max": 8}}}
    refused = cluster.submit(manifest_yaml("true", elastic=unknown))
    assert refused.status_code == 400, refused.text
    assert refused.json()["description"] == (
        "invalid manifest: elastic.local_batch_size.v100: no node has GPU type v100 "
        "(the types it can run on: a100, h100)"
    )
    refused = cluster.submit(
        manifest_yaml("true", elastic={**elastic, "local_batch_size": BY_TYPE}, gpu_types=["a100"])
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["description"] == (
        "invalid manifest: elastic.local_batch_size.h100: the job does not accept GPU type h100 "
        "(the types it can run on: a100)"
    )
    assert cluster.client.get("/v1/models").json()["total"] == before
