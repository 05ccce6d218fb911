"""Turning an optimizer ``Plan`` into rescale decisions people can read, and user schedules.

``diff`` compares a plan with the jobs' current allocations and says, per job that changes,
what happens and what it is expected to gain ("grow 2→4 GPUs, batch 256→512: +38% useful
progress"); ``diff_types`` does the same for a plan over GPU types ("move a100→h100 GPUs
..."). The autoscaler applies the decisions in the order returned (GPUs are freed before
they are taken) and records each reason as the job's event. ``apply_schedule`` resolves a
user-driven ``elastic.schedule`` from the manifest (``[{at_epoch, gpus}, ...]``) at an epoch.
Both are pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from ffdl.elastic.by_type import TypedJob, TypedPlan
from ffdl.elastic.choices import DEFAULT_GPUS_PER_NODE
from ffdl.elastic.optimizer import ElasticJob, Plan, useful_progress

# Decisions that free GPUs come first so that the ones taking GPUs find them free.
_KIND_ORDER = {"stop": 0, "shrink": 1, "rebatch": 2, "grow": 3, "start": 4}


@dataclass(frozen=True, slots=True)
class RescaleDecision:
    """One job's change; ``expected_gain`` is the change in useful samples per second."""

    job_id: str
    from_gpus: int
    to_gpus: int
    from_batch: int | None
    to_batch: int | None
    reason: str
    expected_gain: float
    # A stop that gives the job's GPUs to jobs that waited too long (``Plan.yielded``).
    yielded: bool = False
    # A batch-only change the job takes while it runs (``ElasticJob.rebatch_in_place``).
    in_place: bool = False
    # The GPU type to run on (``diff_types``); None: wherever the scheduler finds room.
    gpu_type: str | None = None


def diff(
    jobs: Sequence[ElasticJob], plan: Plan, *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE
) -> list[RescaleDecision]:
    """The changes ``plan`` makes to ``jobs``: stops, shrinks, re-batches, grows, then starts.

    ``gpus_per_node`` must be the value the plan was computed with (it sets the current
    progress the gain is measured against).
    """
    allocations = {a.job_id: a for a in plan.allocations}
    known = {job.id for job in jobs}
    unknown = sorted(set(allocations) - known)
    if unknown:
        raise ValueError(f"plan allocates jobs that are not in the snapshot: {unknown}")

    ranked: list[tuple[int, int, RescaleDecision]] = []
    for position, job in enumerate(jobs):
        allocation = allocations.get(job.id)
        if allocation is None:
            raise ValueError(f"plan has no allocation for job {job.id}")
        from_batch = job.effective_current_batch if job.running else None
        to_batch = allocation.batch_size if allocation.gpus > 0 else None
        if (job.current_gpus, from_batch) == (allocation.gpus, to_batch):
            continue
        before = (
            useful_progress(job, job.current_gpus, from_batch, gpus_per_node=gpus_per_node)
            if from_batch is not None
            else 0.0
        )
        after = allocation.progress if allocation.gpus > 0 else 0.0
        kind = _kind(job.current_gpus, allocation.gpus)
        yielded = job.id in plan.yielded
        in_place = job.rebatch_in_place and job.current_gpus == allocation.gpus > 0
        reason = _reason(kind, job, from_batch, allocation.gpus, to_batch, before, after)
        if in_place:
            reason = reason.replace(" on ", " in place on ", 1)
        if yielded:
            reason = (
                f"stop {job.current_gpus}→0 GPUs and queue again from the checkpoint: a job "
                "that waited too long needs them"
            )
        decision = RescaleDecision(
            job_id=job.id,
            from_gpus=job.current_gpus,
            to_gpus=allocation.gpus,
            from_batch=from_batch,
            to_batch=to_batch,
            reason=reason,
            expected_gain=after - before,
            yielded=yielded,
            in_place=in_place,
        )
        ranked.append((_KIND_ORDER[kind], position, decision))
    ranked.sort(key=lambda item: (item[0], item[1]))
    return [decision for _, _, decision in ranked]


