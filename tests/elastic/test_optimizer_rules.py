"""The optimizer's rules one by one: batches, restart penalty, ties, fairness, candidates."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from ffdl.core.manifest import ElasticSpec
from ffdl.elastic.candidates import batch_choice
from ffdl.elastic.choices import MAX_GPU_CHOICES, batch_candidates, gpu_candidates
from ffdl.elastic.efficiency import GradientStats
from ffdl.elastic.optimizer import (
    OBJECTIVES,
    ElasticJob,
    Objective,
    Plan,
    optimize,
    restart_share,
    useful_progress,
)
from ffdl.elastic.throughput import FloatArray, ThroughputModel

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


def allocation_of(plan: Plan, job_id: str) -> tuple[int, int | None]:
    for allocation in plan.allocations:
        if allocation.job_id == job_id:
            return allocation.gpus, allocation.batch_size
    raise AssertionError(f"no allocation for {job_id}")


def test_fixed_batch_is_the_baseline_that_keeps_b0() -> None:
    stats = GradientStats(sq_norm=1.0, variance=1e6)  # huge batches would pay
    jobs = [
        make_job("training-a", grad_stats=stats),
        make_job("training-b", current_gpus=2, current_batch=512),
    ]
    elastic = optimize(jobs, 8)
    baseline = optimize(jobs, 8, fixed_batch=True)
    assert all(a.batch_size == 128 for a in baseline.allocations)
    assert allocation_of(elastic, "training-a")[1] == 1024
    assert elastic.objective > baseline.objective


def test_without_statistics_the_largest_batch_is_best() -> None:
    plan = optimize([make_job()], 4)
    assert allocation_of(plan, "training-a") == (4, 1024)


def test_larger_batches_are_chosen_only_when_the_statistics_say_they_pay() -> None:
    noiseless = make_job(grad_stats=GradientStats(sq_norm=1.0, variance=0.0))
    gpus, batch = allocation_of(optimize([noiseless], 4), "training-a")
    # No gradient noise: a bigger batch gives no more progress per step, so stay small.
    assert batch is not None and batch <= noiseless.base_batch
    noisy = make_job(grad_stats=GradientStats(sq_norm=1.0, variance=1e5))
    assert allocation_of(optimize([noisy], 4), "training-a")[1] == 1024
    middling = make_job(grad_stats=GradientStats(sq_norm=1.0, variance=300.0))
    gpus, batch = allocation_of(optimize([middling], 4), "training-a")
    assert batch is not None
    for candidate in batch_candidates(middling):
        assert useful_progress(middling, gpus, batch) >= useful_progress(middling, gpus, candidate)


def _scaling_job(gamma: float) -> ElasticJob:
    return make_job(
        gpu_range=(2, 4),
        gpus_per_learner=2,
        batch_range=None,
        base_batch=256,
        model=ThroughputModel(alpha=0.005, beta=0.002, gamma=gamma, delta=0.0),
        current_gpus=2,
    )


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("gamma", [0.001, 0.05, 0.1, 0.2])
@pytest.mark.parametrize("penalty", [0.0, 0.05, 0.1, 0.3])
def test_restart_penalty_blocks_exactly_the_changes_that_gain_less(
    gamma: float, penalty: float, objective: Objective
) -> None:
    job = _scaling_job(gamma)
    gain = useful_progress(job, 4, 256) / useful_progress(job, 2, 256) - 1.0
    plan = optimize([job], 4, restart_penalty=penalty, objective=objective)
    assert (plan.changed == ("training-a",)) == (gain > penalty)
    assert allocation_of(plan, "training-a")[0] == (4 if gain > penalty else 2)


def test_small_gain_is_not_worth_a_restart_but_a_large_one_is() -> None:
    small = _scaling_job(gamma=0.11)  # 4 GPUs gain about 4%
    large = _scaling_job(gamma=0.001)  # 4 GPUs gain about 90%
    assert optimize([small], 4).changed == ()
    assert optimize([large], 4).changed == ("training-a",)
    assert optimize([small], 4, restart_penalty=0.0).changed == ("training-a",)


def test_a_restart_is_charged_against_the_jobs_age_and_its_restarts() -> None:
    job = _scaling_job(gamma=0.11)  # 4 GPUs gain about 5%: worth it only to an old job
    assert restart_share(job, 0.1, None) == 0.1
    assert restart_share(job, 0.1, 30.0) == 0.1  # no age known: the flat share
    assert restart_share(replace(job, age_s=0.0), 0.1, 30.0) == 1.0
    assert restart_share(replace(job, age_s=90.0, restarts=1), 0.1, 30.0) == 0.5
    assert restart_share(replace(job, age_s=10.0, restarts=4), 0.1, 30.0) == 1.0

    def changed(**facts: float) -> bool:
        plan = optimize([replace(job, **facts)], 4, restart_cost_s=30.0)  # type: ignore[arg-type]
        return plan.changed == ("training-a",)

    assert changed(age_s=1200.0)  # 30 / 1230 of its progress: less than the gain
    assert not changed(age_s=300.0)  # 30 / 330: more than the gain
    assert not changed(age_s=1200.0, restarts=2)  # 90 / 1230 for one restarted twice
    # A gain of about 90% is worth even a young job's restart.
    assert optimize([replace(_scaling_job(0.001), age_s=60.0)], 4, restart_cost_s=30.0).changed


def test_the_proportional_objective_gives_a_newcomer_what_the_sum_leaves_to_a_scaling_job() -> None:
    linear = ThroughputModel(alpha=0.0, beta=0.002, gamma=0.0, delta=0.0)
    poor = ThroughputModel(alpha=0.005, beta=0.002, gamma=0.3, delta=0.0)
    jobs = [
        make_job("training-run", model=linear, batch_range=None, current_gpus=8),
        make_job("training-new", model=poor, batch_range=None),
    ]
    summed = optimize(jobs, 8, objective="throughput")
    assert [a.gpus for a in summed.allocations] == [8, 0]
    shared = optimize(jobs, 8, objective="proportional")
    assert allocation_of(shared, "training-new")[0] >= 1
    assert allocation_of(shared, "training-run")[0] >= 4, "the better-scaling job keeps more"
    # With GPUs to spare nothing is taken from the running job for the newcomer.
    roomy = optimize(jobs, 16, objective="proportional")
    assert allocation_of(roomy, "training-run")[0] == 8
    assert allocation_of(roomy, "training-new")[0] >= 1


class _SlowAcrossMachines:
    """Two GPUs on one machine run 1.8x one GPU; split over two machines, half of one."""

    def goodput(
        self, gpus: FloatArray, nodes: FloatArray, batches: FloatArray, steps: FloatArray
    ) -> FloatArray:
        result: FloatArray = np.where(nodes > 1, 0.5, np.where(gpus > 1, 1.8, 1.0)) * 100.0
        return result


def test_a_gang_spread_over_more_machines_than_it_needs_is_valued_where_it_runs() -> None:
    job = make_job(
        batch_range=None,
        gpu_range=(1, 2),
        goodput=_SlowAcrossMachines(),
        current_gpus=2,
        age_s=3600.0,
    )
    # On one machine two GPUs are the best there is; on two, one GPU beats them, restart
    # and all, so the spread gang is shrunk (to be grown again on one machine later).
    assert optimize([job], 8, restart_cost_s=30.0, gpus_per_node=4).changed == ()
    packed = replace(job, current_nodes=1)
    assert optimize([packed], 8, restart_cost_s=30.0, gpus_per_node=4).changed == ()
    spread = replace(job, current_nodes=2)
    plan = optimize([spread], 8, restart_cost_s=30.0, gpus_per_node=4)
    assert plan.changed == ("training-a",)
    assert allocation_of(plan, "training-a")[0] == 1
    with pytest.raises(ValueError, match="current_nodes"):
        replace(job, current_nodes=3)


def test_ties_keep_current_allocations() -> None:
    # Perfectly linear scaling: every split of the cluster is equally good.
    linear = ThroughputModel(alpha=0.0, beta=0.002, gamma=0.0, delta=0.0)
    jobs = [
        make_job("training-a", model=linear, batch_range=None, current_gpus=3),
        make_job("training-b", model=linear, batch_range=None, current_gpus=5),
    ]
    plan = optimize(jobs, 8, restart_penalty=0.0)
    assert [a.gpus for a in plan.allocations] == [3, 5]
    assert plan.changed == ()


def _contest(waited_s: float) -> tuple[list[ElasticJob], Plan]:
    linear = ThroughputModel(alpha=0.0, beta=0.002, gamma=0.0, delta=0.0)
    poor = ThroughputModel(alpha=0.005, beta=0.002, gamma=0.3, delta=0.0)
    jobs = [
        make_job("training-run", model=linear, batch_range=None, gpu_range=(4, 8), current_gpus=8),
        make_job(
            "training-wait",
            model=poor,
            batch_range=None,
            gpu_range=(4, 8),
            priority=0,
            waited_s=waited_s,
        ),
    ]
    return jobs, optimize(jobs, 8, fairness_after_s=FAIRNESS_AFTER_S)


def test_a_long_waiting_queued_job_is_admitted_at_its_minimum() -> None:
    _, fresh = _contest(waited_s=0.0)
    assert allocation_of(fresh, "training-wait")[0] == 0
    assert allocation_of(fresh, "training-run")[0] == 8
    _, starved = _contest(waited_s=FAIRNESS_AFTER_S + 1)
    assert allocation_of(starved, "training-wait")[0] == 4
    assert allocation_of(starved, "training-run")[0] == 4
    assert starved.changed == ("training-run",)


def test_a_newcomer_is_admitted_by_shrinking_after_admit_after_s_but_stops_no_job() -> None:
    jobs, _ = _contest(waited_s=61.0)
    plan = optimize(jobs, 8, fairness_after_s=FAIRNESS_AFTER_S, admit_after_s=60.0)
    assert allocation_of(plan, "training-wait")[0] == 4
    assert allocation_of(plan, "training-run")[0] == 4
    early = optimize(
        [replace(jobs[1], waited_s=59.0), jobs[0]],
        8,
        fairness_after_s=FAIRNESS_AFTER_S,
        admit_after_s=60.0,
    )
    assert allocation_of(early, "training-wait")[0] == 0
    # Shrinking cannot make room: the running job keeps its GPUs, however long it ran,
    # until the newcomer has waited fairness_after_s (and then at no lower a priority).
    held = [replace(jobs[0], gpu_range=(8, 8), running_s=1e6), replace(jobs[1], priority=50)]
    kept = optimize(held, 8, fairness_after_s=FAIRNESS_AFTER_S, admit_after_s=60.0)
    assert allocation_of(kept, "training-run")[0] == 8 and kept.yielded == ()
    held[1] = replace(jobs[1], waited_s=FAIRNESS_AFTER_S + 1, priority=50)
    turned = optimize(held, 8, fairness_after_s=FAIRNESS_AFTER_S, admit_after_s=60.0)
    assert turned.yielded == ("training-run",)


def test_a_starved_job_that_cannot_fit_waits_without_harm() -> None:
    jobs = [
        make_job("training-run", gpu_range=(2, 4), current_gpus=4),
        make_job("training-big", gpu_range=(16, 32), waited_s=1e6),
    ]
    plan = optimize(jobs, 8)
    assert allocation_of(plan, "training-big")[0] == 0
    assert allocation_of(plan, "training-run")[0] == 4


def test_a_starved_job_takes_the_gpus_of_one_that_has_had_its_turn() -> None:
    def jobs(ran_s: float, running_priority: int = 50) -> list[ElasticJob]:
        return [
            make_job(
                "training-run",
                priority=running_priority,
                gpu_range=(8, 8),
                current_gpus=8,
                running_s=ran_s,
            ),
            make_job("training-wait", gpu_range=(8, 8), waited_s=FAIRNESS_AFTER_S + 1),
        ]

    turned = optimize(jobs(FAIRNESS_AFTER_S), 8)
    assert allocation_of(turned, "training-run")[0] == 0
    assert allocation_of(turned, "training-wait")[0] == 8
    assert turned.yielded == ("training-run",)
    # Not before the running job has had a turn as long, nor for a lower priority.
    for kept in (optimize(jobs(FAIRNESS_AFTER_S - 1), 8), optimize(jobs(1e6, 60), 8)):
        assert allocation_of(kept, "training-run")[0] == 8
        assert allocation_of(kept, "training-wait")[0] == 0


def test_the_wait_before_stopping_a_job_and_the_turn_it_keeps_are_separate_bounds() -> None:
    def plan(waited_s: float, ran_s: float) -> Plan:
        jobs = [
            make_job("training-run", gpu_range=(8, 8), current_gpus=8, running_s=ran_s),
            make_job("training-wait", gpu_range=(8, 8), waited_s=waited_s),
        ]
        return optimize(jobs, 8, fairness_after_s=150.0, turn_s=300.0)

    # Waited past 150 s: it takes the GPUs of a job that has had a whole turn of 300 s...
    assert plan(waited_s=151.0, ran_s=300.0).yielded == ("training-run",)
    # ...but not those of one that has had them for less, however long it waited itself.
    for kept in (plan(waited_s=151.0, ran_s=299.0), plan(waited_s=1e6, ran_s=151.0)):
        assert allocation_of(kept, "training-run")[0] == 8 and kept.yielded == ()
    # Nor does a job waiting less than 150 s stop anything.
    assert plan(waited_s=149.0, ran_s=1e6).yielded == ()


def test_one_job_is_stopped_per_starved_job_and_only_when_shrinking_is_not_enough() -> None:
    ran = FAIRNESS_AFTER_S + 1
    starved = make_job("training-wait", gpu_range=(1, 8), waited_s=ran)
    one_each = [
        make_job("training-a", gpu_range=(1, 1), current_gpus=1, running_s=ran),
        make_job("training-b", gpu_range=(1, 1), current_gpus=1, running_s=ran),
        make_job("training-c", gpu_range=(1, 1), current_gpus=1, running_s=ran),
    ]
    plan = optimize([*one_each, starved], 3)
    assert [a.gpus for a in plan.allocations].count(0) == 1
    assert allocation_of(plan, "training-wait")[0] == 1

    shrinkable = make_job("training-a", gpu_range=(2, 8), current_gpus=8, running_s=ran)
    plan = optimize([shrinkable, starved], 8)
    assert allocation_of(plan, "training-a")[0] >= 2
    assert allocation_of(plan, "training-wait")[0] >= 1


def test_running_jobs_are_shrunk_to_their_minimum_but_never_to_zero() -> None:
    linear = ThroughputModel(alpha=0.0, beta=0.002, gamma=0.0, delta=0.0)
    jobs = [
        make_job("training-low", priority=0, gpu_range=(2, 8), current_gpus=8),
        make_job("training-high", priority=100, model=linear, gpu_range=(1, 8)),
    ]
    plan = optimize(jobs, 8)
    assert allocation_of(plan, "training-low")[0] == 2
    assert allocation_of(plan, "training-high")[0] == 6


def test_when_running_minimums_exceed_the_cluster_as_many_as_possible_keep_running() -> None:
    jobs = [
        make_job("training-a", gpu_range=(4, 8), current_gpus=4),
        make_job("training-b", gpu_range=(2, 8), current_gpus=2),
        make_job("training-c", gpu_range=(2, 8), current_gpus=2),
    ]
    plan = optimize(jobs, 5)
    assert sum(a.gpus for a in plan.allocations) <= 5
    assert [a.gpus > 0 for a in plan.allocations] == [False, True, True]
    assert "training-a" in plan.changed
    assert plan.yielded == (), "a stop the cluster forces is not one for a waiting job"


def test_jobs_that_cannot_run_on_this_cluster_get_nothing() -> None:
    linear = ThroughputModel(alpha=0.0, beta=0.002, gamma=0.0, delta=0.0)
    jobs = [
        make_job(gpu_range=(4, 8)),
        make_job("training-b", model=linear, batch_range=None, base_batch=2),
    ]
    plan = optimize(jobs, 3, fixed_batch=True)
    # training-a needs 4 GPUs; training-b's batch of 2 cannot feed more than 2 GPUs.
    assert allocation_of(plan, "training-a") == (0, None)
    assert allocation_of(plan, "training-b")[0] == 2


def test_priorities_weigh_in() -> None:
    jobs = [
        make_job("training-low", priority=0, batch_range=None),
        make_job("training-high", priority=100, batch_range=None),
    ]
    plan = optimize(jobs, 9)
    assert allocation_of(plan, "training-high")[0] > allocation_of(plan, "training-low")[0]


def test_every_count_of_whole_nodes_in_range_is_a_choice() -> None:
    job = make_job(gpu_range=(1, 64))
    choices = gpu_candidates(job, 64, gpus_per_node=4)
    assert set(range(4, 65, 4)) <= set(choices)
    assert {1, 2, 3} <= set(choices)
    # A gang of 3-GPU learners fills whole 4-GPU nodes at multiples of 12.
    gang = gpu_candidates(make_job(gpu_range=(3, 60), gpus_per_learner=3), 64, gpus_per_node=4)
    assert {12, 24, 36, 48, 60} <= set(gang) and all(g % 3 == 0 for g in gang)
    # The optimizer hands its node size on: one job alone on a 24-GPU cluster of 4-GPU
    # nodes, still faster with every GPU, takes all 24 (thinned alone, 21 was the nearest).
    plan = optimize([replace(job, batch_range=(32, 8192))], 24, gpus_per_node=4)
    assert allocation_of(plan, job.id)[0] == 24


def test_gpu_candidates_are_thinned_geometrically_and_keep_the_essentials() -> None:
    job = make_job(gpu_range=(2, 4096), gpus_per_learner=2, current_gpus=1234)
    choices = gpu_candidates(job, 4096)
    assert len(choices) <= 2 * MAX_GPU_CHOICES + 1
    assert {2, 4096, 1234} <= set(choices)
    assert all(g % 2 == 0 for g in choices) and list(choices) == sorted(set(choices))
    ratios = [b / a for a, b in itertools.pairwise(c for c in choices if c != 1234)]
    assert max(ratios) < 2.5
    # Whole nodes (8 GPUs) are thinned too when there are hundreds of them.
    whole = [g for g in choices if g % 8 == 0]
    assert (
        len(whole) >= MAX_GPU_CHOICES - 2 and max(b / a for a, b in itertools.pairwise(whole)) <= 2
    )
    # Capping at the cluster size only removes choices: more GPUs never take one away.
    assert set(gpu_candidates(job, 1000)) <= set(choices)
    assert gpu_candidates(replace(job, gpu_range=(3, 9)), 100) == (4, 6, 8)


def test_batch_candidates_span_the_range_and_keep_b0_and_the_current_batch() -> None:
    job = make_job(batch_range=(16, 4096), base_batch=100, current_gpus=2, current_batch=777)
    choices = batch_candidates(job, batch_choices=8)
    assert {16, 4096, 100, 777} <= set(choices)
    assert len(choices) <= 10 and list(choices) == sorted(set(choices))
    assert batch_candidates(job, fixed_batch=True) == (100,)
    assert batch_candidates(replace(job, batch_range=None)) == (100,)


def test_a_cluster_sized_problem_is_solved_within_its_constraints() -> None:
    jobs = [
        make_job(
            f"training-{i}",
            priority=i % 101,
            gpu_range=(1 + i % 3, 4 + i % 29),
            current_gpus=(1 + i % 3) if i % 2 else 0,
            grad_stats=GradientStats(1.0, float(10 * i)) if i % 3 else None,
        )
        for i in range(300)
    ]
    plan = optimize(jobs, 1024)
    assert sum(a.gpus for a in plan.allocations) <= 1024
    assert all(a.gpus > 0 for job, a in zip(jobs, plan.allocations, strict=True) if job.running)


@pytest.mark.parametrize(
    "overrides",
    [
        {"gpu_range": (0, 4)},
        {"gpu_range": (4, 2)},
        {"gpu_range": (3, 3), "gpus_per_learner": 2},
        {"gpus_per_learner": 0},
        {"base_batch": 0},
        {"batch_range": (256, 1024)},
        {"current_gpus": -1},
        {"current_batch": 0},
        {"age_s": -1.0},
        {"restarts": -1},
    ],
)
def test_invalid_jobs_are_rejected(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        make_job("training-bad", **overrides)


def test_invalid_calls_are_rejected() -> None:
    with pytest.raises(ValueError):
        optimize([make_job(), make_job()], 8)
    with pytest.raises(ValueError):
        optimize([make_job()], -1)
    with pytest.raises(ValueError):
        optimize([make_job()], 8, restart_penalty=-0.1)
    with pytest.raises(ValueError, match="restart_cost_s"):
        optimize([make_job()], 8, restart_cost_s=-1.0)
    with pytest.raises(ValueError, match="admit_after_s"):
        optimize([make_job()], 8, admit_after_s=-1.0)
    with pytest.raises(ValueError, match="turn_s"):
        optimize([make_job()], 8, turn_s=-1.0)
    with pytest.raises(ValueError, match="objective must be one of throughput, proportional"):
        optimize([make_job()], 8, objective="fastest")  # type: ignore[arg-type]
    assert optimize([], 8) == Plan(allocations=(), objective=0.0, changed=())


def test_a_small_batch_range_floor_keeps_the_small_gpu_counts_it_can_feed() -> None:
    """Batch 8..512 with 4..8 samples per GPU on up to 64 GPUs: 1 GPU (batch 8) is a
    choice, and the efficiency reference is the batch the job starts with, not 8 per GPU
    of the largest count."""
    elastic = ElasticSpec.model_validate(
        {
            "gpus": {"min": 1, "max": 64},
            "batch_size": {"min": 8, "max": 512},
            "local_batch_size": {"min": 4, "max": 8},
        }
    )
    batch_range, base_batch = batch_choice(elastic, 64)
    assert (batch_range, base_batch) == ((8, 512), 8)
    job = make_job(
        gpu_range=(1, 64), batch_range=batch_range, base_batch=base_batch, local_batch_range=(4, 8)
    )
    choices = gpu_candidates(job, 64)
    assert choices[0] == 1 and {1, 2, 4} <= set(choices)
    plan = optimize([job], 4)
    assert allocation_of(plan, job.id)[0] in (1, 2, 3, 4)
