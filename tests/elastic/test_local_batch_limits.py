"""Per-GPU batch limits in the optimizer: a batch runs on a GPU count only when each GPU's
share fits, so a fixed batch bounds the GPU count from both sides."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.elastic.optimizer import ElasticJob, optimize
from ffdl.elastic.throughput import ThroughputModel


def job(job_id: str, *, base: int, local: tuple[int, int], batches: tuple[int, int] | None):
    return ElasticJob(
        id=job_id,
        priority=50,
        gpu_range=(1, 64),
        batch_range=batches,
        base_batch=base,
        local_batch_range=local,
        model=ThroughputModel(0.01, 0.002, 0.001, 0.001),
    )


def test_a_fixed_batch_gets_no_more_gpus_than_its_local_minimum_allows() -> None:
    # 256 samples at no fewer than 32 per GPU: at most 8 GPUs, however many are free.
    plan = optimize([job("a", base=256, local=(32, 256), batches=None)], 64)
    assert plan.allocations[0].gpus == 8


def test_a_fixed_batch_that_does_not_fit_one_gpu_needs_several() -> None:
    # 256 samples at most 64 per GPU: at least 4 GPUs, so 3 free GPUs leave it waiting.
    only_three = optimize([job("a", base=256, local=(16, 64), batches=None)], 3)
    assert only_three.allocations[0].gpus == 0
    assert optimize([job("a", base=256, local=(16, 64), batches=None)], 4).allocations[0].gpus == 4


def test_an_adaptive_batch_reaches_gpu_counts_its_own_batch_cannot() -> None:
    fixed = optimize([job("a", base=128, local=(32, 128), batches=None)], 32)
    adaptive = optimize([job("a", base=128, local=(32, 128), batches=(128, 2048))], 32)
    assert fixed.allocations[0].gpus == 4
    assert adaptive.allocations[0].gpus > 4


@settings(max_examples=60, deadline=None)
@given(
    base=st.integers(8, 512),
    low=st.integers(1, 16),
    span=st.integers(1, 64),
    grow=st.integers(1, 8),
    total=st.integers(1, 64),
    fixed=st.booleans(),
)
def test_every_allocation_keeps_each_gpus_share_inside_its_limits(
    base: int, low: int, span: int, grow: int, total: int, fixed: bool
) -> None:
    local = (low, low + span)
    plan = optimize(
        [job("a", base=base, local=local, batches=(base, base * grow))],
        total,
        fixed_batch=fixed,
    )
    allocation = plan.allocations[0]
    if allocation.gpus:
        assert allocation.batch_size is not None
        assert local[0] * allocation.gpus <= allocation.batch_size <= local[1] * allocation.gpus


def test_the_batch_that_fills_every_gpu_is_a_candidate_at_every_gpu_count() -> None:
    # Batches of 8..512 on GPUs holding 4..8 samples each; steps cost mostly fixed overhead,
    # so the fullest batch a GPU count can run is the fastest. The grid's 8 sizes (8, 14,
    # 26, ...) hold none of 16, 24 or 40; each is still found.
    overhead_bound = ThroughputModel(0.3, 0.001, 0.0, 0.0)
    for gpus, fullest in ((2, 16), (3, 24), (5, 40)):
        plan = optimize(
            [
                ElasticJob(
                    id="a",
                    priority=50,
                    gpu_range=(gpus, gpus),
                    batch_range=(8, 512),
                    base_batch=8,
                    local_batch_range=(4, 8),
                    model=overhead_bound,
                )
            ],
            64,
        )
        assert (plan.allocations[0].gpus, plan.allocations[0].batch_size) == (gpus, fullest)
