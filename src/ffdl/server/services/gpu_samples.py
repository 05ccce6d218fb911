"""GPU samples from the controllers: stored, bounded, averaged, and idleness flagged.

Each ``gpu`` report item is one reading of a learner's GPUs. Ingestion (inside the report's
transaction, the job's row already locked) does four things:

- stores a ``gpu_samples`` row covering the time since the learner's previous reading (at
  most three sample intervals: a gap beyond that is not counted as measured);
- keeps the learner's latest figures on its row (``/metrics``, ``ffdl nodes``, the
  dashboard) and folds the reading into the job's time-weighted average utilisation;
- bounds the series: past ``gpu_samples_kept`` rows for one learner, its oldest rows are
  merged two by two into rows of twice the span (span-weighted means), so a long job keeps
  a coarser past and a fine recent history;
- flags waste: once every current learner of the job has stayed under ``gpu_idle_util``
  percent for ``gpu_idle_after_s``, the job is flagged (``gpu_idle_flagged_at``) and an
  event says so; a busy reading clears the flag, with an event too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ffdl.server.settings import Settings
from ffdl.server.store.models import GpuSample, Job, Learner
from ffdl.server.store.transitions import note_job_event

MAX_GPUS_PER_SAMPLE = 64
_GAP_FACTOR = 3.0


def gpu_item_problem(gpus: Sequence[dict[str, Any]]) -> str | None:
    """Why a ``gpu`` item's readings cannot be stored, or None."""
    if not gpus:
        return "no GPUs"
    if len(gpus) > MAX_GPUS_PER_SAMPLE:
        return f"more than {MAX_GPUS_PER_SAMPLE} GPUs"
    for gpu in gpus:
        if not isinstance(gpu, dict):
            return "a GPU reading is not an object"
        for name, low, high in (
            ("index", 0, 1024),
            ("util", 0, 100),
            ("memory_mb", 0, 2**31),
            ("memory_total_mb", 0, 2**31),
        ):
            value = gpu.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"GPU {name} must be a number"
            if not math.isfinite(value) or not low <= value <= high:
                return f"GPU {name} out of range"
        power = gpu.get("power_w")
        if power is not None and (
            isinstance(power, bool)
            or not isinstance(power, int | float)
            or not math.isfinite(power)
            or not 0 <= power <= 100_000
        ):
            return "GPU power_w out of range"
    return None


def record_gpu_samples(
    session: Session,
    job: Job,
    learner: Learner,
    readings: Sequence[tuple[float, Sequence[dict[str, Any]]]],
    settings: Settings,
) -> None:
    """Store ``readings`` ((time, GPUs), oldest first) of ``learner``; see the module doc."""
    if not readings:
        return
    interval = settings.gpu_sample_s or 5.0
    for at, gpus in readings:
        util = sum(float(g["util"]) for g in gpus) / len(gpus)
        memory = sum(float(g["memory_mb"]) for g in gpus)
        powers = [g.get("power_w") for g in gpus]
        power = sum(float(p) for p in powers if p is not None) if None not in powers else None
        previous = learner.gpu_sampled_at
        since = at - previous if previous is not None else interval
        span = since if 0 < since <= _GAP_FACTOR * interval else interval
        session.add(
            GpuSample(
                job_id=job.id,
                learner=learner.index,
                attempt=learner.attempt,
                node=learner.node,
                time=at,
                span_s=span,
                util=util,
                memory_mb=memory,
                power_w=power,
                gpus=[dict(g) for g in gpus],
            )
        )
        learner.gpu_util, learner.gpu_memory_mb, learner.gpu_power_w = util, memory, power
        learner.gpu_stats = [dict(g) for g in gpus]
        learner.gpu_sampled_at = at
        measured = job.gpu_util_span_s or 0.0
        average = job.gpu_util_avg or 0.0
        job.gpu_util_span_s = measured + span
        job.gpu_util_avg = (average * measured + util * span) / (measured + span)
        _watch_idleness(session, job, learner, at, settings)
    session.flush()
    while _compact(session, job.id, learner.index, settings.gpu_samples_kept):
        pass


