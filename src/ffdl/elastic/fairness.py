"""Fairness between tenants as part of the elastic objective: weights for the optimizer's
jobs, and the finish-time fairness estimate every elastic job shows.

The optimizer maximises a weighted sum over jobs (``ffdl.elastic.optimizer``); with the
proportional objective, GPUs go to jobs roughly in proportion to their weights. The
operator's ``tenant_fairness`` setting chooses what those weights say beyond priority:

``none``
    Every job weighs by its priority alone (the platform's default): a tenant with more
    jobs gets more GPUs.
``max_min``
    Max-min fairness of normalised throughput across tenants, weighted by their quota. A
    tenant's entitlement ``e_i`` is its ``max_gpus`` over the sum of the active tenants'
    (a tenant without a quota counts the mean of those that have one, or 1 when none do),
    split evenly over its jobs (``e_i / n_i``), so that a tenant's jobs together weigh its
    entitlement. Under the proportional objective a job's GPUs come out in proportion to
    its weight, whatever its speed-up, so with jobs whose speed-up grows in proportion to
    their GPUs each tenant gets its entitlement and all have the same normalised
    throughput (speed-ups summed over the tenant, divided by ``e_i``). Where a tenant's jobs
    turn GPUs into less progress (its speed-ups per GPU held, ``eff_i``, below the mean),
    its weights are raised by ``mean eff / eff_i`` and those of tenants above it lowered
    alike, within ``[1/2, 2]``, so that its normalised throughput catches up (a tenant with
    nothing running counts the mean). The correction is a property of how the jobs scale,
    not of how many GPUs they hold now, so it does not swing from pass to pass.
``finish_time``
    Finish-time fairness (Themis): a job's ``rho`` is the time it has spent in the cluster
    over the time the work it has done would have taken on an equal share of the cluster
    (``1/N`` of its GPUs for ``N`` elastic jobs). A job behind its share (``rho`` above the
    median) weighs more, ``rho / median``, within ``[1/4, 4]``; a job that has done no work
    yet has an unbounded ``rho`` and gets the 4.

Weights are normalised to a mean of 1. ``weigh`` applies them to the autoscaler's
candidates and says every job's ``rho``. All functions are pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, TypeVar, get_args

from ffdl.elastic.autoscale import Candidate, TypedCandidate
from ffdl.elastic.optimizer import ElasticJob, useful_progress

TenantFairness = Literal["none", "max_min", "finish_time"]
TENANT_FAIRNESS: tuple[TenantFairness, ...] = get_args(TenantFairness)

_MAX_MIN_BOUNDS = (0.5, 2.0)
_FINISH_TIME_BOUNDS = (0.25, 4.0)


@dataclass(frozen=True, slots=True)
class FairJob:
    """One elastic job as fairness sees it: its tenant, its speed-up now over one GPU (0
    while queued), the GPUs it holds and its finish-time fairness so far (None: no work
    done yet)."""

    id: str
    tenant: str
    speedup: float
    rho: float | None
    gpus: int = 0


def entitlements(tenants: Iterable[str], quotas: Mapping[str, int | None]) -> dict[str, float]:
    """Each tenant's share of the cluster (summing to 1), weighted by its ``max_gpus``."""
    active = sorted(set(tenants))
    given = [float(q) for t in active if (q := quotas.get(t)) is not None and q > 0]
    default = statistics.fmean(given) if given else 1.0
    raw = {t: float(quotas.get(t) or 0) or default for t in active}
    total = sum(raw.values())
    return {t: value / total for t, value in raw.items()}


def finish_time_fairness(age_s: float, samples_done: float, fair_rate: float) -> float | None:
    """``rho``: ``age_s`` in the cluster over the time ``samples_done`` would have taken at
    ``fair_rate`` samples/s (its rate on an equal share); None before it has done any."""
    if samples_done <= 0 or fair_rate <= 0:
        return None
    return max(age_s, 0.0) * fair_rate / samples_done


