"""Tenant quotas: usage, the quota check, borrowing, and when a tenant is back within quota.

Owns the rules for ``TenantQuota`` (``max_gpus``: GPUs held by running jobs plus the job
being started; ``max_running_jobs``: running jobs plus that one). A tenant without an entry
is unlimited. Jobs that run beyond their tenant's quota are *borrowing* idle capacity; for
running jobs this is derived from start order: walking a tenant's running jobs from the
oldest start, the ones that push its usage past the quota are the borrowers (so no extra
flag needs to be stored).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ffdl.scheduler.queue import plural
from ffdl.scheduler.snapshot import QueuedJob, RunningJob, TenantQuota


@dataclass(slots=True)
class TenantUsage:
    gpus: int = 0
    jobs: int = 0
    # (expected end or None when unknown, GPUs) for each job held
    holdings: list[tuple[float | None, int]] = field(default_factory=list)


def borrowing_jobs(
    quotas: Mapping[str, TenantQuota], running: Iterable[RunningJob]
) -> dict[str, str]:
    """Running jobs beyond their tenant's quota, with the quota they exceed in words."""
    by_tenant: dict[str, list[RunningJob]] = {}
    for job in running:
        if job.tenant in quotas:
            by_tenant.setdefault(job.tenant, []).append(job)
    borrowers: dict[str, str] = {}
    for tenant, jobs in by_tenant.items():
        quota = quotas[tenant]
        gpus = 0
        for count, job in enumerate(sorted(jobs, key=lambda j: (j.started_at, j.id)), start=1):
            gpus += job.total.gpus
            if quota.max_running_jobs is not None and count > quota.max_running_jobs:
                borrowers[job.id] = (
                    f"tenant {tenant} is over its quota of "
                    f"{plural(quota.max_running_jobs, 'running job')}"
                )
            elif quota.max_gpus is not None and gpus > quota.max_gpus:
                borrowers[job.id] = (
                    f"tenant {tenant} is over its quota of {plural(quota.max_gpus, 'GPU')}"
                )
    return borrowers


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
                duration = job.expected_duration_s or typical_duration_s
                end = None if duration is None else job.started_at + duration
                self.charge(job.tenant, job.total.gpus, end)

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
