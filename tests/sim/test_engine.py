"""The engine: determinism, conservation of GPU time, progress, preemption and restart rules."""

from __future__ import annotations

import math

import pytest

from ffdl.core.resources import LearnerPlacement, Node, Placement, Resources
from ffdl.sim.engine import SimConfig, SimulationError, Simulator
from ffdl.sim.metrics import SimResult
from ffdl.sim.policies import make_policy
from ffdl.sim.workload import Discrete, SimJob, SyntheticSpec, fixed_duration_job, synthetic

NODES = [Node(f"node-{i}", 4, 32.0, 131072) for i in range(8)]
GPUS = 32
POLICIES = ("fifo", "priority-backfill", "elastic", "elastic-fixed-batch", "learner-at-a-time")


def workload(seed: int = 1, jobs: int = 120, load: float = 1.1) -> list[SimJob]:
    spec = SyntheticSpec(
        jobs=jobs,
        load=load,
        seed=seed,
        learners=Discrete((1, 1, 2, 4)),
        gpus_per_learner=Discrete((1, 2)),
        priorities=Discrete((30, 50, 70)),
        elastic=True,
    )
    return synthetic(spec, cluster_gpus=GPUS, gpus_per_node=4)


def run(policy: str, jobs: list[SimJob], config: SimConfig | None = None) -> SimResult:
    return Simulator(NODES, jobs, make_policy(policy), config).run()


def fingerprint(result: SimResult) -> tuple[object, ...]:
    return (
        [(o.id, o.first_start_s, o.finish_s, o.restarts) for o in result.outcomes],
        result.series.times,
        result.series.held_gpus,
        result.held_gpu_seconds,
    )


@pytest.mark.parametrize("policy", ["priority-backfill", "elastic"])
def test_same_seed_same_results_and_another_seed_differs(policy: str) -> None:
    first = run(policy, workload(seed=4))
    again = run(policy, workload(seed=4))
    other = run(policy, workload(seed=5))
    assert fingerprint(first) == fingerprint(again)
    assert fingerprint(first) != fingerprint(other)


@pytest.mark.parametrize("policy", POLICIES)
def test_gpu_time_never_exceeds_capacity_and_every_job_ends_once(policy: str) -> None:
    jobs = workload(seed=2)
    result = run(policy, jobs)
    span = result.end_s - result.start_s
    assert 0 < result.held_gpu_seconds <= GPUS * span + 1e-6
    assert result.running_gpu_seconds <= result.held_gpu_seconds + 1e-6
    assert all(0 <= held <= GPUS for held in result.series.held_gpus)
    assert sorted(o.id for o in result.outcomes) == sorted(j.id for j in jobs)
    submitted = {j.id: j.submit_s - jobs[0].submit_s for j in jobs}
    finished = [o for o in result.outcomes if o.finish_s is not None]
    if policy != "learner-at-a-time":  # that one may deadlock for good
        assert len(finished) == len(jobs)
    for outcome in finished:
        assert outcome.first_start_s is not None
        assert submitted[outcome.id] <= outcome.first_start_s <= outcome.finish_s


def test_without_restarts_held_gpu_time_is_exactly_each_jobs_gpus_times_its_run() -> None:
    jobs = workload(seed=3)
    result = run("fifo", jobs)
    gpus = {j.id: j.gpus for j in jobs}
    expected = sum(
        gpus[o.id] * (o.finish_s - o.first_start_s)
        for o in result.outcomes
        if o.finish_s is not None and o.first_start_s is not None
    )
    assert all(o.restarts == 0 for o in result.outcomes)
    assert math.isclose(result.held_gpu_seconds, expected, rel_tol=1e-9)


def test_the_horizon_cuts_the_run_and_leaves_jobs_unfinished() -> None:
    jobs = workload(seed=2, load=2.0)
    result = run("fifo", jobs, SimConfig(horizon_s=6 * 3600.0))
    assert result.end_s == 6 * 3600.0
    summary = result.summary()
    assert summary["unfinished"] > 0
    assert summary["completed"] + summary["unfinished"] == len(jobs)
    assert all(o.finish_s <= 6 * 3600.0 for o in result.outcomes if o.finish_s is not None)