def share_weights(
    jobs: Sequence[FairJob],
    quotas: Mapping[str, int | None],
    mode: TenantFairness,
) -> dict[str, float]:
    """Each job's weight under ``mode`` (see the module docstring), a mean of 1."""
    if mode not in TENANT_FAIRNESS:
        raise ValueError(f"tenant fairness must be one of {', '.join(TENANT_FAIRNESS)}")
    if not jobs or mode == "none":
        return {job.id: 1.0 for job in jobs}
    raw = _max_min(jobs, quotas) if mode == "max_min" else _finish_time(jobs)
    mean = statistics.fmean(raw.values())
    return {job_id: weight / mean for job_id, weight in raw.items()}


def _max_min(jobs: Sequence[FairJob], quotas: Mapping[str, int | None]) -> dict[str, float]:
    share = entitlements((job.tenant for job in jobs), quotas)
    count: dict[str, int] = {}
    speedups: dict[str, float] = {}
    held: dict[str, int] = {}
    for job in jobs:
        count[job.tenant] = count.get(job.tenant, 0) + 1
        if job.gpus > 0:
            speedups[job.tenant] = speedups.get(job.tenant, 0.0) + max(job.speedup, 0.0)
            held[job.tenant] = held.get(job.tenant, 0) + job.gpus
    efficiency = {t: speedups[t] / held[t] for t in held}
    mean = statistics.fmean(efficiency.values()) if efficiency else 1.0
    low, high = _MAX_MIN_BOUNDS
    correction = {
        t: min(max(mean / efficiency[t], low), high) if efficiency.get(t, 0) > 0 else 1.0
        for t in share
    }
    return {job.id: share[job.tenant] / count[job.tenant] * correction[job.tenant] for job in jobs}


def _finish_time(jobs: Sequence[FairJob]) -> dict[str, float]:
    known = [job.rho for job in jobs if job.rho is not None and job.rho > 0]
    median = statistics.median(known) if known else 1.0
    low, high = _FINISH_TIME_BOUNDS
    return {
        job.id: high if job.rho is None else min(max(job.rho / median, low), high) for job in jobs
    }


AnyCandidate = TypeVar("AnyCandidate", Candidate, TypedCandidate)


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What fairness needs of a job beyond its candidate: its tenant, seconds since it was
    submitted and the samples it has processed (its last report's cumulative count)."""

    tenant: str
    age_s: float
    samples_done: float


def weigh(
    candidates: Sequence[AnyCandidate],
    facts: Mapping[str, JobFacts],
    quotas: Mapping[str, int | None],
    mode: TenantFairness,
    cluster_gpus: int,
) -> tuple[list[AnyCandidate], dict[str, float | None]]:
    """``candidates`` with their ``share_weight`` set for ``mode``, and every job's ``rho``
    (an equal share being ``cluster_gpus`` over the number of candidates)."""
    homes = [_home(candidate) for candidate in candidates]
    fair_gpus = max(cluster_gpus // max(len(candidates), 1), 1)
    rhos: dict[str, float | None] = {}
    fair: list[FairJob] = []
    for job in homes:
        known = facts.get(job.id)
        if known is None:
            continue
        low, high = job.gpu_range
        share = min(max(fair_gpus - fair_gpus % job.gpus_per_learner, low), high)
        rate = useful_progress(job, share, job.base_batch)
        rhos[job.id] = finish_time_fairness(known.age_s, known.samples_done, rate)
        fair.append(FairJob(job.id, known.tenant, _speedup(job), rhos[job.id], job.current_gpus))
    weights = share_weights(fair, quotas, mode)
    weighed = [
        _weighed(c, weights.get(job.id, 1.0)) for c, job in zip(candidates, homes, strict=True)
    ]
    return weighed, rhos


def _home(candidate: Candidate | TypedCandidate) -> ElasticJob:
    return (candidate if isinstance(candidate, Candidate) else candidate.home).job


def _speedup(job: ElasticJob) -> float:
    if not job.running:
        return 0.0
    one = useful_progress(job, 1, job.base_batch)
    now = useful_progress(job, job.current_gpus, job.effective_current_batch)
    return now / one if one > 0 else 0.0


def _weighed(candidate: AnyCandidate, weight: float) -> AnyCandidate:
    if weight == 1.0:
        return candidate
    if isinstance(candidate, Candidate):
        return replace(candidate, job=replace(candidate.job, share_weight=weight))
    variants = {
        t: replace(c, job=replace(c.job, share_weight=weight))
        for t, c in candidate.variants.items()
    }
    return replace(candidate, variants=variants)
