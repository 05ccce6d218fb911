"""Waiting on a GPU job without being fooled: a job that fell back to the CPU, hit a CUDA
error or ended early fails the test at once, with the job's last log lines, instead of
leaving it to wait for a device line or a sample that never comes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pytest

from tests.integration.live import LiveServer

T = TypeVar("T")

# What a job that lost its GPU prints: the examples' own device line, and CUDA's errors
# as PyTorch reports them.
TROUBLE = (
    "training on cpu",
    '"device": "cpu"',
    "cudaGetDeviceCount",
    "CUDA error",
    "CUDA driver initialization failed",
    "No CUDA GPUs are available",
    "Found no NVIDIA driver",
    "Torch not compiled with CUDA",
)
ENDED = {"FAILED", "CANCELLED", "HALTED"}
LAST_LINES = 25


def last_lines(server: LiveServer, job_id: str, count: int = LAST_LINES) -> str:
    lines = [str(item["line"]) for item in server.loglines(job_id)]
    return "\n".join(lines[-count:]) or "(no log lines)"


def gpu_trouble(server: LiveServer, job_id: str) -> str | None:
    """Why ``job_id`` can no longer show that it trains on its GPU, or None."""
    lines = [str(item["line"]) for item in server.loglines(job_id)]
    for line in lines:
        for sign in TROUBLE:
            if sign in line:
                return f"{job_id} lost its GPU ({line.strip()!r})"
    status: dict[str, Any] = server.model(job_id)["training"]["training_status"]
    if status["status"] in ENDED:
        return f"{job_id} ended {status['status']}: {status.get('status_message', '')}"
    return None


def wait_on_gpu(
    server: LiveServer,
    job_ids: Iterable[str],
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
) -> T:
    """Poll ``check`` until it gives a value; fail as soon as a job shows GPU trouble."""
    jobs = list(job_ids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        for job_id in jobs:
            problem = gpu_trouble(server, job_id)
            if problem is not None:
                pytest.fail(f"{problem}\nlast lines:\n{last_lines(server, job_id)}")
        time.sleep(0.2)
    tails = "\n".join(f"{job_id}:\n{last_lines(server, job_id)}" for job_id in jobs)
    pytest.fail(f"timed out after {timeout}s waiting for {what}\n{tails}")
