"""Sampling a learner's GPUs through NVML while its command runs.

Every ``interval_s`` the sampler reads, for each GPU the learner holds, its utilisation
(percent of time a kernel ran), memory used and total (MiB) and power (W), and hands the
list to ``deliver`` (the controller queues it as a ``gpu`` report item, sent with the
heartbeats). The learner's GPUs are its ``CUDA_VISIBLE_DEVICES`` indexes, which the
platform assigns from the same numbering NVML uses.

NVML comes from ``nvidia-ml-py``, which loads ``libnvidia-ml.so.1``. ``library`` names
another file to load first under that name (a machine's NVML in a non-standard place, or
a stand-in on machines without a GPU); once loaded, nvidia-ml-py's own load finds it.
Without NVML, or without GPUs, nothing is sampled: one line says why, and the learner
runs as before. A sample that fails (a GPU fallen off the bus) is skipped, not fatal.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger("ffdl.learner.gpu")

GpuFigures = dict[str, float | int | None]


def visible_indexes(cuda_visible_devices: str | None) -> list[int]:
    """The NVML indexes in ``CUDA_VISIBLE_DEVICES`` (UUIDs and blanks are skipped)."""
    indexes = []
    for part in (cuda_visible_devices or "").split(","):
        part = part.strip()
        if part.isdigit():
            indexes.append(int(part))
    return indexes


class GpuSampler:
    def __init__(
        self,
        indexes: Sequence[int],
        interval_s: float,
        deliver: Callable[[list[GpuFigures]], object],
        library: str | None = None,
    ) -> None:
        self._indexes = list(indexes)
        self._interval_s = interval_s
        self._deliver = deliver
        self._library = library
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handles: list[tuple[int, Any]] = []

    def start(self) -> bool:
        """Begin sampling; False (and nothing runs) when there is nothing to sample."""
        if not self._indexes or self._interval_s <= 0:
            return False
        try:
            self._open()
        except Exception as exc:  # NVML missing or failing: sampling is best effort
            logger.info("GPU sampling off: %s", exc)
            return False
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                logger.debug("NVML shutdown failed", exc_info=True)

    def sample(self) -> list[GpuFigures]:
        """One reading of every GPU (those that fail to answer are left out)."""
        nvml = self._nvml
        figures: list[GpuFigures] = []
        for index, handle in self._handles:
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:
                logger.debug("GPU %d did not answer", index, exc_info=True)
                continue
            try:
                power_w: float | None = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except Exception:
                power_w = None  # not every GPU reports its power
            figures.append(
                {
                    "index": index,
                    "util": float(util.gpu),
                    "memory_mb": memory.used / 2**20,
                    "memory_total_mb": memory.total / 2**20,
                    "power_w": power_w,
                }
            )
        return figures

    def _open(self) -> None:
        if self._library:
            ctypes.CDLL(self._library, mode=ctypes.RTLD_GLOBAL)
        import pynvml  # nvidia-ml-py; imported here so the controller starts without it

        pynvml.nvmlInit()
        self._nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        self._handles = [
            (index, pynvml.nvmlDeviceGetHandleByIndex(index))
            for index in self._indexes
            if index < count
        ]
        if not self._handles:
            raise RuntimeError(f"none of GPUs {self._indexes} among NVML's {count}")

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            figures = self.sample()
            if figures:
                self._deliver(figures)
