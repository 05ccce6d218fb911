"""Queue order and the words for a job's place in it.

Owns the one ordering every part agrees on (priority, highest first; then submission time;
then id, so that equal submissions still have a stable order), the aging rule that keeps
backfill from starving a job, and the "behind N higher-priority jobs" wording (positions
are counted over the jobs that did not start, in this order).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter

from ffdl.scheduler.snapshot import QueuedJob

# A job that has waited this long blocks backfill past it (see policy.schedule).
DEFAULT_AGING_THRESHOLD_S = 3600.0


def queue_key(job: QueuedJob) -> tuple[int, float, str]:
    return (-job.priority, job.submitted_at, job.id)


def queue_order(queued: Iterable[QueuedJob]) -> list[QueuedJob]:
    """The queue in ``queue_key`` order (two stable C-level sorts, fast on long queues)."""
    ordered = sorted(queued, key=attrgetter("submitted_at", "id"))
    ordered.sort(key=attrgetter("priority"), reverse=True)
    return ordered


def has_aged(job: QueuedJob, now: float, threshold_s: float) -> bool:
    return now - job.submitted_at > threshold_s


def behind_reason(higher: int, earlier: int) -> str:
    """Why a job that would fit waits: the jobs ahead of it hold the capacity."""
    higher_words = f"{higher} higher-priority job{'' if higher == 1 else 's'}"
    earlier_words = f"{earlier} earlier job{'' if earlier == 1 else 's'} of the same priority"
    if higher and earlier:
        return f"behind {higher_words} and {earlier_words}"
    if higher:
        return f"behind {higher_words}"
    if earlier:
        return f"behind {earlier_words}"
    return "waiting for capacity held for other jobs"
