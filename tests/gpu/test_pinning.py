"""GPU pinning on real NVIDIA devices: discovery, one learner per GPU, CPU jobs see none,
and a sandboxed learner has no device node but its own GPU's.

Skipped on machines without ``nvidia-smi`` and a GPU (CI has none). The learners import
torch and run a matrix product on the device they were given.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ffdl.backends.gpus import GpuInfo, detect_gpus
from tests.gpu.trouble import wait_on_gpu
from tests.integration.live import HOST_CONFIG, LiveServer, manifest_yaml, serving

GPUS = detect_gpus()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPUS, reason="needs an NVIDIA GPU (nvidia-smi found none)"),
]

# Waits for a release file (in its JOB_STATE_DIR, the only place the test can reach into
# the sandbox) so that the test decides when the GPUs are given back.
PROBE = """
import glob, json, os, time
import torch

RELEASE = os.path.join(os.environ["JOB_STATE_DIR"], "release")
count = torch.cuda.device_count()
info = {
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "order": os.environ.get("CUDA_DEVICE_ORDER"),
    "count": count,
    "devices": sorted(glob.glob("/dev/nvidia[0-9]*")),
}
if count:
    props = torch.cuda.get_device_properties(0)
    x = torch.randn(2048, 2048, device="cuda")
    info.update(uuid=str(props.uuid), name=props.name, product=float((x @ x).abs().sum()))
print("PROBE " + json.dumps(info), flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(RELEASE) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


@pytest.fixture
def host(tmp_path: Path) -> Iterator[LiveServer]:
    """A server whose local backend reports this host's real GPUs (no declared nodes)."""
    with serving(LiveServer(home=tmp_path / "home", config=HOST_CONFIG)) as live:
        yield live


def _probe_job(gpus: int) -> tuple[str, dict[str, str]]:
    return manifest_yaml("python probe.py", gpus=gpus, memory="4GiB"), {"probe.py": PROBE}


def _release(server: LiveServer, job_id: str) -> None:
    (server.home / "jobs" / job_id / "state" / "release").touch()


def _probe(server: LiveServer, job_id: str) -> dict[str, Any] | None:
    for item in server.loglines(job_id):
        if item["line"].startswith("PROBE "):
            result: dict[str, Any] = json.loads(item["line"][len("PROBE ") :])
            return result
    return None


def _bare(uuid: str) -> str:
    return uuid.removeprefix("GPU-")


def _by_index() -> dict[int, GpuInfo]:
    return {gpu.index: gpu for gpu in GPUS}


def test_the_local_node_reports_this_hosts_gpus(host: LiveServer) -> None:
    nodes = host.client.get("/v1/nodes").json()["nodes"]
    assert len(nodes) == 1
    assert nodes[0]["gpus"] == len(GPUS)
    assert nodes[0]["gpu_type"] == GPUS[0].name


def test_each_learner_sees_only_its_own_gpu_and_the_next_job_waits(host: LiveServer) -> None:
    manifest, files = _probe_job(gpus=1)
    ids = [host.submit_ok(manifest, files) for _ in range(len(GPUS) + 1)]
    running, extra = ids[:-1], ids[-1]

    def probed() -> dict[str, dict[str, Any]] | None:
        found = {job_id: _probe(host, job_id) for job_id in running}
        return found if all(found.values()) else None  # type: ignore[return-value]

    probes: dict[str, dict[str, Any]] = wait_on_gpu(
        host, running, probed, timeout=120, what="probes on every GPU"
    )
    waiting = host.model(extra)
    assert waiting["training"]["training_status"]["status"] == "QUEUED"
    assert "GPU" in waiting["queue"]["reason"], waiting["queue"]
    seen = set()
    for job_id, probe in probes.items():
        pinned = host.model(job_id)["placement"][0]["gpu_ids"]
        assert len(pinned) == 1
        gpu = _by_index()[pinned[0]]
        assert probe["count"] == 1
        assert probe["visible"] == str(gpu.index)
        assert probe["order"] == "PCI_BUS_ID"
        assert _bare(probe["uuid"]) == _bare(gpu.uuid), (probe, gpu)
        # The sandbox holds the device node of its own GPU and of no other.
        assert probe["devices"] == [f"/dev/nvidia{gpu.index}"], probe
        seen.add(probe["uuid"])
    assert len(seen) == len(GPUS), "two learners were given the same GPU"

    for job_id in running:
        _release(host, job_id)
    wait_on_gpu(host, [extra], lambda: _probe(host, extra), timeout=120, what="the next probe")
    _release(host, extra)
    for job_id in ids:
        host.wait_status(job_id, {"COMPLETED"}, timeout=120)
    last = _probe(host, extra)
    assert last is not None and last["count"] == 1


def test_a_job_without_gpus_sees_no_device(host: LiveServer) -> None:
    manifest, files = _probe_job(gpus=0)
    job_id = host.submit_ok(manifest, files)
    probe = wait_on_gpu(host, [job_id], lambda: _probe(host, job_id), timeout=120, what="the probe")
    _release(host, job_id)
    host.wait_status(job_id, {"COMPLETED"}, timeout=120)
    assert probe["count"] == 0 and probe["visible"] == ""
    assert probe["devices"] == []
