"""The digits example through the platform on a real GPU: it trains on the device it was
pinned to, halts with a checkpoint, resumes from it on the device, and reaches its accuracy.

Skipped without an NVIDIA GPU (CI has none).
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ffdl.backends.gpus import detect_gpus
from tests.gpu.trouble import wait_on_gpu
from tests.integration.live import HOST_CONFIG, LiveServer, serving

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not detect_gpus(), reason="needs an NVIDIA GPU (nvidia-smi found none)"),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits"
EPOCHS = 150


@pytest.fixture
def host(tmp_path: Path) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path / "home", config=HOST_CONFIG)) as live:
        yield live


def _manifest() -> str:
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLE / "manifest.yml").read_text())
    manifest["gpus"] = 1
    manifest["framework"]["command"] = f"python train.py --epochs {EPOCHS}"
    return yaml.safe_dump(manifest)


def _train_epochs(server: LiveServer, job_id: str) -> list[int]:
    response = server.client.get(f"/v1/logs/{job_id}/emetrics", params={"pagesize": 5000})
    return [
        int(r["etimes"]["iteration"]["value"])
        for r in response.json()["models"]
        if r["grouplabel"] == "train"
    ]


def _lines(server: LiveServer, job_id: str) -> list[str]:
    return [str(item["line"]) for item in server.loglines(job_id)]


def test_digits_trains_on_the_gpu_halts_and_resumes_there(host: LiveServer) -> None:
    response = host.submit(_manifest(), {"train.py": (EXAMPLE / "train.py").read_text()})
    assert response.status_code == 201, response.text
    job_id = str(response.json()["model_id"])

    device = wait_on_gpu(
        host,
        [job_id],
        lambda: next(
            (line for line in _lines(host, job_id) if line.startswith("training on")), None
        ),
        timeout=120,
        what="the device line",
    )
    assert device == f"training on {detect_gpus()[0].name}"
    wait_on_gpu(
        host, [job_id], lambda: len(_train_epochs(host, job_id)) >= 3, timeout=120, what="epochs"
    )
    host.client.patch(f"/v1/models/{job_id}", json={"status": "halt"})
    host.wait_status(job_id, {"HALTED"}, timeout=60)
    assert not host.model(job_id)["placement"], "a halted job keeps no GPU"

    host.client.patch(f"/v1/models/{job_id}", json={"status": "resume"})
    host.wait_status(job_id, {"COMPLETED"}, timeout=300)
    lines = _lines(host, job_id)
    resumed = [
        int(m.group(1)) for line in lines if (m := re.match(r"resumed from epoch (\d+)", line))
    ]
    assert len(resumed) == 1 and 3 <= resumed[0] < EPOCHS, lines[-20:]
    assert _train_epochs(host, job_id) == list(range(1, EPOCHS + 1))
    accuracy = next(float(line.split()[-1]) for line in lines if line.startswith("test accuracy"))
    assert accuracy >= 0.95

    archive = host.client.get(f"/v1/models/{job_id}/trained_model")
    assert archive.status_code == 200
    assert "model.pt" in {
        Path(n).name for n in zipfile.ZipFile(io.BytesIO(archive.content)).namelist()
    }
