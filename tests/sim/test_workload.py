"""Synthetic workloads: seeded, offering the load asked for, with the documented families."""

from __future__ import annotations

import itertools
import random

import pytest

from ffdl.sim.workload import (
    FAMILIES,
    Discrete,
    SyntheticSpec,
    offered_load,
    synthetic,
    talk_cpus_per_learner,
)


def test_same_seed_same_jobs_and_arrivals_are_poisson_at_the_offered_load() -> None:
    spec = SyntheticSpec(jobs=3000, load=0.7, seed=5)
    jobs = synthetic(spec, cluster_gpus=64, gpus_per_node=4)
    assert jobs == synthetic(spec, cluster_gpus=64, gpus_per_node=4)
    assert jobs != synthetic(
        SyntheticSpec(jobs=3000, load=0.7, seed=6), cluster_gpus=64, gpus_per_node=4
    )
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
    assert offered_load(jobs, 64, 4) == pytest.approx(0.7, rel=0.08)
    gaps = [b.submit_s - a.submit_s for a, b in itertools.pairwise(jobs)]
    mean = sum(gaps) / len(gaps)
    # Exponential gaps: the standard deviation equals the mean.
    std = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert std == pytest.approx(mean, rel=0.1)


def test_run_time_at_the_requested_size_is_in_the_asked_range() -> None:
    spec = SyntheticSpec(jobs=500, seed=2, duration_s=(600.0, 7200.0))
    for job in synthetic(spec, cluster_gpus=64, gpus_per_node=4):
        assert 600.0 - 1e-6 <= job.run_time_s(4) <= 7200.0 + 1e-6
        assert job.expected_duration_s == pytest.approx(job.run_time_s(4))


def test_the_talks_distributions_have_the_talks_averages() -> None:
    assert Discrete(tuple(range(1, 9))).mean == 4.5
    assert Discrete((1, 2, 3, 4)).mean == 2.5
    cpus = talk_cpus_per_learner()
    assert cpus.mean == pytest.approx(5.0, abs=0.01)
    rng = random.Random(1)
    draws = [cpus.draw(rng) for _ in range(20000)]
    assert min(draws) == 4 and max(draws) <= 16
    assert sum(draws) / len(draws) == pytest.approx(5.0, abs=0.05)


def test_elastic_ranges_are_whole_learners_up_to_the_factor() -> None:
    spec = SyntheticSpec(jobs=200, seed=3, elastic=True, elastic_max_factor=2)
    for job in synthetic(spec, cluster_gpus=16, gpus_per_node=4):
        assert job.elastic_gpus is not None
        low, high = job.elastic_gpus
        assert low == job.per_learner.gpus
        assert high % job.per_learner.gpus == 0 and high <= min(2 * job.gpus, 16)


def test_families_scale_as_documented() -> None:
    resnet, bert, small = FAMILIES["resnet-like"], FAMILIES["bert-like"], FAMILIES["small-cnn"]
    # At its own batch, bert-like barely gains from 8 GPUs; with a larger batch it does.
    assert bert.rate(8, 64, 1) / bert.rate(1, 64, 1) < 2.5
    assert bert.rate(8, 512, 1) / bert.rate(1, 64, 1) > 5
    # Resnet-like scales well at its own batch; crossing nodes costs it.
    assert resnet.rate(8, 256, 1) / resnet.rate(1, 256, 1) > 3.5
    assert resnet.rate(8, 256, 2) < resnet.rate(8, 256, 1)
    # Small-cnn is dominated by synchronisation.
    assert small.rate(8, 128, 1) < small.rate(1, 128, 1)
    assert FAMILIES["fixed"].rate(8, 1, 3) == 1.0


def test_bad_specs_are_refused() -> None:
    with pytest.raises(ValueError):
        SyntheticSpec(jobs=0)
    with pytest.raises(ValueError):
        SyntheticSpec(load=0)
    with pytest.raises(ValueError):
        Discrete(())
    with pytest.raises(ValueError):
        synthetic(SyntheticSpec(), cluster_gpus=0, gpus_per_node=4)
