"""Shared helpers for benchmarks that run a real ffdl server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.live import (  # noqa: E402
    FAST_CONFIG,
    LiveServer,
    code_zip,
    free_port,
    job_pids,
    manifest_yaml,
    wait_for,
)

__all__ = [
    "FAST_CONFIG",
    "LiveServer",
    "all_models",
    "code_zip",
    "job_pids",
    "manifest_yaml",
    "moto_process",
    "percentile",
    "wait_for",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def all_models(client: httpx.Client) -> list[dict[str, Any]]:
    """Every job the platform lists to ``client``, page after page."""
    models: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 500}
    while True:
        response = client.get("/v1/models", params=params)
        response.raise_for_status()
        page = response.json()
        models += page["models"]
        if "next" not in page:
            return models
        params["after"] = page["next"]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextlib.contextmanager
def moto_process() -> Iterator[str]:
    """moto's S3 server as a process of its own on 127.0.0.1, accepting any credentials (a
    process, so that the server and the clients measured do not share one interpreter lock)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.post(f"{endpoint}/moto-api/reset", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)
