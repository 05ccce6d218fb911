"""A running job's progress and time left, kept on its row as its chief learner reports.

Only learner 1 counts: every learner of a data-parallel job reports the same steps, and
one voice keeps the rate honest. The estimate itself is ``ffdl.core.progress``; the
scheduler's queue ETAs read ``Job.estimated_end_at``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from ffdl.core.progress import Report, advance, remaining_now
from ffdl.server.store.models import Job

CHIEF = 1


def record_progress(job: Job, learner: int, attempt: int, reports: Iterable[Report]) -> None:
    """Fold ``reports`` (oldest first) of ``learner``'s attempt into ``job``'s progress."""
    state = progressed(job.progress, learner, attempt, reports)
    if state is not None:
        job.progress = state
        job.estimated_end_at = state.get("estimated_end_at")


def progressed(
    state: dict[str, Any] | None, learner: int, attempt: int, reports: Iterable[Report]
) -> dict[str, Any] | None:
    """A job's progress ``state`` with ``reports`` (oldest first) of ``learner``'s attempt
    folded in, or None when they change nothing. Its ``estimated_end_at`` is the job's."""
    if learner != CHIEF:
        return None
    changed = False
    for report in reports:
        if report.has_progress:
            state = advance(state, report, attempt)
            changed = True
    return state if changed else None


def progress_view(job: Job, now: float) -> dict[str, Any] | None:
    """The ``progress`` block of the job JSON (None until the job reports progress)."""
    state = job.progress
    if not state:
        return None
    running = job.status in ("PROCESSING", "PENDING", "RESCALING")
    return {
        "step": state.get("step"),
        "total_steps": state.get("total_steps"),
        "samples": state.get("samples"),
        "total_samples": state.get("total_samples"),
        "epoch": state.get("epoch"),
        "total_epochs": state.get("total_epochs"),
        "fraction": state.get("fraction"),
        "rate": state.get("rate"),
        "unit": state.get("unit"),
        "samples_per_s": state.get("samples_rate"),
        "remaining_s": remaining_now(state, now) if running else None,
        "estimated_end_at": _iso(state.get("estimated_end_at")) if running else None,
        "updated_at": _iso(state.get("updated_at")),
    }


def start_estimate(job: Job) -> dict[str, Any] | None:
    """How far the first ETA the queue showed was from the job's real start."""
    if job.first_queue_eta_at is None or job.started_at is None:
        return None
    started = job.started_at.replace(tzinfo=UTC).timestamp()
    return {
        "first_eta_at": _iso(job.first_queue_eta_at),
        "started_at": _iso(started),
        "error_s": round(started - job.first_queue_eta_at, 3),
    }


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat()
