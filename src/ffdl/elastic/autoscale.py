"""The autoscaler's decision: which elastic jobs to grow, shrink, start or re-batch now.

Pure glue between a snapshot of elastic jobs and the optimizer, called unchanged by the live
autoscaler loop and by the simulator:

- user-driven sizes win: a job pinned by ``ffdl scale`` or by its ``elastic.schedule`` at its
  current epoch is offered exactly that many GPUs (its range collapses to the pin); a job
  that is held (restarted too recently, or already at its pinned size) keeps its whole
  allocation, batch size included, so it is not restarted for a re-batch either, unless it
  takes a new batch while it runs (``rebatch_in_place``): then only its GPUs are held;
- every other elastic job is sized by ``optimize`` over the GPUs elastic jobs may share
  (``capacity``: the cluster's schedulable GPUs minus those held by non-elastic jobs and
  those reserved for a blocked higher-priority job, which is how elastic jobs shrink to
  admit it instead of being preempted);
- the result is ``diff``'s ordered list of decisions: stops and shrinks before grows and
  starts, so GPUs are freed before they are taken.

On a cluster of several GPU types, ``autoscale_types`` does the same over types
(``ffdl.elastic.by_type``): a job is offered on every type it accepts, but only on its own
type while it is held, and only on its pinned type when ``ffdl scale --gpu-type`` pinned one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ffdl.elastic.by_type import TypedJob, optimize_types
from ffdl.elastic.choices import DEFAULT_GPUS_PER_NODE
from ffdl.elastic.optimizer import ElasticJob, Objective, optimize
from ffdl.elastic.plan import RescaleDecision, diff, diff_types


@dataclass(frozen=True, slots=True)
class Candidate:
    job: ElasticJob
    pinned_gpus: int | None = None  # `ffdl scale` or elastic.schedule; None: the optimizer's
    hold: bool = False  # keep the current GPUs and batch size unchanged


def autoscale(
    candidates: Sequence[Candidate],
    capacity: int,
    *,
    restart_penalty: float = 0.1,
    fixed_batch: bool = False,
    fairness_after_s: float = 600.0,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    restart_cost_s: float | None = None,
    admit_after_s: float | None = None,
    objective: Objective = "throughput",
    turn_s: float | None = None,
) -> list[RescaleDecision]:
    """Decisions for ``candidates`` sharing ``capacity`` GPUs (empty when nothing changes)."""
    if not candidates:
        return []
    jobs = [_pinned(c) for c in candidates]
    plan = optimize(
        jobs,
        max(capacity, 0),
        restart_penalty=restart_penalty,
        fixed_batch=fixed_batch,
        fairness_after_s=fairness_after_s,
        gpus_per_node=gpus_per_node,
        restart_cost_s=restart_cost_s,
        admit_after_s=admit_after_s,
        objective=objective,
        turn_s=turn_s,
    )
    return diff(jobs, plan, gpus_per_node=gpus_per_node)


@dataclass(frozen=True, slots=True)
class TypedCandidate:
    """One job on a cluster of several GPU types: a candidate per type it accepts (first
    choice first), the type it runs on (None: queued) and the type it is pinned to."""

    variants: Mapping[str, Candidate]
    current_type: str | None = None
    pinned_type: str | None = None

    @property
    def home(self) -> Candidate:
        """The candidate on its current type (else its first choice)."""
        own = self.variants.get(self.current_type or "")
        return own if own is not None else next(iter(self.variants.values()))


def autoscale_types(
    candidates: Sequence[TypedCandidate],
    gpus_by_type: Mapping[str, int],
    *,
    restart_penalty: float = 0.1,
    fixed_batch: bool = False,
    fairness_after_s: float = 600.0,
    gpus_per_node: Mapping[str, int],
    restart_cost_s: float | None = None,
    admit_after_s: float | None = None,
    objective: Objective = "throughput",
    turn_s: float | None = None,
) -> list[RescaleDecision]:
    """``autoscale`` over GPU types: decisions that name the type each job runs on."""
    if not candidates:
        return []
    jobs = [_typed(c) for c in candidates]
    plan = optimize_types(
        jobs,
        {t: max(count, 0) for t, count in gpus_by_type.items()},
        restart_penalty=restart_penalty,
        fixed_batch=fixed_batch,
        fairness_after_s=fairness_after_s,
        gpus_per_node=gpus_per_node,
        restart_cost_s=restart_cost_s,
        admit_after_s=admit_after_s,
        objective=objective,
        turn_s=turn_s,
    )
    return diff_types(jobs, plan, gpus_per_node=gpus_per_node)


def _typed(candidate: TypedCandidate) -> TypedJob:
    variants = candidate.variants
    current = candidate.current_type
    held = current is not None and any(c.hold for c in variants.values())
    if held:
        keep: Sequence[str] = [str(current)]
    elif candidate.pinned_type is not None and candidate.pinned_type in variants:
        keep = [candidate.pinned_type]
    else:
        keep = list(variants)
    # Pinned to another type than its own: offered only there, it moves when that type has
    # room (and keeps running where it is until then).
    return TypedJob({t: _pinned(variants[t]) for t in keep}, current)


def _pinned(candidate: Candidate) -> ElasticJob:
    job, pin = candidate.job, candidate.pinned_gpus
    running = job.current_gpus > 0
    if running and (candidate.hold or pin == job.current_gpus):
        current = (job.current_gpus, job.current_gpus)
        if job.rebatch_in_place:
            return replace(job, gpu_range=current)
        batch = job.current_batch or job.base_batch
        return replace(job, gpu_range=current, batch_range=None, base_batch=batch)
    if pin is None or pin <= 0:
        return job
    low, high = job.gpu_range
    size = min(max(pin, low), high)
    size -= size % job.gpus_per_learner
    size = max(size, job.gpus_per_learner)
    return replace(job, gpu_range=(size, size))
