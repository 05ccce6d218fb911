"""The policy comparison's rules: memory-bounded batches, a noise scale that grows, Philly
windows, placement, and an engine that refuses what a cluster cannot run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from ffdl.elastic.throughput import ThroughputModel
from ffdl.sim.compare.engine import ClusterShape, Policy, PolicyError, simulate
from ffdl.sim.compare.families import FAMILIES, Family
from ffdl.sim.compare.jobs import CompareJob, Decision, JobView
from ffdl.sim.compare.placement import place
from ffdl.sim.compare.policies import FfdlElastic, Fifo, Optimus, Tiresias
from ffdl.sim.compare.workloads import WINDOW_S, WorkloadSpec, build, family_for, whole_trace
from ffdl.sim.philly import default_trace_path

TRACE = default_trace_path()
SMALL = ClusterShape(nodes=4, gpus_per_node=4)

TOY = Family(
    "toy",
    ThroughputModel(0.01, 0.001, 0.005, 0.01),
    base_batch=64,
    max_batch=1024,
    local_batch=(16, 128),
    work=2.0e5,
    noise_start=0.5,
    noise_end=50.0,
)


def toy_job(job_id: str = "j", *, gpus: int = 1, batch: int = 64, at: float = 0.0) -> CompareJob:
    return CompareJob(job_id, at, TOY, gpus, batch, TOY.work)


def test_a_batch_runs_only_on_the_gpu_counts_whose_share_fits() -> None:
    assert TOY.gpus_for_batch(64) == (1, 4)
    assert TOY.gpus_for_batch(1024) == (8, 64)
    assert TOY.adaptive_gpus() == (1, 64)
    assert TOY.batch_problem(4, 64) is None
    assert "per GPU" in str(TOY.batch_problem(5, 64))
    assert "outside 64..1024" in str(TOY.batch_problem(1, 32))
    with pytest.raises(ValueError, match="per GPU"):
        toy_job(gpus=8, batch=64)


def test_every_family_can_run_its_own_batch_and_its_limits_are_consistent() -> None:
    for family in FAMILIES.values():
        low, high = family.gpus_for_batch(family.base_batch)
        assert 1 <= low <= high, family.name
        assert family.adaptive_gpus()[1] >= high


def test_the_noise_scale_grows_so_a_large_batch_costs_more_early_than_late() -> None:
    assert TOY.noise_scale_at(0.0) == pytest.approx(32.0)
    assert TOY.noise_scale_at(1.0) == pytest.approx(3200.0)
    assert TOY.noise_scale_at(0.5) == pytest.approx(320.0)
    for progress in (0.0, 0.5, 1.0):
        assert TOY.efficiency(64, progress) == pytest.approx(1.0)
        assert TOY.efficiency(1024, progress) < TOY.efficiency(256, progress) < 1.0
    assert TOY.efficiency(1024, 0.0) < 0.1 < 0.7 < TOY.efficiency(1024, 1.0)


def test_best_goodputs_agree_with_the_scalar_model() -> None:
    goodput, batch = TOY.best_goodputs(16, 4, 0.3)
    assert goodput[0] == 0 and batch[0] == 0
    for g in range(1, 17):
        nodes = -(-g // 4)
        assert TOY.batch_problem(g, int(batch[g])) is None
        assert goodput[g] == pytest.approx(TOY.goodput(g, nodes, int(batch[g]), 0.3))
    shapes = [(1, 1, 64), (4, 1, 256), (8, 2, 512)]
    columns = zip(*shapes, strict=True)
    gpus, nodes_of, batches = (np.array(column, dtype=np.float64) for column in columns)
    many = TOY.goodputs(gpus, nodes_of, batches, 0.3)
    for k, (g, n, b) in enumerate(shapes):
        assert many[k] == pytest.approx(TOY.goodput(g, n, b, 0.3))


@dataclass
class Scripted:
    """Answers the same decision for every job, to see what the engine accepts."""

    decision: Decision
    name: str = "scripted"

    def decide(
        self, now: float, jobs: Sequence[JobView], total_gpus: int, gpus_per_node: int
    ) -> Mapping[str, Decision]:
        return {j.id: self.decision for j in jobs}


def test_the_engine_refuses_a_batch_that_does_not_fit_and_more_gpus_than_exist() -> None:
    with pytest.raises(PolicyError, match="per GPU"):
        simulate([toy_job()], Scripted(Decision(8, 64)), SMALL)
    with pytest.raises(PolicyError, match=r"outside 64\.\.1024"):
        simulate([toy_job()], Scripted(Decision(1, 32)), SMALL)
    with pytest.raises(PolicyError, match="17 GPUs decided on a cluster of 16"):
        simulate([toy_job()], Scripted(Decision(17, 17 * 32)), SMALL)


def test_a_job_runs_its_work_at_its_goodput_after_one_restart_cost() -> None:
    result = simulate([toy_job(gpus=2, batch=64)], Scripted(Decision(2, 64)), SMALL)
    (outcome,) = result.outcomes
    assert outcome.first_start_s == 0.0 and outcome.restarts == 0
    expected = 30.0 + TOY.training_time_s(2, 64, 4, steps=2000)
    assert outcome.finish_s == pytest.approx(expected, rel=0.01)


@dataclass
class Checked:
    """Wraps a fixed-batch policy and records every decision it makes."""

    inner: Policy
    seen: list[tuple[CompareJob, Decision]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    def decide(
        self, now: float, jobs: Sequence[JobView], total_gpus: int, gpus_per_node: int
    ) -> Mapping[str, Decision]:
        decisions = self.inner.decide(now, jobs, total_gpus, gpus_per_node)
        by_id = {j.id: j.job for j in jobs}
        self.seen += [(by_id[k], d) for k, d in decisions.items() if d.gpus]
        return decisions


@pytest.mark.parametrize(
    "policy",
    [Fifo(), Tiresias(), Optimus(), FfdlElastic(name="elastic-fixed-batch", fixed_batch=True)],
    ids=lambda p: p.name,
)
def test_a_fixed_batch_job_never_runs_outside_its_gpu_limits(policy: Policy) -> None:
    jobs = build(WorkloadSpec(load=0.25, seed=5), TRACE)
    checked = Checked(policy)
    result = simulate(jobs, checked, SMALL)
    assert result.completed == len(jobs)
    assert checked.seen
    for job, decision in checked.seen:
        low, high = job.fixed_batch_gpus()
        assert decision.batch == job.requested_batch
        assert low <= decision.gpus <= high, (job.id, decision)


def test_philly_windows_hold_the_published_counts_and_rules() -> None:
    one = build(WorkloadSpec(load=1.0, seed=0), TRACE)
    assert len(one) == 160 and len(build(WorkloadSpec(load=0.5, seed=0), TRACE)) == 80
    assert all(0 <= j.submit_s < WINDOW_S for j in one)
    assert [j.submit_s for j in one] == sorted(j.submit_s for j in one)
    assert build(WorkloadSpec(load=1.0, seed=0), TRACE) == one  # a seed is a workload
    assert build(WorkloadSpec(load=1.0, seed=1), TRACE) != one


def test_the_whole_trace_keeps_every_rows_own_time_and_the_same_rules(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-01 10:00:00,600,1,600,vc1\n"
        "2017-10-03 09:00:00,36000,4,144000,vc2\n"
        "2017-10-01 09:00:00,30,1,30,vc1\n"  # under 60 s: not in the pool
        "2017-10-02 09:00:00,3600000,8,28800000,vc1\n"  # 8,000 GPU-hours: not either
        "2017-10-01 09:30:00,7200,2,14400,vc3\n"
    )
    jobs = whole_trace(trace)
    assert [j.submit_s for j in jobs] == [0.0, 1800.0, 2 * 86400 - 1800.0]
    assert [j.family.name for j in jobs][2] == "yolov3"  # 40 GPU-hours
    assert jobs[0].family.name in ("deepspeech2", "bert")  # 4 GPU-hours
    assert whole_trace(trace) == jobs
    empty = tmp_path / "empty.csv"
    empty.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n")
    with pytest.raises(ValueError, match="no row of at least 60 s"):
        whole_trace(empty)


def test_a_run_ends_when_told_to_stop() -> None:
    jobs = [toy_job("a"), toy_job("b", at=30.0)]
    rounds: list[float] = []

    def after_two_rounds(now: float) -> bool:
        rounds.append(now)
        return len(rounds) > 2

    result = simulate(jobs, Scripted(Decision(1, 64)), SMALL, stop=after_two_rounds)
    assert rounds == [0.0, 60.0, 120.0]
    assert result.completed == 0 and result.end_s == 120.0


class _Draw:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(
    ("gpu_hours", "low_draw", "high_draw"),
    [
        (0.5, "cifar10", "ncf"),
        (5.0, "deepspeech2", "bert"),
        (50.0, "yolov3", "yolov3"),
        (500.0, "imagenet", "imagenet"),
    ],
)
def test_a_jobs_family_follows_its_gpu_time(
    gpu_hours: float, low_draw: str, high_draw: str
) -> None:
    assert family_for(gpu_hours, _Draw(0.1)).name == low_draw  # type: ignore[arg-type]
    assert family_for(gpu_hours, _Draw(0.9)).name == high_draw  # type: ignore[arg-type]


def test_placement_keeps_unchanged_jobs_and_packs_new_ones() -> None:
    shape = ClusterShape(nodes=3, gpus_per_node=4)
    kept = place({"a": 2, "b": 3}, {"a": {2: 2}}, shape)
    assert kept["a"] == {2: 2}
    assert kept["b"] in ({0: 3}, {1: 3})
    # A gang larger than a node spans as few nodes as it can.
    assert len(place({"c": 8}, {}, shape)["c"]) == 2
    # Counts that sum to the cluster always fit, spread if need be.
    spread = place({"d": 3, "e": 3, "f": 3, "g": 3}, {}, shape)
    assert sorted(sum(p.values()) for p in spread.values()) == [3, 3, 3, 3]
