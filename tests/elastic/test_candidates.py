"""A job as the autoscaler offers it to ``autoscale`` (``elastic_candidate``): the live loop
and the faithful simulator build candidates with this one function."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ffdl.core.manifest import ElasticSpec, IntRange, ScheduleStep
from ffdl.elastic.autoscale import Candidate
from ffdl.elastic.candidates import JobState, elastic_candidate
from ffdl.elastic.throughput import prior


def spec(**changes: object) -> ElasticSpec:
    fields: dict[str, object] = {
        "gpus": IntRange(min=1, max=64),
        "batch_size": IntRange(min=8, max=512),
        "local_batch_size": IntRange(min=4, max=8),
    }
    fields.update(changes)
    return ElasticSpec.model_validate(fields)


BASE = JobState(
    id="j",
    priority=0,
    elastic=spec(),
    gpus_per_learner=1,
    current_gpus=0,
    current_batch=None,
    since_change_s=30.0,
)


def state(**changes: Any) -> JobState:
    return replace(BASE, **changes)


def candidate(job: JobState, cluster: int = 64, hold_s: float = 120.0) -> Candidate:
    return elastic_candidate(
        job, cluster_gpus=cluster, min_rescale_interval_s=hold_s, model=prior()
    )


def test_the_manifests_ranges_reach_the_optimizer_clamped_to_the_cluster() -> None:
    made = candidate(state(), cluster=48)
    assert made.job.gpu_range == (1, 48)
    assert made.job.batch_range == (8, 512) and made.job.base_batch == 8
    assert made.job.local_batch_range == (4, 8)
    assert made.job.waited_s == 30.0 and made.job.current_batch is None
    assert made.job.running_s == 0.0
    assert not made.hold


def test_the_jobs_age_and_restarts_reach_the_optimizer() -> None:
    assert candidate(state()).job.age_s is None
    made = candidate(state(current_gpus=4, age_s=900.0, restarts=2))
    assert (made.job.age_s, made.job.restarts) == (900.0, 2)
    # A clock a moment behind the submission stamp is no negative age.
    assert candidate(state(age_s=-0.5)).job.age_s == 0.0


def test_the_machines_a_running_gang_spans_reach_the_optimizer() -> None:
    assert candidate(state(current_gpus=4, current_nodes=2)).job.current_nodes == 2
    # A queued job spans nothing, whatever it spanned before.
    assert candidate(state(current_nodes=2)).job.current_nodes is None


def test_gangs_of_two_gpus_get_ranges_in_whole_learners() -> None:
    made = candidate(state(elastic=spec(gpus=IntRange(min=3, max=63)), gpus_per_learner=2))
    assert made.job.gpu_range == (4, 62)


def test_a_job_restarted_within_the_interval_is_held_unless_pinned_elsewhere() -> None:
    running = state(current_gpus=4, current_batch=32, since_change_s=60.0)
    assert candidate(running).hold
    assert candidate(running).job.current_batch == 32 and candidate(running).job.waited_s == 0
    assert candidate(running).job.running_s == 60.0, "its turn so far, for the bounded wait"
    assert not candidate(running, hold_s=30.0).hold
    assert not candidate(state(current_gpus=4, since_change_s=60.0, pinned_gpus=8)).hold
    assert candidate(state(current_gpus=4, since_change_s=60.0, pinned_gpus=4)).hold


def test_a_schedule_pins_the_size_for_the_epoch_reached() -> None:
    steps = [ScheduleStep(at_epoch=0, gpus=2), ScheduleStep(at_epoch=3, gpus=6)]
    made = candidate(state(elastic=spec(schedule=steps), epoch=4))
    assert made.pinned_gpus == 6
    assert candidate(state(elastic=spec(schedule=steps), epoch=4, pinned_gpus=1)).pinned_gpus == 1


def test_a_candidate_on_a_gpu_type_takes_that_types_batch_limits() -> None:
    limits = {"min": 4, "max": 8, "h100": {"min": 8, "max": 32}}
    job = state(elastic=spec(local_batch_size=limits))
    on_h100 = elastic_candidate(
        job, cluster_gpus=64, min_rescale_interval_s=120.0, model=prior(), gpu_type="h100"
    )
    on_a100 = elastic_candidate(
        job, cluster_gpus=64, min_rescale_interval_s=120.0, model=prior(), gpu_type="a100"
    )
    assert on_h100.job.local_batch_range == (8, 32)
    assert on_a100.job.local_batch_range == (4, 8) == candidate(job).job.local_batch_range
