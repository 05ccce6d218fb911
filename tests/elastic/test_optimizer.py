"""The elastic optimizer against exhaustive search, and the invariants every plan keeps."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.elastic.choices import batch_candidates
from ffdl.elastic.efficiency import GradientStats, efficiency
from ffdl.elastic.optimizer import (
    ElasticJob,
    Plan,
    optimize,
    useful_progress,
)
from ffdl.elastic.throughput import ThroughputModel

FAIRNESS_AFTER_S = 600.0


def make_job(job_id: str = "training-a", **overrides: object) -> ElasticJob:
    fields: dict[str, object] = {
        "id": job_id,
        "priority": 50,
        "gpu_range": (1, 8),
        "batch_range": (32, 1024),
        "base_batch": 128,
        "model": ThroughputModel.prior(),
    }
    fields.update(overrides)
    return ElasticJob(**fields)  # type: ignore[arg-type]


# --- an independent statement of the objective, for exhaustive search ------------------


def _value(
    job: ElasticJob, gpus: int, batch: int, *, restart_penalty: float, gpus_per_node: int = 8
) -> float:
    weight = 1.0 + min(max(job.priority, 0), 100) / 50.0
    reference = job.model.throughput(1, job.base_batch, 1)

    def progress(g: int, b: int) -> float:
        nodes = math.ceil(g / gpus_per_node)
        return job.model.throughput(g, b, nodes) * efficiency(b, job.base_batch, job.grad_stats)

    current = (job.current_gpus, job.current_batch or job.base_batch)
    penalty = 0.0
    if job.current_gpus > 0 and (gpus, batch) != current:
        penalty = restart_penalty * progress(*current) / reference
    return weight * (progress(gpus, batch) / reference - penalty)


def _best_per_gpu_count(
    job: ElasticJob, total: int, *, restart_penalty: float, batch_choices: int, fixed: bool
) -> dict[int, float]:
    """For every allowed GPU count, the best value over the job's batch choices: its grid,
    and for that GPU count the largest and the smallest batch of its range that many GPUs
    can run (these jobs give no per-GPU limits: at least one sample per GPU)."""
    low, high = job.gpu_range
    batches = batch_candidates(job, batch_choices=batch_choices, fixed_batch=fixed)
    batch_low, batch_high = (
        (job.base_batch, job.base_batch) if fixed or job.batch_range is None else job.batch_range
    )
    result = {0: 0.0}
    for g in range(job.gpus_per_learner, min(high, total) + 1, job.gpus_per_learner):
        filling = (batch_high, min(max(g, batch_low), batch_high))
        values = [
            _value(job, g, b, restart_penalty=restart_penalty)
            for b in (*batches, *filling)
            if g >= low and b >= g
        ]
        if values:
            result[g] = max(values)
    return result


def _key(jobs: Sequence[ElasticJob], gpus: Sequence[int], utility: float) -> tuple[int, int, float]:
    kept = sum(1 for job, g in zip(jobs, gpus, strict=True) if job.current_gpus > 0 and g > 0)
    admitted = sum(
        1
        for job, g in zip(jobs, gpus, strict=True)
        if job.current_gpus == 0 and job.waited_s > FAIRNESS_AFTER_S and g > 0
    )
    return kept, admitted, utility


def brute_force(
    jobs: Sequence[ElasticJob],
    total: int,
    *,
    restart_penalty: float = 0.1,
    batch_choices: int = 8,
    fixed: bool = False,
) -> tuple[int, int, float]:
    tables = [
        _best_per_gpu_count(
            job, total, restart_penalty=restart_penalty, batch_choices=batch_choices, fixed=fixed
        )
        for job in jobs
    ]
    best: tuple[int, int, float] | None = None
    for combo in itertools.product(*(sorted(t) for t in tables)):
        if sum(combo) > total:
            continue
        utility = sum(t[g] for t, g in zip(tables, combo, strict=True))
        key = _key(jobs, combo, utility)
        if best is None or key[:2] > best[:2] or (key[:2] == best[:2] and key[2] > best[2]):
            best = key
    assert best is not None
    return best


def plan_key(jobs: Sequence[ElasticJob], plan: Plan) -> tuple[int, int, float]:
    return _key(jobs, [a.gpus for a in plan.allocations], plan.objective)


# --- strategies ---------------------------------------------------------------------------


@st.composite
def small_jobs(draw: st.DrawFn, max_jobs: int = 4, max_gpus: int = 12) -> list[ElasticJob]:
    jobs = []
    for index in range(draw(st.integers(1, max_jobs))):
        gang = draw(st.sampled_from([1, 1, 2, 3, 4]))
        low = gang * draw(st.integers(1, max(1, 6 // gang)))
        high = draw(st.integers(low, max_gpus))
        base = draw(st.sampled_from([2, 4, 8, 16, 32, 64]))
        batch_range = None
        if draw(st.booleans()):
            batch_range = (draw(st.integers(1, base)), draw(st.integers(base, 256)))
        model = ThroughputModel(
            alpha=draw(st.floats(0.0005, 0.05)),
            beta=draw(st.floats(1e-4, 1e-2)),
            gamma=draw(st.floats(0.0, 0.1)),
            delta=draw(st.floats(0.0, 0.1)),
        )
        stats = draw(st.none() | st.builds(GradientStats, st.just(1.0), st.floats(0.0, 2000.0)))
        current_gpus = 0
        current_batch = None
        if draw(st.booleans()):
            current_gpus = draw(st.sampled_from(range(low, high + 1, gang)))
            if batch_range is not None:
                current_batch = draw(st.integers(*batch_range))
        jobs.append(
            ElasticJob(
                id=f"training-{index}",
                priority=draw(st.integers(0, 100)),
                gpu_range=(low, high),
                batch_range=batch_range,
                base_batch=base,
                gpus_per_learner=gang,
                model=model,
                grad_stats=stats,
                current_gpus=current_gpus,
                current_batch=current_batch,
                waited_s=draw(st.sampled_from([0.0, 10_000.0])) if not current_gpus else 0.0,
            )
        )
    return jobs


# --- properties -----------------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(
    jobs=small_jobs(),
    total=st.integers(0, 12),
    penalty=st.sampled_from([0.0, 0.1, 0.5]),
    fixed=st.booleans(),
)
def test_matches_exhaustive_search_on_small_clusters(
    jobs: list[ElasticJob], total: int, penalty: float, fixed: bool
) -> None:
    plan = optimize(jobs, total, restart_penalty=penalty, fixed_batch=fixed)
    expected = brute_force(jobs, total, restart_penalty=penalty, fixed=fixed)
    got = plan_key(jobs, plan)
    assert got[:2] == expected[:2]
    assert got[2] == pytest.approx(expected[2], rel=1e-6, abs=1e-6)
    # The reported objective is the value of the reported allocations.
    recomputed = sum(
        _value(job, a.gpus, a.batch_size, restart_penalty=penalty) if a.batch_size else 0.0
        for job, a in zip(jobs, plan.allocations, strict=True)
    )
    assert plan.objective == pytest.approx(recomputed, rel=1e-9, abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(jobs=small_jobs(max_jobs=6, max_gpus=40), total=st.integers(0, 64), fixed=st.booleans())
def test_ranges_batches_and_capacity_are_always_respected(
    jobs: list[ElasticJob], total: int, fixed: bool
) -> None:
    plan = optimize(jobs, total, fixed_batch=fixed)
    assert [a.job_id for a in plan.allocations] == [job.id for job in jobs]
    assert sum(a.gpus for a in plan.allocations) <= total
    for job, allocation in zip(jobs, plan.allocations, strict=True):
        if allocation.gpus == 0:
            assert allocation.batch_size is None and allocation.progress == 0.0
            continue
        low, high = job.gpu_range
        assert low <= allocation.gpus <= high
        assert allocation.gpus % job.gpus_per_learner == 0
        assert allocation.batch_size is not None and allocation.batch_size >= allocation.gpus
        if fixed or job.batch_range is None:
            assert allocation.batch_size == job.base_batch
        else:
            assert job.batch_range[0] <= allocation.batch_size <= job.batch_range[1]
        assert allocation.progress == pytest.approx(
            useful_progress(job, allocation.gpus, allocation.batch_size)
        )


@settings(max_examples=100, deadline=None)
@given(jobs=small_jobs(max_jobs=6, max_gpus=40), total=st.integers(0, 48), extra=st.integers(1, 16))
def test_more_gpus_never_make_the_plan_worse(
    jobs: list[ElasticJob], total: int, extra: int
) -> None:
    smaller = plan_key(jobs, optimize(jobs, total))
    larger = plan_key(jobs, optimize(jobs, total + extra))
    assert larger[:2] >= smaller[:2]
    if larger[:2] == smaller[:2]:
        assert larger[2] >= smaller[2] - 1e-6 * (1.0 + abs(smaller[2]))


@settings(max_examples=100, deadline=None)
@given(
    low=st.integers(1, 4),
    span=st.integers(0, 12),
    gang=st.sampled_from([1, 2]),
    batch_low=st.integers(1, 64),
    batch_span=st.integers(0, 2000),
    total=st.integers(1, 32),
    alpha=st.floats(0.0005, 0.05),
    beta=st.floats(1e-4, 1e-2),
    gamma=st.floats(0.0, 0.2),
)
def test_one_job_gets_its_throughput_maximising_allocation(
    low: int,
    span: int,
    gang: int,
    batch_low: int,
    batch_span: int,
    total: int,
    alpha: float,
    beta: float,
    gamma: float,
) -> None:
    low *= gang
    high = low + span * gang
    batch_high = batch_low + batch_span
    job = make_job(
        gpu_range=(low, high),
        gpus_per_learner=gang,
        batch_range=(batch_low, batch_high),
        base_batch=batch_low,
        model=ThroughputModel(alpha, beta, gamma, 0.03),
    )
    plan = optimize([job], total)
    best = 0.0
    for g in range(low, min(high, total) + 1, gang):
        for b in range(max(g, batch_low), batch_high + 1):
            best = max(best, job.model.throughput(g, b, math.ceil(g / 8)))
    assert plan.allocations[0].progress == pytest.approx(best, rel=1e-9)


def test_gang_sizes_coarsen_the_gpu_axis_without_changing_the_answer() -> None:
    jobs = [
        make_job("training-a", gpus_per_learner=4, gpu_range=(4, 16)),
        make_job("training-b", gpus_per_learner=8, gpu_range=(8, 32)),
    ]
    plan = optimize(jobs, 30)
    assert all(a.gpus % 4 == 0 for a in plan.allocations)
    assert plan_key(jobs, plan)[2] == pytest.approx(brute_force(jobs, 30)[2], rel=1e-9)