def diff_types(
    jobs: Sequence[TypedJob], typed: TypedPlan, *, gpus_per_node: Mapping[str, int]
) -> list[RescaleDecision]:
    """``diff`` for a plan over GPU types: every decision names its type, and a running job
    planned on another type moves there (a restart) even at the same size."""
    ranked: list[tuple[int, int, RescaleDecision]] = []
    for position, (job, allocation, kind) in enumerate(
        zip(jobs, typed.plan.allocations, typed.gpu_types, strict=True)
    ):
        home = job.home
        one = Plan(allocations=(allocation,), objective=0.0, changed=())
        if job.id in typed.plan.yielded:
            one = replace(one, yielded=(job.id,))
        per_node = gpus_per_node.get(job.current_type or kind or "", DEFAULT_GPUS_PER_NODE)
        found = diff([home], one, gpus_per_node=per_node)
        moving = home.running and kind is not None and kind != job.current_type
        if moving:
            before = useful_progress(
                home, home.current_gpus, home.effective_current_batch, gpus_per_node=per_node
            )
            after = allocation.progress
            move = f"move {job.current_type}→{kind} GPUs"
            if job.current_type not in job.variants:
                reason = (
                    f"{move} as pinned by ffdl scale --gpu-type "
                    f"({_gpus(allocation.gpus)}, batch {allocation.batch_size})"
                )
            elif found:
                reason = f"{move}, {found[0].reason}"
            else:
                reason = (
                    f"{move} ({_gpus(allocation.gpus)}, batch {allocation.batch_size}): "
                    f"{_percent(after / before - 1.0) if before > 0 else '+'} useful progress"
                )
            base = found[0] if found else None
            found = [
                RescaleDecision(
                    job_id=job.id,
                    from_gpus=home.current_gpus,
                    to_gpus=allocation.gpus,
                    from_batch=home.effective_current_batch,
                    to_batch=allocation.batch_size,
                    reason=reason,
                    expected_gain=after - before,
                    yielded=base.yielded if base else False,
                )
            ]
        for decision in found:
            ranked.append(
                (
                    _KIND_ORDER["grow" if moving else _kind(decision.from_gpus, decision.to_gpus)],
                    position,
                    replace(decision, gpu_type=kind if decision.to_gpus else None),
                )
            )
    ranked.sort(key=lambda item: (item[0], item[1]))
    return [decision for _, _, decision in ranked]


def apply_schedule(schedule_steps: Iterable[Mapping[str, int]], epoch: int) -> int | None:
    """The GPU count a user's ``elastic.schedule`` asks for at ``epoch``, or None.

    Each step is ``{"at_epoch": E, "gpus": N}``: from epoch ``E`` on, run with ``N`` GPUs,
    until a later step takes over. Before the first step the schedule says nothing (None).
    """
    if epoch < 0:
        raise ValueError("epoch must be >= 0")
    best_epoch = -1
    gpus: int | None = None
    seen: set[int] = set()
    for index, step in enumerate(schedule_steps):
        try:
            at_epoch, count = int(step["at_epoch"]), int(step["gpus"])
        except KeyError as missing:
            raise ValueError(f"elastic.schedule[{index}] lacks {missing}") from None
        if at_epoch < 0 or count < 1:
            raise ValueError(f"elastic.schedule[{index}]: need at_epoch >= 0 and gpus >= 1")
        if at_epoch in seen:
            raise ValueError(f"elastic.schedule[{index}]: epoch {at_epoch} appears twice")
        seen.add(at_epoch)
        if best_epoch < at_epoch <= epoch:
            best_epoch, gpus = at_epoch, count
    return gpus


def _kind(from_gpus: int, to_gpus: int) -> str:
    if from_gpus == 0:
        return "start"
    if to_gpus == 0:
        return "stop"
    if to_gpus > from_gpus:
        return "grow"
    if to_gpus < from_gpus:
        return "shrink"
    return "rebatch"


def _reason(
    kind: str,
    job: ElasticJob,
    from_batch: int | None,
    to_gpus: int,
    to_batch: int | None,
    before: float,
    after: float,
) -> str:
    if kind == "start":
        text = f"start on {_gpus(to_gpus)}, batch {to_batch}: {after:,.0f} useful samples/s"
    elif kind == "stop":
        text = f"stop {job.current_gpus}→0 GPUs: the cluster cannot hold every running job"
    else:
        batch = (
            f"batch {from_batch}" if from_batch == to_batch else f"batch {from_batch}→{to_batch}"
        )
        if kind == "rebatch":
            text = f"rebatch {from_batch}→{to_batch} on {_gpus(to_gpus)}"
        else:
            text = f"{kind} {job.current_gpus}→{to_gpus} GPUs, {batch}"
        text += f": {_percent(after / before - 1.0)} useful progress"
    if job.remaining_samples is not None and after > 0:
        eta = f"done in ~{_duration(job.remaining_samples / after)}"
        if before > 0:
            eta += f" instead of ~{_duration(job.remaining_samples / before)}"
        text += f"; {eta}"
    return text


def _gpus(count: int) -> str:
    return "1 GPU" if count == 1 else f"{count} GPUs"


def _percent(fraction: float) -> str:
    return f"{fraction:+.0%}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