def _watch_idleness(
    session: Session, job: Job, learner: Learner, at: float, settings: Settings
) -> None:
    others = session.execute(
        select(Learner.gpu_util, Learner.node, Learner.gpu_ids).where(
            Learner.job_id == job.id,
            Learner.attempt == job.attempt,
            Learner.index != learner.index,
        )
    ).all()
    utils = [learner.gpu_util, *(util for util, _, _ in others)]
    idle = all(u is None or u < settings.gpu_idle_util for u in utils)
    if not idle:
        if job.gpu_idle_flagged_at is not None:
            note_job_event(session, job, "GPUs busy again after being flagged idle")
        job.gpu_idle_since = job.gpu_idle_flagged_at = None
        return
    if job.gpu_idle_since is None:
        job.gpu_idle_since = at
    idle_for = at - job.gpu_idle_since
    if job.gpu_idle_flagged_at is None and idle_for >= settings.gpu_idle_after_s:
        job.gpu_idle_flagged_at = at
        held = [(learner.node, learner.gpu_ids), *((node, ids) for _, node, ids in others)]
        note_job_event(
            session,
            job,
            f"GPUs idle: {job.gpus * job.learners} GPU(s) held under "
            f"{settings.gpu_idle_util:g}% utilisation for {_duration(idle_for)} "
            f"({_gpus_text(held)})",
        )


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _gpus_text(held: Sequence[tuple[str | None, Sequence[int] | None]]) -> str:
    """Which GPUs, e.g. ``node-a GPUs 0, 1; node-b GPU 3``, so an operator can find them."""
    by_node: dict[str, list[int]] = {}
    for node, ids in held:
        by_node.setdefault(node or "?", []).extend(ids or [])
    return "; ".join(
        f"{node} GPU{'s' if len(ids) != 1 else ''} {', '.join(str(i) for i in sorted(ids))}"
        if ids
        else node
        for node, ids in sorted(by_node.items())
    )


def _compact(session: Session, job_id: str, learner: int, kept: int) -> bool:
    """One round of merging ``learner``'s oldest rows pairwise when it has more than
    ``kept``; whether rows are still to be merged (a round at most halves the series)."""
    count = session.scalar(
        select(func.count())
        .select_from(GpuSample)
        .where(GpuSample.job_id == job_id, GpuSample.learner == learner)
    )
    excess = (count or 0) - kept
    if excess <= 0:
        return False
    # Merging 2k rows into k removes k. Only the older half is merged in one round, so
    # the most recent readings keep their full resolution.
    taken = max(min(2 * excess, (count or 0) // 2) // 2 * 2, 2)
    oldest = session.scalars(
        select(GpuSample)
        .where(GpuSample.job_id == job_id, GpuSample.learner == learner)
        .order_by(GpuSample.time, GpuSample.id)
        .limit(taken)
    ).all()
    gone: list[int] = []
    for first, second in zip(oldest[0::2], oldest[1::2], strict=False):
        span = first.span_s + second.span_s
        second.util = (first.util * first.span_s + second.util * second.span_s) / span
        second.memory_mb = (
            first.memory_mb * first.span_s + second.memory_mb * second.span_s
        ) / span
        if first.power_w is not None and second.power_w is not None:
            second.power_w = (first.power_w * first.span_s + second.power_w * second.span_s) / span
        second.span_s = span
        gone.append(first.id)
    if not gone:
        return False
    session.execute(delete(GpuSample).where(GpuSample.id.in_(gone)))
    session.flush()
    return len(gone) < excess


def gpu_series(session: Session, job: Job, since: float | None) -> dict[str, Any]:
    """``GET /v1/models/{id}/gpu``: the job's samples (after ``since``), oldest first."""
    query = select(GpuSample).where(GpuSample.job_id == job.id)
    if since is not None:
        query = query.where(GpuSample.time > since)
    rows = session.scalars(query.order_by(GpuSample.time, GpuSample.id)).all()
    return {
        "average_util": job.gpu_util_avg,
        "samples": [
            {
                "time": row.time,
                "learner": row.learner,
                "attempt": row.attempt,
                "node": row.node,
                "span_s": row.span_s,
                "util": row.util,
                "memory_mb": row.memory_mb,
                "power_w": row.power_w,
                "gpus": row.gpus,
            }
            for row in rows
        ],
    }


def gpu_utilization_view(job: Job, learners: Sequence[Learner] = ()) -> dict[str, Any] | None:
    """The ``gpu_utilization`` block of the job JSON (None until a sample arrived)."""
    if job.gpu_util_avg is None:
        return None
    latest = [lr.gpu_util for lr in learners if lr.gpu_util is not None]
    memory = [lr.gpu_memory_mb for lr in learners if lr.gpu_memory_mb is not None]
    return {
        "average": round(job.gpu_util_avg, 2),
        "measured_s": round(job.gpu_util_span_s or 0.0, 1),
        "latest": round(sum(latest) / len(latest), 2) if latest else None,
        "memory_mb": round(sum(memory), 1) if memory else None,
        "idle_since": _iso(job.gpu_idle_since),
        "idle_flagged": job.gpu_idle_flagged_at is not None,
    }


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat()
