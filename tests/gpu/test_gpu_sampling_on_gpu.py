"""GPU use measured on a real NVIDIA GPU: a GPU-bound job's sampled utilisation is high and
its memory in use is what it allocated.

Skipped on machines without ``nvidia-smi`` and a GPU (CI has none; there the same path
runs against the stand-in NVML library, ``tests/gpu_sampling``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ffdl.backends.gpus import detect_gpus
from tests.gpu.trouble import wait_on_gpu
from tests.integration.live import HOST_CONFIG, LiveServer, manifest_yaml, serving

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not detect_gpus(), reason="needs an NVIDIA GPU (nvidia-smi found none)"),
]

# Matrix products back to back for a minute, holding about 2 GiB.
BUSY = """
import time, torch
a = torch.randn(8192, 8192, device="cuda")
hold = torch.empty(512 * 1024 * 1024, device="cuda")
end = time.time() + 60
while time.time() < end:
    a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()
"""


def test_a_gpu_bound_jobs_samples_show_it_busy(tmp_path: Path) -> None:
    # This host's real GPUs (HOST_CONFIG declares no virtual nodes).
    config = {**HOST_CONFIG, "gpu_sample_s": 1.0}
    with serving(LiveServer(home=tmp_path / "home", config=config)) as server:
        manifest = manifest_yaml("python busy.py", gpus=1, memory="4GiB")
        job_id = server.submit_ok(manifest, {"busy.py": BUSY})

        def measured() -> dict[str, Any] | None:
            use = server.model(job_id).get("gpu_utilization")
            return use if use and use["measured_s"] >= 20 else None

        # The average covers the job's start too (CUDA initialising, allocating: idle GPU,
        # about 5 s on an H200), so it is read after 20 s of samples, not 10.
        use = wait_on_gpu(server, [job_id], measured, timeout=120, what="20 s of GPU samples")
        assert use["average"] > 50.0, use
        assert use["memory_mb"] is not None and use["memory_mb"] > 2000.0, use
        samples = server.client.get(f"/v1/models/{job_id}/gpu").json()["samples"]
        assert samples and all(s["gpus"][0]["memory_total_mb"] > 0 for s in samples)
        assert server.client.delete(f"/v1/models/{job_id}").status_code in (200, 202)
