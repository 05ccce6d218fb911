"""The comparison on mixed GPU types: Gavel's table and trace, the engine's rules, the
baselines' allocations and ffdl's choice of type."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from ffdl.sim.compare.engine import PolicyError
from ffdl.sim.compare.gavel import (
    H100_A100_FACTORS,
    GavelJob,
    GavelTable,
    derived_table,
    gavel_jobs,
    gavel_table,
    read_gavel_table,
)
from ffdl.sim.compare.mixed import (
    MixedCluster,
    MixedDecision,
    MixedView,
    isolated_rate,
    simulate_mixed,
)
from ffdl.sim.compare.mixed_policies import (
    FfdlMixed,
    GavelPolicy,
    finish_time_allocation,
    max_min_allocation,
)
from ffdl.sim.compare.mixed_run import CLUSTERS, POLICIES, capacity, jobs_per_hour

GAVEL = MixedCluster("gavel", {"v100": 36, "p100": 36, "k80": 36}, "v100")
RESNET50 = "ResNet-50 (batch size 64)"


class Scripted:
    """Answers the same decision for every job it is told about."""

    name = "scripted"

    def __init__(self, decisions: Mapping[str, MixedDecision]) -> None:
        self.decisions = decisions

    def decide(
        self, now: float, jobs: Sequence[MixedView], cluster: MixedCluster, table: GavelTable
    ) -> Mapping[str, MixedDecision]:
        return {j.id: self.decisions[j.id] for j in jobs if j.id in self.decisions}


def test_the_table_holds_gavels_measured_points_and_reads_between_them() -> None:
    table = gavel_table()
    assert table.gpu_types == ("k80", "p100", "v100")
    assert len(table.models) == 26
    assert table.rate(RESNET50, "v100", 4) == pytest.approx(9.45195)
    assert table.rate(RESNET50, "k80", 1) == pytest.approx(0.619028)
    # Three GPUs: halfway between the rates measured on two and on four.
    two, four = table.rate(RESNET50, "p100", 2), table.rate(RESNET50, "p100", 4)
    assert table.rate(RESNET50, "p100", 3) == pytest.approx((two + four) / 2)
    # Measured on up to 8 V100s, but only on one K80: it runs on no more there.
    big = "ResNet-50 (batch size 128)"
    assert table.max_gpus(big, "v100") == 8 and table.max_gpus(big, "k80") == 1
    assert table.rate(big, "k80", 2) == 0.0 and table.rate(big, "v100", 9) == 0.0
    assert table.sizes("A3C", "v100") == (1,)


def test_a_malformed_table_row_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("model,gpu_type,gpus,steps_per_s\nA3C,v100,1,7.1\nA3C,p100,one,5\n")
    with pytest.raises(ValueError, match=r"bad\.csv:3: bad row"):
        read_gavel_table(path)
    with pytest.raises(ValueError, match="needs a rate on one GPU"):
        GavelTable({("A3C", "v100"): ((2, 1.0),)})


def test_the_derived_mix_scales_each_models_v100_rates_by_its_factor() -> None:
    base, mix = gavel_table(), derived_table(gavel_table())
    assert mix.gpu_types == ("a100", "h100")
    for model in ("Transformer (batch size 64)", "A3C", RESNET50):
        family = model.split(" (")[0]
        for gpu_type in ("a100", "h100"):
            factor = H100_A100_FACTORS[family][gpu_type]
            assert mix.rate(model, gpu_type, 1) == pytest.approx(
                base.rate(model, "v100", 1) * factor
            )


def test_a_trace_follows_gavels_distributions_and_repeats_by_seed() -> None:
    table = gavel_table()
    jobs = gavel_jobs(table, 2000, 4.0, seed=7)
    assert jobs == gavel_jobs(table, 2000, 4.0, seed=7)
    assert jobs != gavel_jobs(table, 2000, 4.0, seed=8)
    sizes = [j.gpus for j in jobs]
    assert set(sizes) == {1, 2, 4, 8}
    assert 0.66 < sizes.count(1) / len(sizes) < 0.74
    assert 0.03 < sizes.count(8) / len(sizes) < 0.07
    for job in jobs:
        # Every job runs at its own size on the reference type, for 10^1.5..10^4 minutes.
        run_s = job.steps / table.rate(job.model, "v100", job.gpus)
        assert 60 * 10**1.5 * (1 - 1e-9) <= run_s <= 60 * 10**4 * (1 + 1e-9)
    gaps = [b.submit_s - a.submit_s for a, b in itertools.pairwise(jobs)]
    assert statistics.fmean(gaps) == pytest.approx(900.0, rel=0.1)
    tenants = [j.tenant for j in jobs]
    assert tenants.count("team-a") > tenants.count("team-b") > tenants.count("team-d")


def test_a_job_runs_at_its_measured_rate_after_one_restart() -> None:
    table = gavel_table()
    rate = table.rate(RESNET50, "p100", 4)
    job = GavelJob("j", 0.0, RESNET50, 4, "team-a", steps=rate * 3600)
    cluster = MixedCluster("one", {"p100": 4}, "p100")
    result = simulate_mixed(
        [job], Scripted({"j": MixedDecision.on("p100", 4)}), cluster, table, restart_s=30
    )
    outcome = result.outcomes[0]
    assert outcome.finish_s == pytest.approx(30 + 3600)
    assert outcome.gpu_s == pytest.approx(4 * (30 + 3600))
    # Alone on a cluster of its own size, its fair share is the whole cluster.
    assert outcome.rho == pytest.approx((30 + 3600) / 3600)


def test_a_gang_over_two_types_runs_at_the_slower_ones_pace() -> None:
    table = gavel_table()
    slow = table.rate(RESNET50, "k80", 4)
    job = GavelJob("j", 0.0, RESNET50, 4, "team-a", steps=slow * 7200)
    cluster = MixedCluster("two", {"v100": 2, "k80": 2}, "v100")
    split = MixedDecision({"v100": 2, "k80": 2})
    result = simulate_mixed([job], Scripted({"j": split}), cluster, table, restart_s=0)
    assert result.outcomes[0].finish_s == pytest.approx(7200)


def test_the_engine_refuses_what_the_cluster_cannot_run() -> None:
    table = gavel_table()
    cluster = MixedCluster("small", {"v100": 4, "k80": 4}, "v100")
    big = GavelJob("big", 0.0, "ResNet-50 (batch size 128)", 1, "team-a", steps=1e6)
    other = GavelJob("other", 0.0, RESNET50, 1, "team-a", steps=1e6)
    cases = {
        "5 v100 GPUs decided, small has 4": {"big": MixedDecision.on("v100", 5)},
        "runs on at most 1 k80 GPUs": {"big": MixedDecision.on("k80", 2)},
        "no GPU type 'h100'": {"big": MixedDecision.on("h100", 1)},
        "8 v100 GPUs decided": {
            "big": MixedDecision.on("v100", 4),
            "other": MixedDecision.on("v100", 4),
        },
    }
    for message, decisions in cases.items():
        with pytest.raises(PolicyError, match=message):
            simulate_mixed([big, other], Scripted(decisions), cluster, table)


def test_the_isolated_rate_is_an_equal_share_of_every_type() -> None:
    table = gavel_table()
    job = GavelJob("j", 0.0, RESNET50, 1, "team-a", steps=1.0)
    # Alone: one GPU, time-shared across types in proportion to their size.
    alone = isolated_rate(table, GAVEL, job, 1.0)
    mean = statistics.fmean(table.rate(RESNET50, t, 1) for t in GAVEL.gpus)
    assert alone == pytest.approx(mean)
    # 216 jobs share 108 GPUs: half a GPU each.
    assert isolated_rate(table, GAVEL, job, 216.0) == pytest.approx(mean / 2)


def test_max_min_raises_the_least_normalised_throughput_and_then_the_rest() -> None:
    # Job 0 runs 4x faster on type 0; jobs 1 and 2 the same on both; one GPU of each type.
    rates = np.array([[4.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    sizes, capacity_ = np.ones(3), np.array([1.0, 1.0])
    x = max_min_allocation(rates, sizes, capacity_)
    assert np.all(x.sum(axis=1) <= 1 + 1e-9) and np.all(x.T @ sizes <= capacity_ + 1e-9)
    proportional = rates @ (capacity_ / capacity_.sum())

    def normalised(allocation: np.ndarray) -> np.ndarray:
        return (rates * allocation).sum(axis=1) / proportional

    least = normalised(x).min()
    rng = np.random.default_rng(0)
    for _ in range(300):  # no feasible allocation has a better least
        other = rng.dirichlet(np.ones(2), size=3) * rng.uniform(0.2, 1.0, size=(3, 1))
        if np.all(other.T @ sizes <= capacity_):
            assert normalised(other).min() <= least + 1e-6
    # Jobs 1 and 2 cannot use type 0 better than type 1, so job 0 has it most of the time,
    # and no GPU is left idle.
    assert x[0, 0] > x[0, 1]
    assert x.T @ sizes == pytest.approx(capacity_)
    # Agnostic (every rate 1): the same fairness, blind to job 0's speed on type 0.
    blind = max_min_allocation(np.ones((3, 2)), sizes, capacity_)
    assert (rates * blind).sum() < (rates * x).sum()


def test_finish_time_fairness_minimises_the_largest_rho() -> None:
    rates = np.array([[4.0, 1.0], [1.0, 1.0], [2.0, 2.0]])
    sizes, capacity_ = np.ones(3), np.array([1.0, 1.0])
    isolated = rates @ (capacity_ / 3)
    left = np.array([4000.0, 1000.0, 2000.0])
    elapsed = np.array([100.0, 0.0, 50.0])
    x = finish_time_allocation(rates, sizes, capacity_, elapsed, np.zeros(3), isolated, left)

    def worst(allocation: np.ndarray) -> float:
        throughput = (rates * allocation).sum(axis=1)
        return float(np.max((elapsed + left / throughput) / (left / isolated)))

    assert np.all(x.sum(axis=1) <= 1 + 1e-9) and np.all(x.T @ sizes <= capacity_ + 1e-9)
    even = np.full((3, 2), 1 / 3)
    assert worst(x) <= worst(even) + 1e-6
    rng = np.random.default_rng(0)
    for _ in range(200):  # no feasible allocation does better
        other = rng.dirichlet(np.ones(2), size=3) * rng.uniform(0.2, 1.0, size=(3, 1))
        if np.all(other.T @ sizes <= capacity_):
            assert worst(x) <= worst(other) + 1e-3


def test_gavels_rounds_share_a_crowded_type_over_time() -> None:
    table = gavel_table()
    cluster = MixedCluster("one", {"v100": 1}, "v100")
    rate = table.rate(RESNET50, "v100", 1)
    jobs = [GavelJob(f"j{i}", 0.0, RESNET50, 1, "team-a", steps=rate * 3 * 3600) for i in range(2)]
    result = simulate_mixed(jobs, GavelPolicy("las"), cluster, table, restart_s=0)
    finishes = sorted(o.finish_s or math.inf for o in result.outcomes)
    # Two jobs of 3 hours on one GPU, time-sliced: both end near 6 hours, not at 3 and 6.
    assert finishes[0] > 5 * 3600 and finishes[1] == pytest.approx(6 * 3600, abs=400)


def test_ffdl_puts_the_job_that_gains_most_on_the_faster_type() -> None:
    table = derived_table(gavel_table())
    cluster = MixedCluster("mix", {"h100": 1, "a100": 1}, "a100")
    transformer, a3c = "Transformer (batch size 64)", "A3C"
    jobs = [
        GavelJob("a3c", 0.0, a3c, 1, "team-a", steps=table.rate(a3c, "a100", 1) * 7200),
        GavelJob(
            "tf", 0.0, transformer, 1, "team-b", steps=table.rate(transformer, "a100", 1) * 7200
        ),
    ]
    views = [
        MixedView(job, 0.0, {}, {}, 0.0, waited_s=0.0, age_s=0.0, running_s=0.0, restarts=0)
        for job in jobs
    ]
    decisions = FfdlMixed().decide(0.0, views, cluster, table)
    assert decisions["tf"].gpus == {"h100": 1} and decisions["a3c"].gpus == {"a100": 1}
    # Told the types are alike, it may put them either way; run both and compare.
    aware = simulate_mixed(jobs, FfdlMixed(), cluster, table)
    blind = simulate_mixed(jobs, FfdlMixed(name="blind", aware=False), cluster, table)
    assert statistics.fmean(aware.jcts()) <= statistics.fmean(blind.jcts())


@pytest.mark.parametrize("cluster_name", list(CLUSTERS))
def test_every_policy_finishes_every_job_within_the_clusters_gpus(cluster_name: str) -> None:
    cluster, table = CLUSTERS[cluster_name]()
    # A short trace: Gavel's jobs at a fiftieth of their length, arriving ten times as fast.
    rate = jobs_per_hour(cluster, table, 2.0) * 10
    jobs = [
        dataclasses.replace(job, steps=job.steps / 50)
        for job in gavel_jobs(table, 16, rate, seed=3, reference=cluster.reference)
    ]
    for name, make in POLICIES.items():
        result = simulate_mixed(jobs, make(), cluster, table)
        assert result.completed == len(jobs), name
        assert max(result.rhos()) >= statistics.median(result.rhos()) > 0
        held = sum(result.gpu_hours_by_tenant().values())
        assert 0 < held <= cluster.total * result.makespan_s / 3600


def test_capacity_counts_each_type_at_its_mean_speed() -> None:
    table = gavel_table()
    assert capacity(MixedCluster("v", {"v100": 10}, "v100"), table) == pytest.approx(10)
    k80 = capacity(MixedCluster("k", {"k80": 10, "v100": 1}, "v100"), table) - 1
    assert 0 < k80 < 10 * 0.5
