"""Queue order and the words for a job's place in it.

Owns the one ordering every part agrees on (priority, highest first; then submission time;
then id, so that equal submissions still have a stable order), the aging rule that keeps
backfill from starving a job, and the "behind N higher-priority jobs" wording.
"""

from __future__ import annotations

from collections.abc import Iterable

from ffdl.scheduler.placement import plural
from ffdl.scheduler.snapshot import QueuedJob

# A job that has waited this long blocks backfill past it (see policy.schedule).
DEFAULT_AGING_THRESHOLD_S = 3600.0


def queue_key(job: QueuedJob) -> tuple[int, float, str]:
    return (-job.priority, job.submitted_at, job.id)


def queue_order(queued: Iterable[QueuedJob]) -> list[QueuedJob]:
    return sorted(queued, key=queue_key)


def has_aged(job: QueuedJob, now: float, threshold_s: float) -> bool:
    return now - job.submitted_at > threshold_s


class AheadCounter:
    """Counts waiting jobs in queue order, split into higher-priority and same-priority."""

    def __init__(self) -> None:
        self._waiting = 0
        self._priority: int | None = None
        self._waiting_at_higher = 0

    def ahead_of(self, job: QueuedJob) -> tuple[int, int]:
        """(higher-priority, same-priority earlier) waiting jobs ahead of ``job``."""
        if job.priority != self._priority:
            self._priority = job.priority
            self._waiting_at_higher = self._waiting
        return self._waiting_at_higher, self._waiting - self._waiting_at_higher

    def add_waiting(self) -> None:
        self._waiting += 1


def behind_reason(higher: int, earlier: int) -> str:
    if higher and earlier:
        return (
            f"behind {plural(higher, 'higher-priority job')} and "
            f"{plural(earlier, 'earlier job')} of the same priority"
        )
    if higher:
        return f"behind {plural(higher, 'higher-priority job')}"
    if earlier:
        return f"behind {plural(earlier, 'earlier job')} of the same priority"
    return "waiting for capacity held for other jobs"
