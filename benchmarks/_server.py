"""Shared helpers for benchmarks that run a real ffdl server on 127.0.0.1."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.live import (  # noqa: E402
    FAST_CONFIG,
    LiveServer,
    code_zip,
    job_pids,
    manifest_yaml,
    wait_for,
)

__all__ = [
    "FAST_CONFIG",
    "LiveServer",
    "code_zip",
    "job_pids",
    "manifest_yaml",
    "percentile",
    "wait_for",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
