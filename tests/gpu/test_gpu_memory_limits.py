"""A GPU job keeps its GPU whatever holds its memory: with learner cgroups turned off the
controller's watchdog keeps the manifest's memory, and CUDA, which reserves tens of GiB of
address space at start, initialises and computes under it.

Skipped without an NVIDIA GPU (CI has none; there tests/security/test_memory_limits.py
checks the same reservation on the CPU with both mechanisms).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ffdl.backends.gpus import detect_gpus
from tests.gpu.trouble import last_lines, wait_on_gpu
from tests.integration.live import HOST_CONFIG, LiveServer, manifest_yaml, serving

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not detect_gpus(), reason="needs an NVIDIA GPU (nvidia-smi found none)"),
]

CUDA_WORK = """
import torch
x = torch.randn(4096, 4096, device="cuda")
for _ in range(20):
    x = (x @ x).clamp_(-1, 1)
torch.cuda.synchronize()
print(f"computed on {torch.cuda.get_device_name(0)}", flush=True)
"""


def test_a_gpu_job_under_the_memory_watchdog_keeps_its_gpu(tmp_path: Path) -> None:
    # This host's real GPUs (HOST_CONFIG declares no virtual nodes).
    config = {**HOST_CONFIG, "learner_cgroups": False}
    with serving(LiveServer(home=tmp_path / "home", config=config)) as server:
        assert server.client.get("/health").json()["learner_limits"]["memory"] == "watchdog"
        manifest = manifest_yaml("python work.py", gpus=1, memory="4GiB")
        job_id = server.submit_ok(manifest, {"work.py": CUDA_WORK})

        def finished() -> list[str] | None:
            lines = [str(item["line"]) for item in server.loglines(job_id)]
            done = server.status(job_id) == "COMPLETED"
            return lines if done else None

        lines = wait_on_gpu(server, [job_id], finished, timeout=120, what="the job to complete")
        assert f"computed on {detect_gpus()[0].name}" in lines, last_lines(server, job_id)
        assert any("kept by a watchdog" in line for line in lines), lines
