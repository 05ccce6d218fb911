"""One elastic job as the autoscaler offers it to ``autoscale``: its GPU range clamped to
the cluster and to whole learners, its batch range and efficiency reference batch from the
manifest, its per-GPU batch limits, a pin from ``ffdl scale`` or its schedule, and the hold
rule (a job restarted less than ``min_rescale_interval_s`` ago keeps its size).

The live autoscaler loop and the faithful simulator (``ffdl.sim.faithful``) both build
their candidates here, so what the simulator measures is what the platform runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ffdl.core.manifest import ElasticSpec
from ffdl.elastic.autoscale import Candidate
from ffdl.elastic.efficiency import GradientStats
from ffdl.elastic.goodput import GoodputModel
from ffdl.elastic.optimizer import ElasticJob
from ffdl.elastic.plan import apply_schedule
from ffdl.elastic.throughput import ThroughputModel


@dataclass(frozen=True, slots=True, kw_only=True)
class JobState:
    """Where one elastic job stands when the autoscaler looks at it."""

    id: str
    priority: int
    elastic: ElasticSpec
    gpus_per_learner: int
    current_gpus: int  # 0: queued
    current_batch: int | None  # the batch it runs at (None: the reference batch)
    current_nodes: int | None = None  # the machines its gang spans (None: the fewest)
    since_change_s: float  # since its last status change (start, restart, rescale)
    epoch: int | None = None  # the epoch it reported last, for ``elastic.schedule``
    pinned_gpus: int | None = None  # ``ffdl scale``
    age_s: float | None = None  # since it was submitted
    restarts: int = 0  # restarts of a running job since its first start, rescales included


def batch_choice(elastic: ElasticSpec, gpu_cap: int) -> tuple[tuple[int, int] | None, int]:
    """A job's batch range for the optimizer and its efficiency reference batch (``b0``).

    The range is the manifest's, as written: the optimizer itself keeps every GPU's share
    of a batch within the per-GPU limits (at least one sample), so a small batch only rules
    out GPU counts it cannot feed, never the small counts it can. ``b0`` is the batch the
    job starts with (the range's minimum), whatever its GPU range. Without a range the
    batch is not the optimizer's to choose, and ``b0`` is 64 samples per GPU of the cap.
    """
    if elastic.batch_size is None:
        return None, max(64 * gpu_cap, 1)
    return (elastic.batch_size.min, elastic.batch_size.max), elastic.batch_size.min


def elastic_candidate(
    state: JobState,
    *,
    cluster_gpus: int,
    min_rescale_interval_s: float,
    model: ThroughputModel,
    grad_stats: GradientStats | None = None,
    goodput: GoodputModel | None = None,
    gpu_type: str | None = None,
) -> Candidate:
    """``state`` as a candidate for ``autoscale`` on a cluster of ``cluster_gpus`` (GPUs of
    ``gpu_type``, whose per-GPU batch limits it takes)."""
    elastic = state.elastic
    per = max(state.gpus_per_learner, 1)
    low = max(elastic.gpus.min, per)
    low += (-low) % per
    high = max(elastic.gpus.max - elastic.gpus.max % per, low)
    # No job uses more than the cluster, and the optimizer thins a long range to a few
    # choices: thinned over the cluster's sizes, its steps fall where they can be used.
    high = max(min(high, cluster_gpus - cluster_gpus % per), low)
    batch_range, base_batch = batch_choice(elastic, high)
    pinned = state.pinned_gpus
    if pinned is None and elastic.schedule and state.epoch is not None:
        pinned = apply_schedule(
            [{"at_epoch": s.at_epoch, "gpus": s.gpus} for s in elastic.schedule], state.epoch
        )
    gpus = state.current_gpus
    local = elastic.local_batch_for(gpu_type)
    recent = state.since_change_s < min_rescale_interval_s
    hold = bool(gpus) and recent and (pinned is None or pinned == gpus)
    return Candidate(
        job=ElasticJob(
            id=state.id,
            priority=state.priority,
            gpu_range=(low, high),
            batch_range=batch_range,
            base_batch=base_batch,
            gpus_per_learner=per,
            local_batch_range=(
                None if local is None or batch_range is None else (local.min, local.max)
            ),
            accumulate=elastic.accumulate_gradients,
            rebatch_in_place=elastic.rebatch_in_place,
            model=model,
            grad_stats=grad_stats,
            goodput=goodput,
            current_gpus=gpus,
            current_batch=(state.current_batch or base_batch) if gpus else None,
            current_nodes=min(state.current_nodes, gpus) if gpus and state.current_nodes else None,
            waited_s=0.0 if gpus else max(state.since_change_s, 0.0),
            running_s=max(state.since_change_s, 0.0) if gpus else 0.0,
            age_s=None if state.age_s is None else max(state.age_s, 0.0),
            restarts=state.restarts,
        ),
        pinned_gpus=pinned,
        hold=hold,
    )
