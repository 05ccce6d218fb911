"""Evaluation metrics reporting: the emetrics JSON-lines file user code appends to.

The platform tails this file to show a job's learning curves. One call of :func:`report`
is one line::

    {"time": 1700000000.5, "group": "train", "iteration": 3, "samples": 192,
     "values": {"loss": 0.25, "accuracy": 0.91}}

``time`` is seconds since the Unix epoch. The file is ``$FFDL_EMETRICS_FILE`` when set,
else ``$LOG_DIR/emetrics.jsonl``.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path

from ffdl.sdk.context import job_directory

EMETRICS_FILE_VARIABLE = "FFDL_EMETRICS_FILE"
EMETRICS_FILE_NAME = "emetrics.jsonl"

_write_lock = threading.Lock()


def emetrics_path() -> Path:
    """Where :func:`report` writes, resolved from the environment at call time."""
    explicit = os.environ.get(EMETRICS_FILE_VARIABLE, "").strip()
    if explicit:
        return Path(explicit).expanduser().absolute()
    return job_directory("LOG_DIR") / EMETRICS_FILE_NAME


def _metric_value(name: str, value: object) -> float:
    # bool is an int subclass, but True/False as a metric is a mistake, not a number.
    if isinstance(value, bool | str | bytes) or not hasattr(type(value), "__float__"):
        raise ValueError(f"metric {name!r} must be a number, got {type(value).__name__}")
    try:
        # Accepts numpy scalars and one-element tensors, which users pass straight in.
        as_float = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"metric {name!r} is not convertible to a number: {exc}") from None
    if not math.isfinite(as_float):
        raise ValueError(f"metric {name!r} must be finite, got {as_float}")
    return as_float


def _optional_count(label: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{label} must be a non-negative integer or None, got {value!r}")
    return value


def report(
    step: int | None = None,
    samples: int | None = None,
    *,
    group: str = "train",
    total_steps: int | None = None,
    total_samples: int | None = None,
    epoch: int | None = None,
    total_epochs: int | None = None,
    **metrics: float,
) -> None:
    """Append one metrics line for ``group`` at ``step`` (and/or after ``samples`` samples).

    Declaring a total (``total_steps``, ``total_samples`` or ``total_epochs``, once is
    enough) lets the platform show the job's progress and estimate its time left.

    Raises ``ValueError`` naming the metric or argument when a value is non-numeric, not
    finite or a negative count; nothing is written then. Safe to call from several
    threads: lines never interleave.
    """
    iteration = _optional_count("step", step)
    sample_count = _optional_count("samples", samples)
    progress = {
        name: count
        for name, value in (
            ("total_steps", total_steps),
            ("total_samples", total_samples),
            ("epoch", epoch),
            ("total_epochs", total_epochs),
        )
        if (count := _optional_count(name, value)) is not None
    }
    if not isinstance(group, str) or not group:
        raise ValueError(f"group must be a non-empty string, got {group!r}")
    values = {name: _metric_value(name, value) for name, value in metrics.items()}
    record = {
        "time": time.time(),
        "group": group,
        "iteration": iteration,
        "samples": sample_count,
        **progress,
        "values": values,
    }
    line = json.dumps(record, allow_nan=False) + "\n"
    path = emetrics_path()
    with _write_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Opened per call in append mode so a rotated or removed file is recreated, and one
        # write per line (flushed on close) keeps lines whole even with other processes
        # appending. No fsync: metrics are advisory and reporting must stay cheap.
        with path.open("a", encoding="utf-8") as stream:
            stream.write(line)


GRADIENT_GROUP = "gradient"


def report_gradient_stats(sq_norm: float, variance: float, *, step: int | None = None) -> None:
    """Report gradient statistics so the platform can value larger batches honestly.

    ``sq_norm`` is the squared norm of the true (large-batch) gradient, ``variance`` the
    trace of the per-sample gradient covariance; their ratio is the gradient noise scale.
    ``ffdl.elastic.efficiency.estimate_gradient_stats`` computes both from the learners'
    local gradient norms and the averaged one. Without these reports the platform treats
    every batch size in the job's range as equally efficient.
    """
    if _metric_value("sq_norm", sq_norm) <= 0 or _metric_value("variance", variance) < 0:
        raise ValueError("sq_norm must be > 0 and variance >= 0")
    report(step=step, group=GRADIENT_GROUP, sq_norm=sq_norm, variance=variance)
