"""The step-time model, its non-negative least-squares solver and its fit to observations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.elastic.throughput import StepObservation, ThroughputModel, fit, nnls, prior

TRUE_MODEL = ThroughputModel(alpha=0.012, beta=0.0007, gamma=0.045, delta=0.015)


def test_step_time_follows_the_documented_formula() -> None:
    model = ThroughputModel(alpha=0.005, beta=0.002, gamma=0.02, delta=0.03)
    assert model.step_time(1, 64) == pytest.approx(0.005 + 0.002 * 64)
    assert model.step_time(8, 256) == pytest.approx(0.005 + 0.002 * 32 + 0.02 * 3)
    assert model.step_time(16, 256, nodes=2) == pytest.approx(
        0.005 + 0.002 * 16 + 0.02 * 4 + 0.03 * 1
    )
    assert model.throughput(8, 256) == pytest.approx(256 / model.step_time(8, 256))


def test_crossing_nodes_and_adding_gpus_cost_sync_time() -> None:
    model = prior()
    assert model.step_time(8, 256, nodes=2) > model.step_time(8, 256, nodes=1)
    # With a fixed batch, doubling GPUs halves compute but adds an all-reduce round.
    assert model.throughput(2, 256) > model.throughput(1, 256)
    assert model.step_time(2, 2) > model.step_time(1, 2)


def test_prior_is_the_documented_resnet_like_default() -> None:
    assert prior() == ThroughputModel.prior()
    assert prior() == ThroughputModel(alpha=0.005, beta=0.002, gamma=0.020, delta=0.030)


@pytest.mark.parametrize(
    ("params", "call"),
    [
        ((-0.1, 0.002, 0.0, 0.0), None),
        ((0.0, 0.0, 0.01, 0.0), None),
        ((0.005, math.nan, 0.0, 0.0), None),
        ((0.005, 0.002, 0.0, 0.0), (0, 16, 1)),
        ((0.005, 0.002, 0.0, 0.0), (4, 0, 1)),
        ((0.005, 0.002, 0.0, 0.0), (4, 16, 5)),
    ],
)
def test_invalid_parameters_and_shapes_are_rejected(
    params: tuple[float, float, float, float], call: tuple[int, int, int] | None
) -> None:
    with pytest.raises(ValueError):
        model = ThroughputModel(*params)
        assert call is not None
        model.step_time(*call)


@given(
    gpus=st.integers(1, 512),
    batch=st.integers(1, 8192),
    per_node=st.sampled_from([1, 4, 8]),
)
def test_vectorised_step_times_match_the_scalar_formula(
    gpus: int, batch: int, per_node: int
) -> None:
    nodes = -(-gpus // per_node)
    vector = TRUE_MODEL.step_times(
        np.array([float(gpus)]), np.array([float(batch)]), np.array([float(nodes)])
    )
    assert vector[0] == pytest.approx(TRUE_MODEL.step_time(gpus, batch, nodes), rel=1e-12)
    assert TRUE_MODEL.throughputs(
        np.array([float(gpus)]), np.array([float(batch)]), np.array([float(nodes)])
    )[0] == pytest.approx(TRUE_MODEL.throughput(gpus, batch, nodes), rel=1e-12)


def _brute_force_nnls(design: np.ndarray, target: np.ndarray) -> float:
    """Smallest residual over every support set whose least-squares solution is >= 0."""
    cols = design.shape[1]
    best = float(np.sum(target**2))
    for size in range(1, cols + 1):
        for support in itertools.combinations(range(cols), size):
            sub = design[:, list(support)]
            solution = np.linalg.lstsq(sub, target, rcond=None)[0]
            if (solution >= -1e-12).all():
                best = min(best, float(np.sum((sub @ solution - target) ** 2)))
    return best


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 10),
    cols=st.integers(1, 4),
)
def test_nnls_matches_a_search_over_all_supports(seed: int, rows: int, cols: int) -> None:
    rng = np.random.default_rng(seed)
    design = rng.normal(size=(rows, cols))
    target = rng.normal(size=rows)
    solution = nnls(design, target)
    assert (solution >= 0).all()
    residual = float(np.sum((design @ solution - target) ** 2))
    assert residual <= _brute_force_nnls(design, target) + 1e-9


def test_nnls_equals_least_squares_when_that_is_already_non_negative() -> None:
    design = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    truth = np.array([0.5, 1.5])
    assert nnls(design, design @ truth) == pytest.approx(truth)


def test_nnls_clamps_a_parameter_the_data_wants_negative() -> None:
    design = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    target = np.array([3.0, 2.0, 1.0])  # slope -1 is not allowed
    solution = nnls(design, target)
    assert solution[1] == 0.0
    assert solution[0] == pytest.approx(2.0)


def _observations(
    model: ThroughputModel, count: int, noise: float, seed: int
) -> list[StepObservation]:
    rng = np.random.default_rng(seed)
    result = []
    for _ in range(count):
        gpus = int(rng.choice([1, 2, 4, 8, 16, 32]))
        nodes = int(rng.integers(1, min(gpus, 4) + 1))
        batch = int(rng.choice([32, 64, 128, 256, 512]))
        exact = model.step_time(gpus, batch, nodes)
        measured = exact * float(1.0 + noise * rng.normal())
        result.append(StepObservation(gpus, batch, nodes, max(measured, 1e-6)))
    return result


def test_fit_without_observations_returns_the_prior() -> None:
    assert fit([], prior()) == prior()


def test_fit_recovers_known_parameters_from_noisy_steps() -> None:
    fitted = fit(_observations(TRUE_MODEL, 400, noise=0.02, seed=1), prior())
    assert fitted.alpha == pytest.approx(TRUE_MODEL.alpha, rel=0.15)
    assert fitted.beta == pytest.approx(TRUE_MODEL.beta, rel=0.05)
    assert fitted.gamma == pytest.approx(TRUE_MODEL.gamma, rel=0.1)
    assert fitted.delta == pytest.approx(TRUE_MODEL.delta, rel=0.15)


def test_fit_recovers_parameters_exactly_from_exact_steps() -> None:
    fitted = fit(_observations(TRUE_MODEL, 200, noise=0.0, seed=2), prior())
    for name in ("alpha", "beta", "gamma", "delta"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE_MODEL, name), rel=0.01)


def test_one_observation_moves_the_fit_toward_it_without_nonsense() -> None:
    base = prior()
    observed = StepObservation(gpus=1, batch_size=64, nodes=1, step_time_s=0.3)
    fitted = fit([observed], base)
    before = base.step_time(1, 64)
    after = fitted.step_time(1, 64)
    assert before < after < observed.step_time_s
    # A single-GPU step says nothing about synchronisation: those stay at the prior.
    assert fitted.gamma == pytest.approx(base.gamma)
    assert fitted.delta == pytest.approx(base.delta)
    assert 0 < fitted.alpha < 10 * 0.3 and 0 < fitted.beta < 10 * 0.3 / 64


def test_more_observations_weaken_the_pull_of_the_prior() -> None:
    few = fit(_observations(TRUE_MODEL, 3, noise=0.0, seed=3), prior())
    many = fit(_observations(TRUE_MODEL, 300, noise=0.0, seed=3), prior())
    probe = (8, 256, 2)
    truth = TRUE_MODEL.step_time(*probe)
    assert abs(many.step_time(*probe) - truth) <= abs(few.step_time(*probe) - truth)
    assert many.step_time(*probe) == pytest.approx(truth, rel=0.01)


def test_fit_keeps_parameters_non_negative_when_data_says_otherwise() -> None:
    no_sync = ThroughputModel(alpha=0.01, beta=0.001, gamma=0.0, delta=0.0)
    fitted = fit(_observations(no_sync, 200, noise=0.05, seed=4), prior())
    assert min(fitted.alpha, fitted.beta, fitted.gamma, fitted.delta) >= 0.0
    assert fitted.gamma < 0.005 and fitted.delta < 0.005


@pytest.mark.parametrize(
    "bad",
    [
        {"gpus": 0, "batch_size": 8, "nodes": 1, "step_time_s": 0.1},
        {"gpus": 2, "batch_size": 8, "nodes": 3, "step_time_s": 0.1},
        {"gpus": 2, "batch_size": 8, "nodes": 1, "step_time_s": 0.0},
        {"gpus": 2, "batch_size": 8, "nodes": 1, "step_time_s": math.inf},
    ],
)
def test_invalid_observations_are_rejected(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        StepObservation(**bad)  # type: ignore[arg-type]
