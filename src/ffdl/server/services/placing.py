"""Placing one job right now, outside the queue: used to restart a rescaled job.

It asks the same pure scheduler that places every job, with a snapshot holding only this
job (at the size wanted) against everything else that holds resources, so a rescale can
never over-commit a node or ignore locality.
"""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from ffdl.core.resources import Node, Placement
from ffdl.core.status import HOLDING_JOB_STATES
from ffdl.scheduler.policy import schedule
from ffdl.scheduler.snapshot import Snapshot
from ffdl.server.services.snapshots import queued_job, running_job
from ffdl.server.store.models import Job


def place_alone(
    session: Session,
    job: Job,
    learners: int,
    nodes: tuple[Node, ...],
    default_placement: str,
    gpu_type: str | None = None,
) -> Placement | None:
    """Where ``job`` runs now with ``learners`` (on GPUs of ``gpu_type`` when given), or None
    when it does not fit."""
    others = session.scalars(
        select(Job).where(Job.status.in_([s.value for s in HOLDING_JOB_STATES]), Job.id != job.id)
    ).all()
    decisions = schedule(
        Snapshot(
            now=time.time(),
            nodes=nodes,
            queued=(queued_job(job, learners=learners, gpu_type=gpu_type),),
            running=tuple(running_job(other) for other in others),
            default_placement=default_placement,
        ),
        backfill=False,
        preemption=False,
    )
    return decisions.starts[0].placement if decisions.starts else None
