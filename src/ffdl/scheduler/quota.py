"""Tenant quotas: usage, the quota check, borrowing, and when a tenant is back within quota.

Owns the rules for ``TenantQuota`` (``max_gpus``: GPUs held by running jobs plus the job
being started; ``max_running_jobs``: running jobs plus that one). A tenant without an entry
is unlimited. A tenant whose running jobs exceed its quota is *borrowing* idle capacity. What
it borrowed is an amount, not particular jobs: any of its jobs may be reclaimed as long as,
taken back one at a time, the tenant is still over its quota before each (``Overdraft``).
Which job started last says nothing about where the capacity a preemptor needs lies, so
no job is singled out and no flag needs to be stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ffdl.scheduler.queue import plural
from ffdl.scheduler.snapshot import QueuedJob, RunningJob, TenantQuota


@dataclass(slots=True)
class TenantUsage:
    gpus: int = 0
    jobs: int = 0
    # (expected end or None when unknown, GPUs) for each job held
    holdings: list[tuple[float | None, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Overdraft:
    """A tenant running beyond its quota, with what it holds."""

    quota: TenantQuota
    jobs: int
    gpus: int
    reason: str  # the quota it exceeds, in words

    def allows(self, earlier: Sequence[RunningJob], borrowed: Sequence[RunningJob]) -> bool:
        """Whether, after ``earlier`` (jobs of this tenant taken back anyway) are gone, taking
        back ``borrowed`` too takes only borrowed capacity: removed one at a time, largest
        last, the tenant is still over its quota before each."""
        if not borrowed:
            return True
        quota = self.quota
        jobs_before_last = self.jobs - len(earlier) - len(borrowed) + 1
        if quota.max_running_jobs is not None and jobs_before_last > quota.max_running_jobs:
            return True
        sizes = [job.total.gpus for job in borrowed]
        gone = sum(job.total.gpus for job in earlier) + sum(sizes)
        return quota.max_gpus is not None and self.gpus - gone + max(sizes) > quota.max_gpus


def overdrafts(
    quotas: Mapping[str, TenantQuota], running: Iterable[RunningJob]
) -> dict[str, Overdraft]:
    """Per tenant running beyond its quota, what it holds and which quota it exceeds."""
    held: dict[str, list[int]] = {}
    for job in running:
        if job.tenant in quotas:
            jobs_and_gpus = held.setdefault(job.tenant, [0, 0])
            jobs_and_gpus[0] += 1
            jobs_and_gpus[1] += job.total.gpus
    found: dict[str, Overdraft] = {}
    for tenant, (jobs, gpus) in held.items():
        quota = quotas[tenant]
        if quota.max_running_jobs is not None and jobs > quota.max_running_jobs:
            limit = plural(quota.max_running_jobs, "running job")
        elif quota.max_gpus is not None and gpus > quota.max_gpus:
            limit = plural(quota.max_gpus, "GPU")
        else:
            continue
        reason = f"tenant {tenant} is over its quota of {limit}"
        found[tenant] = Overdraft(quota, jobs, gpus, reason)
    return found


class QuotaBook:
    """What each tenant holds during a pass, checked against its quota."""

    def __init__(
        self,
        quotas: Mapping[str, TenantQuota],
        running: Iterable[RunningJob],
        typical_duration_s: float | None,
    ) -> None:
        self.quotas = quotas
        self.usage: dict[str, TenantUsage] = {}
        self._typical = typical_duration_s
        self._ends: dict[str, list[tuple[float, int]]] = {}
        self._answers: dict[tuple[str, int], tuple[float | None, str]] = {}
        for job in running:
            if job.tenant in quotas:
                self.charge(job.tenant, job.total.gpus, job.expected_end(typical_duration_s))

    def charge(self, tenant: str, gpus: int, end: float | None) -> None:
        """Count a job against its tenant (only tenants with a quota are tracked)."""
        if tenant not in self.quotas:
            return
        usage = self.usage.get(tenant)
        if usage is None:
            usage = self.usage[tenant] = TenantUsage()
        usage.gpus += gpus
        usage.jobs += 1
        usage.holdings.append((end, gpus))
        self._ends.pop(tenant, None)
        self._answers.clear()

    def over_quota(self, job: QueuedJob) -> str | None:
        """Why starting ``job`` would exceed its tenant's quota, or None if it would not."""
        quota = self.quotas.get(job.tenant)
        if quota is None:
            return None
        usage = self.usage.get(job.tenant) or TenantUsage()
        if quota.max_running_jobs is not None and usage.jobs + 1 > quota.max_running_jobs:
            return (
                f"tenant {job.tenant} is at its quota of "
                f"{plural(quota.max_running_jobs, 'running job')}"
            )
        gpus = job.total.gpus
        if quota.max_gpus is not None and usage.gpus + gpus > quota.max_gpus:
            return (
                f"tenant {job.tenant} is at its quota of {plural(quota.max_gpus, 'GPU')} "
                f"({usage.gpus} in use, this job needs {gpus})"
            )
        return None

    def within_quota_at(self, job: QueuedJob, now: float) -> tuple[float | None, str]:
        """When the tenant's expected job ends bring ``job`` within quota (None: unknown)."""
        key = (job.tenant, job.per_learner.gpus * job.learners)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = self._within_quota_at(job, now)
        return answer

    def _within_quota_at(self, job: QueuedJob, now: float) -> tuple[float | None, str]:
        quota = self.quotas.get(job.tenant)
        usage = self.usage.get(job.tenant)
        if quota is None or usage is None:
            return now, ""
        gpus = job.total.gpus
        if quota.max_gpus is not None and gpus > quota.max_gpus:
            return None, (
                f"needs more GPUs than tenant {job.tenant}'s quota of "
                f"{plural(quota.max_gpus, 'GPU')}; it can only borrow idle capacity"
            )
        held_gpus, held_jobs = usage.gpus, usage.jobs

        def fits() -> bool:
            return (quota.max_running_jobs is None or held_jobs + 1 <= quota.max_running_jobs) and (
                quota.max_gpus is None or held_gpus + gpus <= quota.max_gpus
            )

        if fits():
            return now, ""
        ends = self._ends.get(job.tenant)
        if ends is None:
            ends = sorted((end, g) for end, g in usage.holdings if end is not None)
            self._ends[job.tenant] = ends
        for end, released in ends:
            held_gpus -= released
            held_jobs -= 1
            if fits():
                return max(now, end), f"when tenant {job.tenant}'s running jobs end"
        return None, f"tenant {job.tenant}'s running jobs have no expected duration"
