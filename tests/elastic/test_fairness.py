"""Fairness between tenants in the elastic objective: entitlements weighted by quota, the
weights each setting gives, the finish-time fairness estimate, and what the optimizer does
with them."""

from __future__ import annotations

import pytest

from ffdl.elastic.autoscale import Candidate, autoscale
from ffdl.elastic.fairness import (
    FairJob,
    JobFacts,
    entitlements,
    finish_time_fairness,
    share_weights,
    weigh,
)
from ffdl.elastic.optimizer import ElasticJob
from ffdl.elastic.throughput import ThroughputModel

# Compute only: a step's time is all per-sample work, so speed-up grows with GPUs.
LINEAR = ThroughputModel(alpha=0.0, beta=0.01, gamma=0.0, delta=0.0)


def elastic(job_id: str, gpus: int = 0) -> ElasticJob:
    return ElasticJob(
        id=job_id,
        priority=50,
        gpu_range=(1, 6),
        batch_range=None,
        base_batch=64,
        model=LINEAR,
        current_gpus=gpus,
        age_s=3600.0,
        running_s=3600.0 if gpus else 0.0,
    )


def test_entitlements_follow_quotas_and_a_tenant_without_one_counts_the_mean() -> None:
    assert entitlements(["a", "b"], {}) == {"a": 0.5, "b": 0.5}
    assert entitlements(["a", "b"], {"a": 6, "b": 2}) == {"a": 0.75, "b": 0.25}
    # c has no quota: it counts the mean of the others' (4).
    assert entitlements(["a", "b", "c"], {"a": 6, "b": 2, "c": None}) == pytest.approx(
        {"a": 0.5, "b": 1 / 6, "c": 1 / 3}
    )


def test_without_fairness_every_job_weighs_alike() -> None:
    jobs = [FairJob("a1", "a", 2.0, None), FairJob("b1", "b", 0.0, None)]
    assert share_weights(jobs, {}, "none") == {"a1": 1.0, "b1": 1.0}


def test_max_min_gives_a_tenant_its_entitlement_whatever_its_number_of_jobs() -> None:
    # a runs two jobs, b one, all scaling alike: only the split of entitlements counts.
    jobs = [
        FairJob("a1", "a", 1.0, None, 1),
        FairJob("a2", "a", 1.0, None, 1),
        FairJob("b1", "b", 2.0, None, 2),
    ]
    weights = share_weights(jobs, {}, "max_min")
    assert weights["a1"] == pytest.approx(weights["a2"])
    assert weights["b1"] == pytest.approx(2 * weights["a1"])
    assert sum(weights.values()) == pytest.approx(3.0)
    # With quotas, in their proportion: b's quota is three times a's.
    weighted = share_weights(jobs, {"a": 2, "b": 6}, "max_min")
    assert weighted["b1"] == pytest.approx(6 * weighted["a1"])


def test_max_min_raises_a_tenant_whose_jobs_turn_gpus_into_less_progress() -> None:
    # a: a speed-up of 4 on 4 GPUs; b: 1 on 2 GPUs, half as much per GPU.
    weights = share_weights(
        [FairJob("a1", "a", 4.0, None, 4), FairJob("b1", "b", 1.0, None, 2)], {}, "max_min"
    )
    assert weights["b1"] / weights["a1"] == pytest.approx(2.0)
    # A tenant with nothing running yet counts as scaling as well as the others.
    waiting = share_weights(
        [FairJob("a1", "a", 4.0, None, 4), FairJob("b1", "b", 0.0, None, 0)], {}, "max_min"
    )
    assert waiting["b1"] == pytest.approx(waiting["a1"])


def test_finish_time_weighs_the_jobs_furthest_behind_an_equal_share() -> None:
    jobs = [
        FairJob("ahead", "a", 2.0, 0.5),
        FairJob("even", "a", 1.0, 1.0),
        FairJob("behind", "b", 1.0, 3.0),
        FairJob("nothing-yet", "b", 0.0, None),
    ]
    weights = share_weights(jobs, {}, "finish_time")
    assert weights["ahead"] < weights["even"] < weights["behind"] < weights["nothing-yet"]
    assert finish_time_fairness(age_s=100.0, samples_done=500.0, fair_rate=10.0) == 2.0
    assert finish_time_fairness(age_s=100.0, samples_done=0.0, fair_rate=10.0) is None


def test_a_bad_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="max_min"):
        share_weights([FairJob("a1", "a", 1.0, None)], {}, "fastest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="share_weight"):
        ElasticJob(
            id="x", priority=0, gpu_range=(1, 2), batch_range=None, base_batch=1,
            model=LINEAR, share_weight=0.0,
        )  # fmt: skip


def test_under_max_min_a_tenant_with_one_job_gets_as_many_gpus_as_one_with_two() -> None:
    candidates = [
        Candidate(elastic("a1", 2)),
        Candidate(elastic("a2", 2)),
        Candidate(elastic("b1", 2)),
    ]
    facts = {
        "a1": JobFacts("a", 3600.0, 1e6),
        "a2": JobFacts("a", 3600.0, 1e6),
        "b1": JobFacts("b", 3600.0, 1e6),
    }

    def gpus_of(mode: str) -> dict[str, int]:
        weighed, _ = weigh(candidates, facts, {}, mode, 6)  # type: ignore[arg-type]
        sizes = {c.job.id: c.job.current_gpus for c in weighed}
        for decision in autoscale(weighed, 6, objective="proportional", restart_penalty=0.0):
            sizes[decision.job_id] = decision.to_gpus
        return sizes

    assert gpus_of("none") == {"a1": 2, "a2": 2, "b1": 2}
    shared = gpus_of("max_min")
    assert shared["b1"] == 3 and shared["a1"] + shared["a2"] == 3


def test_weigh_says_every_jobs_rho_from_its_work_and_an_equal_share() -> None:
    candidates = [Candidate(elastic("a1", 2)), Candidate(elastic("b1"))]
    facts = {"a1": JobFacts("a", 600.0, 3000.0), "b1": JobFacts("b", 60.0, 0.0)}
    _, rhos = weigh(candidates, facts, {}, "none", 8)
    # An equal share is 4 GPUs: 4 x 100 samples/s; 3,000 samples would have taken 7.5 s.
    assert rhos["a1"] == pytest.approx(600.0 / 7.5)
    assert rhos["b1"] is None
