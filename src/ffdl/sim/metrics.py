"""What a simulation run measured: per-job outcomes, time series, and the summary numbers.

Definitions used in every table and plot:

- **JCT** (job completion time): finish minus submission, over jobs that completed.
- **Queueing delay**: first start minus submission, over jobs that started.
- **Makespan**: last completion minus first submission.
- **Utilisation**: GPUs *held* (placed learners, including partial gangs and jobs halting)
  and GPUs *running* (jobs whose whole gang runs), integrated over time and divided by the
  cluster's GPU-seconds between the first submission and the end of the run.
- **Fragmentation**: free GPUs that no waiting job can use. A waiting job whose whole gang
  fits on what is free (same placement rules as the scheduler) can use the free GPUs of
  every node with room for one of its learners; the free GPUs on all other nodes are
  fragmented. Zero when nothing waits.
- **Restarts**: checkpoint-restarts of running jobs (preemptions and rescales).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ffdl.scheduler.free import CapacityView, NodeFree, node_slots
from ffdl.scheduler.placement import effective_policy, find_nodes
from ffdl.scheduler.snapshot import QueuedJob

# Distinct job shapes looked at when measuring fragmentation (the queue's first ones).
FRAGMENTATION_SHAPES = 32


@dataclass(frozen=True, slots=True)
class JobOutcome:
    id: str
    submit_s: float
    first_start_s: float | None
    finish_s: float | None
    gpus: int
    restarts: int
    preemptions: int
    rejected: bool = False

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.submit_s

    @property
    def queueing_s(self) -> float | None:
        return None if self.first_start_s is None else self.first_start_s - self.submit_s


@dataclass(slots=True)
class Series:
    """Samples over virtual time (seconds since the first submission)."""

    times: list[float] = field(default_factory=list)
    held_gpus: list[int] = field(default_factory=list)
    running_gpus: list[int] = field(default_factory=list)
    queued_jobs: list[int] = field(default_factory=list)
    fragmented_gpus: list[int] = field(default_factory=list)

    def add(self, at: float, held: int, running: int, queued: int, fragmented: int) -> None:
        self.times.append(at)
        self.held_gpus.append(held)
        self.running_gpus.append(running)
        self.queued_jobs.append(queued)
        self.fragmented_gpus.append(fragmented)


@dataclass(slots=True)
class SimResult:
    label: str
    policy: str
    cluster_gpus: int
    nodes: int
    outcomes: list[JobOutcome]
    series: Series
    start_s: float
    end_s: float
    held_gpu_seconds: float
    running_gpu_seconds: float
    wall_s: float = 0.0
    passes: int = 0
    scheduler_calls: int = 0
    autoscale_calls: int = 0
    horizon_s: float | None = None

    def summary(self) -> dict[str, float]:
        """The headline numbers (times in seconds, utilisation as a fraction)."""
        submitted = [o for o in self.outcomes if not o.rejected]
        completed = [o for o in submitted if o.finish_s is not None]
        jcts = [o.jct_s for o in completed if o.jct_s is not None]
        waits = [o.queueing_s for o in submitted if o.queueing_s is not None]
        span = max(self.end_s - self.start_s, 0.0)
        capacity = self.cluster_gpus * span
        finishes = [o.finish_s for o in completed if o.finish_s is not None]
        return {
            "jobs": float(len(self.outcomes)),
            "rejected": float(len(self.outcomes) - len(submitted)),
            "completed": float(len(completed)),
            "unfinished": float(len(submitted) - len(completed)),
            "avg_jct_s": _mean(jcts),
            "p50_jct_s": percentile(jcts, 50),
            "p99_jct_s": percentile(jcts, 99),
            "avg_queueing_s": _mean(waits),
            "p99_queueing_s": percentile(waits, 99),
            "makespan_s": (max(finishes) - self.start_s) if finishes else math.nan,
            "held_utilisation": self.held_gpu_seconds / capacity if capacity else math.nan,
            "running_utilisation": self.running_gpu_seconds / capacity if capacity else math.nan,
            "avg_fragmented_gpus": _mean([float(v) for v in self.series.fragmented_gpus]),
            "restarts": float(sum(o.restarts for o in self.outcomes)),
            "preemptions": float(sum(o.preemptions for o in self.outcomes)),
            "wall_s": self.wall_s,
            "scheduler_calls": float(self.scheduler_calls),
            "autoscale_calls": float(self.autoscale_calls),
        }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile by linear interpolation (NaN for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def fragmented_gpus(
    free: dict[str, NodeFree], waiting: Iterable[QueuedJob], default_placement: str
) -> int:
    """Free GPUs that no waiting job can use (see the module docstring)."""
    view = CapacityView(
        {name: NodeFree(f.node, f.gpus, f.cpus, f.memory_mb) for name, f in free.items()}
    )
    free_total = sum(max(f.gpus, 0) for f in view.free.values() if f.node.schedulable)
    if free_total == 0:
        return 0
    usable: set[str] = set()
    seen: set[tuple[object, ...]] = set()
    any_waiting = False
    for job in waiting:
        any_waiting = True
        shape = (
            job.per_learner,
            job.learners,
            job.gpu_types,
            job.mix_gpu_types,
            job.same_label,
            job.placement_policy,
        )
        if shape in seen:
            continue
        seen.add(shape)
        if len(seen) > FRAGMENTATION_SHAPES:
            break
        if find_nodes(view, job, effective_policy(job, default_placement)) is None:
            continue
        for name, item in view.free.items():
            if item.node.schedulable and node_slots(item, job.per_learner) > 0:
                usable.add(name)
    if not any_waiting:
        return 0
    return sum(
        max(item.gpus, 0)
        for name, item in view.free.items()
        if item.node.schedulable and name not in usable
    )
