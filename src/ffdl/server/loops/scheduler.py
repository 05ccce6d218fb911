"""The scheduler loop: snapshot the queue and the cluster, call the pure scheduler, apply.

Starts move QUEUED jobs to PENDING with their placement; preemptions ask victims to halt
(they are requeued once HALTED); every job left waiting gets its position, reason and ETA.
A job backing off before an automatic restart (``services/restarts.py``) is left out of the
snapshot until its ``not_before``: it keeps the reason its restart gave it.
While the backend has a problem (``Backend.problem``: its cluster is unreachable, say) the
loop starts and preempts nothing: every queued job keeps its position and shows that
problem as its reason, and scheduling resumes on the first pass after it clears.
The snapshot reads plain columns (no ORM objects, no manifests) and keeps the running jobs
it read unchanged last pass (``RunningJobs``); the free capacity is kept too, and only the
nodes of jobs that changed are recomputed (``KeptFree``); the loop only writes queue
information that changed since it last wrote it and starts its jobs in one read, so a pass
over thousands of queued and running jobs on thousands of nodes stays cheap
(``docs/scale.md``).
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, bindparam, func, select, update
from sqlalchemy.orm.attributes import flag_modified

from ffdl.core.status import HOLDING_JOB_STATES, JobStatus
from ffdl.scheduler.free import KeptFree
from ffdl.scheduler.policy import schedule
from ffdl.scheduler.snapshot import Decisions, Snapshot, TenantQuota, Waiting
from ffdl.server.platform import Platform
from ffdl.server.services.nodes import effective_nodes
from ffdl.server.services.snapshots import RUNNING_COLUMNS, RunningJobs, queued_job
from ffdl.server.store.models import Job, Tenant
from ffdl.server.store.transitions import lock_jobs, set_job_status

# Set on a job that the scheduler halted to make room; the LCM requeues it once HALTED.
PREEMPTED = "preempt"
_PREEMPTIBLE = frozenset(
    {JobStatus.PENDING.value, JobStatus.DOWNLOADING.value, JobStatus.PROCESSING.value}
)
# Queue info is rewritten when the ETA moves by more than this many seconds.
_ETA_SLACK_S = 5.0

_COLUMNS = (
    Job.id,
    Job.tenant_id,
    Job.priority,
    Job.submitted_at,
    Job.learners,
    Job.gpus,
    Job.cpus,
    Job.memory_mb,
    Job.gpu_type,
    Job.gpu_types,
    Job.mix_gpu_types,
    Job.pinned_gpu_type,
    Job.rescale_target,
    Job.placement_policy,
    Job.same_label,
    Job.expected_duration_s,
    Job.started_at,
    Job.status_changed_at,
    Job.placement,
    Job.elastic,
    Job.not_before,
    Job.estimated_end_at,
)

QueueInfo = tuple[int | None, str, float | None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SchedulerLoop:
    """One scheduler pass per call; remembers what queue info it wrote last."""

    def __init__(self, platform: Platform) -> None:
        self._platform = platform
        # job id -> (status_changed_at, queue info) as last written by this process
        self._written: dict[str, tuple[datetime, QueueInfo]] = {}
        self._running = RunningJobs()
        self._free = KeptFree()

    def __call__(self) -> None:
        problem = self._platform.backend.problem()
        snapshot, changed_at = self.snapshot(with_nodes=problem is None)
        if not snapshot.queued:
            self._written.clear()
            return
        decisions = schedule(snapshot, kept=self._free)
        if problem is not None:
            decisions = _held_back(decisions, problem)
        if self.apply(decisions, snapshot.now, changed_at):
            self._platform.wakeups.notify("lcm")

    def snapshot(self, with_nodes: bool = True) -> tuple[Snapshot, dict[str, datetime]]:
        """The queue and the cluster now; ``with_nodes`` False: a cluster of no nodes (the
        backend has a problem, and nothing it says of its nodes can be used)."""
        platform = self._platform
        holding = [s.value for s in HOLDING_JOB_STATES]
        now = time.time()
        wall = datetime.fromtimestamp(now, UTC).replace(tzinfo=None)
        with platform.store.read() as session:
            queued = session.execute(
                select(*_COLUMNS).where(
                    Job.status == JobStatus.QUEUED.value,
                    Job.not_before.is_(None) | (Job.not_before <= wall),
                )
            ).all()
            running = session.execute(select(*RUNNING_COLUMNS).where(Job.status.in_(holding))).all()
            tenants = session.scalars(select(Tenant)).all()
        snapshot = Snapshot(
            now=now,
            nodes=tuple(effective_nodes(platform)) if with_nodes else (),
            queued=tuple(queued_job(row) for row in queued),
            running=self._running.update(running),
            quotas={
                t.id: TenantQuota(t.id, t.max_gpus, t.max_running_jobs)
                for t in tenants
                if t.max_gpus is not None or t.max_running_jobs is not None
            },
            default_placement=platform.settings.default_placement,
        )
        return snapshot, {row.id: row.status_changed_at for row in queued}

    def apply(self, decisions: Decisions, now: float, changed_at: dict[str, datetime]) -> bool:
        """Write the decisions; returns True if any job was started or preempted."""
        acted = False
        updates = self._queue_updates(decisions, now, changed_at)
        if not (decisions.starts or decisions.preemptions or updates):
            return False
        with self._platform.store.write() as session, session.no_autoflush:
            # One read (and row lock) for every job started, and one flush at the commit:
            # a pass that starts hundreds of jobs on a large cluster stays one round trip.
            started = lock_jobs(session, [start.job_id for start in decisions.starts])
            for start in decisions.starts:
                job = started.get(start.job_id)
                if job is None or job.status != JobStatus.QUEUED.value:
                    continue  # halted or deleted since the snapshot
                job.placement = start.placement.to_json()
                job.attempt += 1
                job.not_before = None
                job.master_port = free_port() if job.learners > 1 else None
                # Every start then writes the same columns, even where one stays None, so
                # the flush sends the starts as one batch instead of a statement per change
                # of column set.
                flag_modified(job, "master_port")
                flag_modified(job, "not_before")
                nodes = ", ".join(start.placement.nodes)
                set_job_status(session, job, JobStatus.PENDING, f"placed on {nodes}")
                acted = True
            for preemption in decisions.preemptions:
                job = session.get(Job, preemption.job_id)
                if job is None or job.status not in _PREEMPTIBLE:
                    continue
                job.desired = PREEMPTED
                set_job_status(session, job, JobStatus.HALTING, preemption.reason)
                acted = True
            if updates:
                # Queue info is not a status change: no event, and only still-QUEUED rows.
                table = Job.__table__
                assert isinstance(table, Table)
                session.connection().execute(
                    update(table)
                    .where(
                        table.c.id == bindparam("b_id"),
                        table.c.status == JobStatus.QUEUED.value,
                    )
                    .values(
                        queue_position=bindparam("b_position"),
                        reason=bindparam("b_reason"),
                        queue_eta_at=bindparam("b_eta_at"),
                        # The first ETA shown is kept, to be held against the real start.
                        first_queue_eta_at=func.coalesce(
                            table.c.first_queue_eta_at, bindparam("b_eta_at")
                        ),
                    ),
                    updates,
                )
        for start in decisions.starts:
            self._written.pop(start.job_id, None)
        return acted

    def _queue_updates(
        self, decisions: Decisions, now: float, changed_at: dict[str, datetime]
    ) -> list[dict[str, Any]]:
        updates = []
        live: dict[str, tuple[datetime, QueueInfo]] = {}
        for waiting in decisions.waiting:
            stamp = changed_at.get(waiting.job_id)
            if stamp is None:
                continue
            eta_at = None if waiting.eta_s is None else now + waiting.eta_s
            info: QueueInfo = (waiting.position, waiting.reason, eta_at)
            previous = self._written.get(waiting.job_id)
            if previous is not None and previous[0] == stamp and _same(previous[1], info):
                live[waiting.job_id] = previous
                continue
            live[waiting.job_id] = (stamp, info)
            updates.append(
                {
                    "b_id": waiting.job_id,
                    "b_position": info[0],
                    "b_reason": info[1],
                    "b_eta_at": info[2],
                }
            )
        self._written = live
        return updates


def _held_back(decisions: Decisions, problem: str) -> Decisions:
    """Nothing starts or is preempted; every waiting job says why: the backend's problem."""
    return Decisions(
        waiting=tuple(
            replace(w, reason=problem, eta_s=None, eta_reason=problem) for w in decisions.waiting
        )
        + tuple(
            # Jobs the policy would have started wait too, after the others, in order.
            Waiting(start.job_id, len(decisions.waiting) + i, problem, None, problem)
            for i, start in enumerate(decisions.starts, start=1)
        )
    )


def _same(a: QueueInfo, b: QueueInfo) -> bool:
    if a[0] != b[0] or a[1] != b[1]:
        return False
    if a[2] is None or b[2] is None:
        return a[2] is b[2]
    return abs(a[2] - b[2]) <= _ETA_SLACK_S
