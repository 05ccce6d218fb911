"""Gradient accumulation in the optimizer: a share above the per-GPU maximum runs as several
micro-batches per step, each paying the step's fixed overhead again, so batches too large for
a few GPUs' memory stay within reach at the price the model gives them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.elastic.accumulation import accumulation_steps, layout
from ffdl.elastic.optimizer import ElasticJob, optimize, useful_progress
from ffdl.elastic.throughput import FloatArray, StepObservation, ThroughputModel, fit

MODEL = ThroughputModel(0.01, 0.002, 0.001, 0.001)


def job(**overrides: object) -> ElasticJob:
    """A job of batch 256 holding at most 64 samples per GPU, on 1..64 GPUs."""
    fields: dict[str, object] = {
        "id": "a",
        "priority": 50,
        "gpu_range": (1, 64),
        "batch_range": None,
        "base_batch": 256,
        "local_batch_range": (16, 64),
        "model": MODEL,
    }
    fields.update(overrides)
    return ElasticJob(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("batch", "gpus", "local_max", "accumulate", "micro", "steps"),
    [
        (64, 2, 8, True, 8, 4),
        (64, 2, 8, False, 32, 1),
        (65, 2, 8, True, 7, 5),  # a share of 33: five micro-batches of at most 7
        (64, 2, None, True, 32, 1),  # no per-GPU maximum: nothing to accumulate over
        (16, 4, 8, True, 4, 1),
    ],
)
def test_layout_splits_each_gpus_share_into_micro_batches(
    batch: int, gpus: int, local_max: int | None, accumulate: bool, micro: int, steps: int
) -> None:
    planned = layout(batch, gpus, local_max, accumulate=accumulate)
    assert (planned.micro_batch, planned.steps) == (micro, steps)


def test_layout_refuses_an_empty_batch_or_no_gpus() -> None:
    with pytest.raises(ValueError, match="batch 0 on 2 GPU"):
        layout(0, 2, 8, accumulate=True)
    with pytest.raises(ValueError, match="batch 64 on 0 GPU"):
        layout(64, 0, 8, accumulate=True)


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 5000), gpus=st.integers(1, 64), local_max=st.integers(1, 512))
def test_the_vectorised_steps_agree_with_the_layout(batch: int, gpus: int, local_max: int) -> None:
    planned = layout(batch, gpus, local_max, accumulate=True)
    vectorised = accumulation_steps(
        np.array([batch / gpus]), np.array([float(local_max)]), np.array([1.0])
    )
    assert vectorised[0] == planned.steps
    assert planned.micro_batch <= local_max
    assert planned.micro_batch * planned.steps * gpus >= batch


def test_a_batch_that_does_not_fit_few_gpus_runs_there_by_accumulating() -> None:
    # 256 samples at most 64 per GPU: without accumulation 3 GPUs cannot run it at all.
    assert optimize([job(accumulate=False)], 3).allocations[0].gpus == 0
    plan = optimize([job(accumulate=True)], 3)
    assert plan.allocations[0].gpus == 3
    # Each of the 3 GPUs runs 86 samples as 2 micro-batches: 2 fixed overheads per step.
    assert plan.allocations[0].progress == pytest.approx(256 / MODEL.step_time(3, 256, 1, steps=2))


def test_each_extra_micro_batch_costs_the_fixed_overhead_again() -> None:
    accumulating = job(accumulate=True)
    # One GPU, 256 samples, at most 64 at once: 4 passes of 64, one exchange (none on 1 GPU).
    expected = 256 / (4 * MODEL.alpha + MODEL.beta * 256)
    assert useful_progress(accumulating, 1, 256) == pytest.approx(expected)
    assert useful_progress(accumulating, 4, 256) == pytest.approx(MODEL.throughput(4, 256, 1))


def test_more_gpus_win_over_accumulation_when_they_are_free() -> None:
    plan = optimize([job(accumulate=True)], 4)
    assert plan.allocations[0].gpus == 4


def test_an_expensive_exchange_is_amortised_over_accumulated_micro_batches() -> None:
    # Half a second per all-reduce round: on 4 GPUs holding 16 samples each, the batch of 64
    # spends most of its step exchanging; accumulating to 1024 pays the exchange once per
    # 16 micro-batches.
    slow_network = ThroughputModel(1e-4, 0.002, 0.5, 0.0)

    def four_gpus(accumulate: bool) -> ElasticJob:
        return job(
            gpu_range=(4, 4),
            batch_range=(64, 1024),
            base_batch=64,
            local_batch_range=(1, 16),
            accumulate=accumulate,
            model=slow_network,
        )

    assert optimize([four_gpus(False)], 4).allocations[0].batch_size == 64
    assert optimize([four_gpus(True)], 4).allocations[0].batch_size == 1024


@dataclass
class RecordingGoodput:
    """A goodput curve that keeps the steps it was asked about."""

    seen: list[tuple[float, float, float]] = field(default_factory=list)

    def goodput(
        self, gpus: FloatArray, nodes: FloatArray, batches: FloatArray, steps: FloatArray
    ) -> FloatArray:
        for g, b, s in zip(gpus.ravel(), batches.ravel(), steps.ravel(), strict=True):
            self.seen.append((float(g), float(b), float(s)))
        result: FloatArray = np.asarray(batches / (steps + 1.0), dtype=np.float64)
        return result


def test_a_goodput_model_of_its_own_is_told_the_steps() -> None:
    curve = RecordingGoodput()
    own = job(
        gpu_range=(1, 4), batch_range=(64, 256), base_batch=64, accumulate=True, goodput=curve
    )
    optimize([own], 4)
    assert curve.seen
    for gpus, batch, steps in curve.seen:
        assert steps == max(1, math.ceil(batch / gpus / 64 - 1e-9)), (gpus, batch, steps)
    assert any(steps > 1 for _, _, steps in curve.seen)


@settings(max_examples=60, deadline=None)
@given(
    base=st.integers(16, 512),
    grow=st.integers(1, 8),
    total=st.integers(1, 64),
    local_max=st.integers(16, 128),
)
def test_every_allocation_runs_micro_batches_inside_the_per_gpu_maximum(
    base: int, grow: int, total: int, local_max: int
) -> None:
    accumulating = job(
        batch_range=(base, base * grow),
        base_batch=base,
        local_batch_range=(1, local_max),
        accumulate=True,
    )
    allocation = optimize([accumulating], total).allocations[0]
    assert allocation.gpus >= 1, "with accumulation one GPU runs any batch"
    assert allocation.batch_size is not None
    planned = layout(allocation.batch_size, allocation.gpus, local_max, accumulate=True)
    assert planned.micro_batch <= local_max


def test_the_step_time_fit_counts_the_fixed_overhead_once_per_micro_batch() -> None:
    truth = ThroughputModel(0.02, 0.001, 0.005, 0.0)
    shapes = [(1, 64, 1), (1, 256, 4), (2, 256, 2), (4, 256, 1), (1, 512, 8), (2, 64, 1)]
    observations = [
        StepObservation(g, b, 1, truth.step_time(g, b, 1, steps=s), steps=s) for g, b, s in shapes
    ]
    fitted = fit(observations, ThroughputModel.prior(), prior_strength=0.0)
    assert fitted.alpha == pytest.approx(truth.alpha, rel=1e-6)
    assert fitted.beta == pytest.approx(truth.beta, rel=1e-6)