def test_a_job_given_its_gpus_runs_exactly_its_duration() -> None:
    jobs = [
        fixed_duration_job("a", 0.0, 500.0, learners=2, per_learner=Resources(2, 4.0, 1024)),
        fixed_duration_job("b", 10.0, 300.0, learners=1, per_learner=Resources(4, 4.0, 1024)),
        synthetic(SyntheticSpec(jobs=1, seed=9), cluster_gpus=GPUS, gpus_per_node=4)[0],
    ]
    result = run("fifo", jobs, SimConfig(start_overhead_s=5.0))
    runs = {
        o.id: o.finish_s - o.first_start_s
        for o in result.outcomes
        if o.finish_s and o.first_start_s is not None
    }
    assert runs["a"] == pytest.approx(505.0)
    assert runs["b"] == pytest.approx(305.0)
    assert runs[jobs[2].id] == pytest.approx(jobs[2].run_time_s(4) + 5.0)


def test_preemption_loses_work_since_the_checkpoint_and_pays_the_restart_cost() -> None:
    node = [Node("only", 4, 16.0, 65536)]
    low = fixed_duration_job("low", 0.0, 3600.0, per_learner=Resources(4, 4.0, 1024), priority=10)
    high = fixed_duration_job(
        "high", 1500.0, 600.0, per_learner=Resources(4, 4.0, 1024), priority=90
    )
    config = SimConfig(checkpoint_s=600.0, restart_s=30.0)
    result = Simulator(node, [low, high], make_policy("priority-backfill"), config).run()
    outcomes = {o.id: o for o in result.outcomes}
    assert (outcomes["high"].first_start_s, outcomes["high"].finish_s) == (1500.0, 2100.0)
    # 1,200 s of work were checkpointed; 300 s after it are lost: 2,400 s remain.
    assert outcomes["low"].finish_s == pytest.approx(2100.0 + 30.0 + 2400.0)
    assert (outcomes["low"].restarts, outcomes["low"].preemptions) == (1, 1)


def test_fifo_never_preempts_and_keeps_arrival_order_over_priority() -> None:
    node = [Node("only", 4, 16.0, 65536)]
    jobs = [
        fixed_duration_job("first", 0.0, 100.0, per_learner=Resources(4, 4.0, 1024), priority=10),
        fixed_duration_job("second", 1.0, 100.0, per_learner=Resources(4, 4.0, 1024), priority=10),
        fixed_duration_job("urgent", 2.0, 100.0, per_learner=Resources(4, 4.0, 1024), priority=90),
    ]
    result = Simulator(node, jobs, make_policy("fifo")).run()
    starts = {o.id: o.first_start_s for o in result.outcomes}
    assert starts == {"first": 0.0, "second": 100.0, "urgent": 200.0}
    assert all(o.preemptions == 0 for o in result.outcomes)


def test_a_job_that_can_never_fit_is_rejected_and_blocks_nobody() -> None:
    jobs = [
        fixed_duration_job("huge", 0.0, 100.0, learners=9, per_learner=Resources(4, 1.0, 1024)),
        fixed_duration_job("small", 1.0, 100.0),
    ]
    result = run("fifo", jobs)
    outcomes = {o.id: o for o in result.outcomes}
    assert outcomes["huge"].rejected and outcomes["huge"].first_start_s is None
    assert outcomes["small"].first_start_s == 1.0
    assert result.summary()["rejected"] == 1


def test_elastic_jobs_are_rescaled_and_still_finish_their_work() -> None:
    result = run("elastic", workload(seed=6, load=1.5))
    assert sum(o.restarts for o in result.outcomes) > 0
    assert result.autoscale_calls > 0
    assert all(o.finish_s is not None for o in result.outcomes)


def test_progress_is_reported_and_samples_move_forward() -> None:
    seen: list[float] = []
    sim = Simulator(NODES, workload(seed=1, jobs=300), make_policy("fifo"), on_progress=seen.append)
    result = sim.run()
    assert seen and seen == sorted(seen) and seen[-1] == result.end_s
    assert result.series.times == sorted(result.series.times)


def test_an_engine_error_names_the_job() -> None:
    sim = Simulator(NODES, [fixed_duration_job("a", 0.0, 10.0)], make_policy("fifo"))
    record = sim.policy.admit(sim, fixed_duration_job("a", 0.0, 10.0))
    bad = Placement((LearnerPlacement(1, "node-0", (9,)),))
    with pytest.raises(SimulationError, match="a: GPUs"):
        sim.start(record, bad)
