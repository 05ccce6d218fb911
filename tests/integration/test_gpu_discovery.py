"""GPU discovery and pinning through ``nvidia-smi``, on machines without a GPU.

A small executable named ``nvidia-smi`` on ``PATH`` answers the discovery query the way the
real tool does, so that the parsing, the node the local backend reports and the pinning
environment of each learner are exercised everywhere. ``tests/gpu`` checks the same on
real devices where there are some.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ffdl.backends.gpus import GpuInfo, detect_gpus
from tests.integration.live import HOST_CONFIG, LiveServer, manifest_yaml, serving, wait_for

ANSWER = """\
0, NVIDIA H100 80GB HBM3, 81559, GPU-11111111-2222-3333-4444-555555555555
1, NVIDIA H100 80GB HBM3, 81559, GPU-66666666-7777-8888-9999-000000000000
"""


def _install_smi(directory: Path, body: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def two_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tools = tmp_path / "tools"
    _install_smi(tools, f"cat <<'EOF'\n{ANSWER}EOF")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    return tools


def test_discovery_reads_index_name_memory_and_uuid(two_gpus: Path) -> None:
    assert detect_gpus() == [
        GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559, "GPU-11111111-2222-3333-4444-555555555555"),
        GpuInfo(1, "NVIDIA H100 80GB HBM3", 81559, "GPU-66666666-7777-8888-9999-000000000000"),
    ]


def test_a_failing_nvidia_smi_means_no_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "tools"
    _install_smi(tools, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert detect_gpus() == []


@pytest.fixture
def host(two_gpus: Path, tmp_path: Path) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path / "home", config=HOST_CONFIG)) as live:
        yield live


# The release file lies in the job's own JOB_STATE_DIR: the sandbox shows nothing else.
ENV_PROBE = """
import os, time
print("PIN", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["CUDA_DEVICE_ORDER"], flush=True)
RELEASE = os.path.join(os.environ["JOB_STATE_DIR"], "release")
deadline = time.monotonic() + 60
while not os.path.exists(RELEASE) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def test_learners_running_together_are_pinned_to_distinct_gpus(host: LiveServer) -> None:
    nodes = host.client.get("/v1/nodes").json()["nodes"]
    assert [(n["gpus"], n["gpu_type"]) for n in nodes] == [(2, "NVIDIA H100 80GB HBM3")]

    files = {"probe.py": ENV_PROBE}
    ids = [host.submit_ok(manifest_yaml("python probe.py"), files) for _ in range(3)]

    def pin_line(job_id: str) -> str | None:
        return next(
            (i["line"] for i in host.loglines(job_id) if i["line"].startswith("PIN ")), None
        )

    def first_two_pinned() -> list[str] | None:
        lines = [pin_line(job_id) for job_id in ids[:2]]
        return [line for line in lines if line] if all(lines) else None

    lines = wait_for(first_two_pinned, timeout=60, what="the first two jobs running")
    pins = set()
    for job_id, line in zip(ids[:2], lines, strict=True):
        _, visible, order = line.split()
        assert order == "PCI_BUS_ID"
        assert host.model(job_id)["placement"][0]["gpu_ids"] == [int(visible)]
        pins.add(visible)
    assert pins == {"0", "1"}
    third = host.model(ids[2])
    assert third["training"]["training_status"]["status"] == "QUEUED", third["training"]
    for job_id in ids[:2]:
        (host.home / "jobs" / job_id / "state" / "release").touch()
    wait_for(lambda: pin_line(ids[2]), timeout=60, what="the third job running")
    (host.home / "jobs" / ids[2] / "state" / "release").touch()
    for job_id in ids:
        host.wait_status(job_id, {"COMPLETED"}, timeout=60)
