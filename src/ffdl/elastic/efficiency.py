"""Statistical efficiency ``E(b)``: how much training progress one sample buys at batch ``b``.

By default every batch size in the user's range is equally good (``E = 1``), the premise of
the elastic scaling paper: the user vouches that the model reaches its accuracy with any batch
in the range. When a job reports gradient statistics through the SDK, the gradient noise scale
model (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", in the form Pollux
uses) says how much a larger batch is worth::

    B_noise = tr(Sigma) / |G|^2
    E(b)    = (B_noise + b0) / (B_noise + b)

with ``|G|^2`` the squared norm of the true gradient, ``tr(Sigma)`` the trace of the
per-sample gradient covariance and ``b0`` the user's batch size. ``E(b0) = 1``; batches well
below ``B_noise`` are nearly free (the gradient is noisy, averaging more samples helps), batches
well above it waste samples. Useful progress is ``T(g, b) * E(b)`` samples per second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Relative floor for clamped estimates: the estimators below are differences of noisy
# quantities and may come out zero or negative on a single step.
_RELATIVE_FLOOR = 1e-12


@dataclass(frozen=True, slots=True)
class GradientStats:
    """Gradient statistics of a job: ``|G|^2`` and the per-sample variance ``tr(Sigma)``."""

    sq_norm: float
    variance: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sq_norm) and self.sq_norm > 0.0):
            raise ValueError(f"sq_norm must be finite and > 0, got {self.sq_norm}")
        if not (math.isfinite(self.variance) and self.variance >= 0.0):
            raise ValueError(f"variance must be finite and >= 0, got {self.variance}")


def noise_scale(stats: GradientStats) -> float:
    """The gradient noise scale ``B_noise = tr(Sigma) / |G|^2`` (a batch size, in samples)."""
    return stats.variance / stats.sq_norm


def efficiency(b: float, b0: float, stats: GradientStats | None) -> float:
    """Progress per sample at batch ``b`` relative to batch ``b0``; 1.0 without statistics."""
    _check_batches(b, b0)
    if stats is None:
        return 1.0
    scale = noise_scale(stats)
    return (scale + b0) / (scale + b)


def efficiencies(batches: FloatArray, b0: float, stats: GradientStats | None) -> FloatArray:
    """``efficiency`` element-wise over an array of batch sizes (inputs are not checked)."""
    if stats is None:
        return np.ones_like(batches, dtype=np.float64)
    scale = noise_scale(stats)
    result: FloatArray = (scale + b0) / (scale + batches)
    return result


def efficiencies_for(
    batches: FloatArray, base_batches: FloatArray, noise_scales: FloatArray
) -> FloatArray:
    """``E(b)`` over broadcastable arrays, one noise scale per job; ``inf`` means no statistics.

    An infinite noise scale is the limit of the model in which every batch is equally good,
    so jobs with and without statistics can be evaluated together.
    """
    known = np.isfinite(noise_scales)
    scales = np.where(known, noise_scales, 0.0)
    result: FloatArray = np.where(known, (scales + base_batches) / (scales + batches), 1.0)
    return result


def estimate_gradient_stats(
    local_sq_norms: Sequence[float],
    local_batch: int,
    avg_sq_norm: float,
    global_batch: int,
) -> GradientStats:
    """Unbiased estimates of ``|G|^2`` and ``tr(Sigma)`` from one data-parallel step.

    Each learner's gradient over its ``local_batch`` samples has squared norm
    ``local_sq_norms[i]``; the all-reduced gradient over ``global_batch`` samples has squared
    norm ``avg_sq_norm``. Since ``E|g_b|^2 = |G|^2 + tr(Sigma) / b`` for any batch ``b``,
    two batch sizes give two equations::

        |G|^2    ~ (B |g_B|^2 - b |g_b|^2) / (B - b)
        tr Sigma ~ (|g_b|^2 - |g_B|^2) / (1/b - 1/B)

    with ``|g_b|^2`` the mean of the local squared norms. Single-step estimates are noisy;
    both are clamped to a small positive value so the result is always usable, and callers
    should smooth them over steps.
    """
    if not local_sq_norms:
        raise ValueError("at least one local gradient norm is needed")
    if local_batch < 1 or global_batch <= local_batch:
        raise ValueError(
            "need 1 <= local_batch < global_batch (at least two learners), "
            f"got local_batch={local_batch}, global_batch={global_batch}"
        )
    values = [*local_sq_norms, avg_sq_norm]
    if not all(math.isfinite(v) and v >= 0.0 for v in values):
        raise ValueError("squared norms must be finite and >= 0")

    local_mean = sum(local_sq_norms) / len(local_sq_norms)
    small, big = float(local_batch), float(global_batch)
    sq_norm = (big * avg_sq_norm - small * local_mean) / (big - small)
    variance = (local_mean - avg_sq_norm) / (1.0 / small - 1.0 / big)

    floor = _RELATIVE_FLOOR * max(local_mean, avg_sq_norm, 1e-300)
    return GradientStats(sq_norm=max(sq_norm, floor), variance=max(variance, floor))


def _check_batches(b: float, b0: float) -> None:
    if not (b > 0 and b0 > 0):
        raise ValueError(f"batch sizes must be > 0, got b={b}, b0={b0}")
