"""Readable rescale decisions from a plan, and user-driven elastic schedules."""

from __future__ import annotations

import re

import pytest

from ffdl.elastic.optimizer import Allocation, ElasticJob, Plan, optimize, useful_progress
from ffdl.elastic.plan import RescaleDecision, apply_schedule, diff
from ffdl.elastic.throughput import ThroughputModel


def make_job(job_id: str, **overrides: object) -> ElasticJob:
    fields: dict[str, object] = {
        "id": job_id,
        "priority": 50,
        "gpu_range": (1, 8),
        "batch_range": (64, 1024),
        "base_batch": 256,
        "model": ThroughputModel.prior(),
    }
    fields.update(overrides)
    return ElasticJob(**fields)  # type: ignore[arg-type]


def plan_for(jobs: list[ElasticJob], targets: dict[str, tuple[int, int | None]]) -> Plan:
    allocations = []
    for job in jobs:
        current_batch = job.effective_current_batch if job.running else None
        gpus, batch = targets.get(job.id, (job.current_gpus, current_batch))
        progress = useful_progress(job, gpus, batch) if gpus and batch else 0.0
        allocations.append(Allocation(job.id, gpus, batch if gpus else None, progress))
    return Plan(allocations=tuple(allocations), objective=0.0, changed=())


def test_a_grow_says_what_changes_and_what_it_gains() -> None:
    job = make_job("training-grow", current_gpus=2, current_batch=256)
    [decision] = diff([job], plan_for([job], {"training-grow": (4, 512)}))
    before = useful_progress(job, 2, 256)
    after = useful_progress(job, 4, 512)
    gain = round((after / before - 1) * 100)
    assert decision == RescaleDecision(
        job_id="training-grow",
        from_gpus=2,
        to_gpus=4,
        from_batch=256,
        to_batch=512,
        reason=f"grow 2→4 GPUs, batch 256→512: +{gain}% useful progress",
        expected_gain=pytest.approx(after - before),  # type: ignore[arg-type]
    )


def test_every_kind_of_change_is_named_and_gpus_are_freed_first() -> None:
    jobs = [
        make_job("training-start"),
        make_job("training-grow", current_gpus=2),
        make_job("training-same", current_gpus=2),
        make_job("training-rebatch", current_gpus=2),
        make_job("training-shrink", current_gpus=4),
        make_job("training-stop", current_gpus=1),
    ]
    plan = plan_for(
        jobs,
        {
            "training-start": (2, 512),
            "training-grow": (4, 256),
            "training-rebatch": (2, 1024),
            "training-shrink": (2, 256),
            "training-stop": (0, None),
        },
    )
    decisions = diff(jobs, plan)
    assert [d.job_id for d in decisions] == [
        "training-stop",
        "training-shrink",
        "training-rebatch",
        "training-grow",
        "training-start",
    ]
    reasons = {d.job_id: d.reason for d in decisions}
    assert reasons["training-stop"].startswith("stop 1→0 GPUs")
    assert re.fullmatch(
        r"shrink 4→2 GPUs, batch 256: -\d+% useful progress", reasons["training-shrink"]
    )
    assert re.fullmatch(
        r"rebatch 256→1024 on 2 GPUs: [+-]\d+% useful progress", reasons["training-rebatch"]
    )
    assert re.fullmatch(
        r"grow 2→4 GPUs, batch 256: \+\d+% useful progress", reasons["training-grow"]
    )
    assert re.fullmatch(
        r"start on 2 GPUs, batch 512: [\d,]+ useful samples/s", reasons["training-start"]
    )
    gains = {d.job_id: d.expected_gain for d in decisions}
    assert gains["training-shrink"] < 0 < gains["training-grow"]
    assert gains["training-stop"] == pytest.approx(-useful_progress(jobs[5], 1, 256))


def test_known_remaining_work_adds_an_eta() -> None:
    job = make_job("training-eta", current_gpus=1, remaining_samples=3_600_000.0)
    [decision] = diff([job], plan_for([job], {"training-eta": (8, 1024)}))
    assert re.search(
        r"; done in ~[\d.]+ (s|min|h|d) instead of ~[\d.]+ (s|min|h|d)$", decision.reason
    )


def test_a_plan_that_changes_nothing_yields_no_decisions() -> None:
    jobs = [make_job("training-a", current_gpus=2), make_job("training-b")]
    assert diff(jobs, plan_for(jobs, {})) == []


def test_diff_agrees_with_the_optimizer_on_what_changed() -> None:
    jobs = [
        make_job("training-a", current_gpus=1, current_batch=64),
        make_job("training-b", current_gpus=4, gpu_range=(2, 8), priority=0),
        make_job("training-c", waited_s=5000.0),
    ]
    plan = optimize(jobs, 8)
    decisions = diff(jobs, plan)
    rescaled = {d.job_id for d in decisions if d.from_gpus > 0}
    assert rescaled == set(plan.changed)
    assert sum(d.to_gpus for d in decisions) <= 8


def test_a_plan_that_does_not_match_the_jobs_is_rejected() -> None:
    jobs = [make_job("training-a")]
    with pytest.raises(ValueError):
        diff(jobs, Plan(allocations=(), objective=0.0, changed=()))
    stranger = Allocation("training-x", 1, 64, 1.0)
    with pytest.raises(ValueError):
        diff(jobs, Plan(allocations=(stranger,), objective=0.0, changed=()))


SCHEDULE = [{"at_epoch": 30, "gpus": 4}, {"at_epoch": 0, "gpus": 1}, {"at_epoch": 60, "gpus": 8}]


@pytest.mark.parametrize(("epoch", "gpus"), [(0, 1), (29, 1), (30, 4), (59, 4), (60, 8), (1000, 8)])
def test_the_latest_schedule_step_reached_applies(epoch: int, gpus: int) -> None:
    assert apply_schedule(SCHEDULE, epoch) == gpus


def test_before_the_first_step_the_schedule_says_nothing() -> None:
    assert apply_schedule([{"at_epoch": 10, "gpus": 2}], 9) is None
    assert apply_schedule([], 5) is None


@pytest.mark.parametrize(
    "steps",
    [
        [{"gpus": 2}],
        [{"at_epoch": 1}],
        [{"at_epoch": -1, "gpus": 2}],
        [{"at_epoch": 1, "gpus": 0}],
        [{"at_epoch": 1, "gpus": 2}, {"at_epoch": 1, "gpus": 4}],
    ],
)
def test_malformed_schedules_are_rejected(steps: list[dict[str, int]]) -> None:
    with pytest.raises(ValueError):
        apply_schedule(steps, 5)
