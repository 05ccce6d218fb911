"""GPU discovery on this host: NVML through ``nvidia-smi`` when present, else none.

Indices are ``nvidia-smi``'s, which follow the PCI bus; learners get
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA numbers the devices the same way.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    memory_mb: int
    uuid: str = ""


def detect_gpus() -> list[GpuInfo]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name,memory.total,uuid", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            uuid = parts[3] if len(parts) >= 4 else ""
            gpus.append(GpuInfo(int(parts[0]), parts[1], int(float(parts[2] or 0)), uuid))
    return gpus
