"""The optimizer values jobs through the GoodputModel interface: the parametric model given
that way plans exactly as the built-in path, and a measured curve the parametric form cannot
express is taken as it is."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.elastic.goodput import ParametricGoodput
from ffdl.elastic.optimizer import ElasticJob, optimize, useful_progress
from ffdl.elastic.throughput import FloatArray, ThroughputModel
from tests.elastic.test_optimizer import small_jobs


@dataclasses.dataclass(frozen=True)
class MeasuredCurve:
    """Samples per second measured at 1..8 GPUs (on one node), the same at every batch."""

    rates: tuple[float, ...]

    def goodput(
        self, gpus: FloatArray, nodes: FloatArray, batches: FloatArray, steps: FloatArray
    ) -> FloatArray:
        index = np.clip(gpus.astype(np.int64), 1, len(self.rates)) - 1
        result: FloatArray = np.asarray(self.rates, dtype=np.float64)[index]
        return result


def job(**overrides: object) -> ElasticJob:
    fields: dict[str, object] = {
        "id": "training-a",
        "priority": 50,
        "gpu_range": (1, 8),
        "batch_range": None,
        "base_batch": 64,
        "model": ThroughputModel.prior(),
    }
    fields.update(overrides)
    return ElasticJob(**fields)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(jobs=small_jobs(max_jobs=5, max_gpus=24), total=st.integers(0, 32), fixed=st.booleans())
def test_the_parametric_model_through_the_interface_plans_as_the_built_in_path(
    jobs: list[ElasticJob], total: int, fixed: bool
) -> None:
    wrapped = [
        dataclasses.replace(j, goodput=ParametricGoodput(j.model, j.base_batch, j.grad_stats))
        for j in jobs
    ]
    built_in = optimize(jobs, total, fixed_batch=fixed)
    through = optimize(wrapped, total, fixed_batch=fixed)
    assert [(a.gpus, a.batch_size) for a in through.allocations] == [
        (a.gpus, a.batch_size) for a in built_in.allocations
    ]
    for a, b in zip(through.allocations, built_in.allocations, strict=True):
        assert a.progress == pytest.approx(b.progress, rel=1e-9)
    assert through.objective == pytest.approx(built_in.objective, rel=1e-9)


def test_a_measured_curve_with_a_sweet_spot_is_followed() -> None:
    # Three GPUs share a switch; a fourth crosses to another and every step waits for it.
    curve = MeasuredCurve((100.0, 195.0, 290.0, 150.0, 160.0, 170.0, 180.0, 190.0))
    plan = optimize([job(goodput=curve)], 8)
    assert plan.allocations[0].gpus == 3
    assert plan.allocations[0].progress == 290.0
    assert useful_progress(job(goodput=curve), 4, 64) == 150.0
    # The same job valued by the parametric prior, which has no such dip, takes more.
    assert optimize([job()], 8).allocations[0].gpus > 3


def test_a_curve_that_gives_nothing_on_one_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        optimize([job(goodput=MeasuredCurve((0.0, 10.0)))], 4)
