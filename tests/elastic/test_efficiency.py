"""Statistical efficiency of batch sizes and the gradient-statistics estimators."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ffdl.elastic.efficiency import (
    GradientStats,
    efficiencies,
    efficiency,
    estimate_gradient_stats,
    noise_scale,
)


@given(b=st.integers(1, 1 << 16), b0=st.integers(1, 1 << 16))
def test_every_batch_is_equally_good_without_statistics(b: int, b0: int) -> None:
    assert efficiency(b, b0, None) == 1.0


def test_noise_scale_is_variance_over_squared_norm() -> None:
    assert noise_scale(GradientStats(sq_norm=2.0, variance=500.0)) == 250.0


@given(
    b0=st.integers(1, 4096),
    small=st.integers(1, 4096),
    extra=st.integers(1, 4096),
    variance=st.floats(0.0, 1e5),
)
def test_efficiency_is_one_at_b0_and_falls_with_larger_batches(
    b0: int, small: int, extra: int, variance: float
) -> None:
    stats = GradientStats(sq_norm=1.0, variance=variance)
    assert efficiency(b0, b0, stats) == pytest.approx(1.0)
    assert efficiency(small + extra, b0, stats) < efficiency(small, b0, stats)


def test_efficiency_follows_the_noise_scale_model() -> None:
    stats = GradientStats(sq_norm=1.0, variance=1000.0)
    assert efficiency(2000, 1000, stats) == pytest.approx(2000 / 3000)
    # Far below the noise scale a bigger batch costs almost nothing per sample.
    assert efficiency(64, 32, stats) > 0.96
    # Without gradient noise, doubling the batch halves the progress per sample.
    assert efficiency(64, 32, GradientStats(sq_norm=1.0, variance=0.0)) == pytest.approx(0.5)


def test_vectorised_efficiencies_match_the_scalar_function() -> None:
    batches = np.array([8.0, 64.0, 1024.0])
    stats = GradientStats(sq_norm=0.5, variance=40.0)
    expected = [efficiency(int(b), 64, stats) for b in batches]
    assert efficiencies(batches, 64, stats) == pytest.approx(expected)
    assert efficiencies(batches, 64, None).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(("sq_norm", "variance"), [(0.0, 1.0), (-1.0, 1.0), (1.0, -0.5)])
def test_invalid_statistics_are_rejected(sq_norm: float, variance: float) -> None:
    with pytest.raises(ValueError):
        GradientStats(sq_norm=sq_norm, variance=variance)


def test_estimators_recover_the_true_statistics_on_simulated_gradients() -> None:
    rng = np.random.default_rng(0)
    dims, learners, local_batch = 40, 4, 8
    true_gradient = rng.normal(size=dims)
    true_gradient *= 1.5 / np.linalg.norm(true_gradient)  # |G|^2 = 2.25
    sample_std = 0.5  # tr(Sigma) = dims * 0.25 = 10
    sq_norms, variances = [], []
    for _ in range(3000):
        samples = true_gradient + sample_std * rng.normal(size=(learners, local_batch, dims))
        local = samples.mean(axis=1)
        averaged = local.mean(axis=0)
        stats = estimate_gradient_stats(
            [float(np.sum(g**2)) for g in local],
            local_batch,
            float(np.sum(averaged**2)),
            learners * local_batch,
        )
        sq_norms.append(stats.sq_norm)
        variances.append(stats.variance)
    assert np.mean(sq_norms) == pytest.approx(2.25, rel=0.05)
    assert np.mean(variances) == pytest.approx(dims * sample_std**2, rel=0.05)


def test_estimates_are_clamped_positive() -> None:
    # Averaging made the norm grow: pure noise says variance < 0, clamp keeps it usable.
    noisy = estimate_gradient_stats([1.0, 1.0], 8, 2.0, 16)
    assert noisy.variance > 0 and noisy.sq_norm > 0
    # The averaged gradient is much smaller than the local ones: |G|^2 estimate < 0.
    flat = estimate_gradient_stats([4.0, 4.0, 4.0, 4.0], 8, 0.1, 32)
    assert flat.sq_norm > 0
    assert noise_scale(flat) > 1e6


@pytest.mark.parametrize(
    ("norms", "local", "avg", "total"),
    [([], 8, 1.0, 16), ([1.0], 8, 1.0, 8), ([1.0, -1.0], 8, 1.0, 16), ([1.0], 0, 1.0, 16)],
)
def test_estimator_rejects_unusable_inputs(
    norms: list[float], local: int, avg: float, total: int
) -> None:
    with pytest.raises(ValueError):
        estimate_gradient_stats(norms, local, avg, total)
