"""Named cluster policies: how a simulated pass decides, over the platform's own decision cores.

- ``fifo``: ``schedule(backfill=False, preemption=False)`` with every job at the same
  priority: strict arrival order, whole gangs.
- ``priority-backfill``: ``schedule()`` as the live scheduler loop calls it (priorities,
  backfill behind the head's reservation, preemption of lower-priority jobs).
- ``elastic``: the live autoscaler's step, then the scheduler: ``autoscale()`` over the
  running elastic jobs and the queued ones, on the GPUs that non-elastic jobs do not hold;
  its decisions on running jobs are checkpoint-restarts, a queued job it sizes is started at
  that size (a gang of ``to_gpus / gpus_per_learner`` learners placed by ``schedule()``).
  GPUs and batch size both change.
- ``elastic-fixed-batch``: the same with ``fixed_batch=True``: GPUs change, the batch stays at
  the job's own (the elastic scaling paper's baseline).
- ``gang``: ``schedule()`` with its defaults, named for the gang experiment.
- ``learner-at-a-time``: a deliberately naive scheduler written here, not the platform's: it
  places single learners in arrival order, one per waiting job per round, on the first node
  with room, as they fit. Learners of a gang that is not whole hold their GPUs and wait for
  the rest, which is how gangs deadlock without gang scheduling.

Policies other than ``elastic*`` run elastic jobs at the size they ask for. Every policy
rejects at arrival a job that could never fit the cluster, as the API does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ffdl.core.resources import LearnerPlacement, Resources
from ffdl.elastic.autoscale import Candidate, autoscale
from ffdl.elastic.optimizer import ElasticJob
from ffdl.scheduler.free import slots_for
from ffdl.scheduler.placement import never_fits
from ffdl.scheduler.policy import schedule
from ffdl.scheduler.snapshot import QueuedJob
from ffdl.sim.engine import JobRecord, JobState
from ffdl.sim.snapshots import build_snapshot
from ffdl.sim.workload import SimJob

if TYPE_CHECKING:
    from ffdl.sim.engine import Simulator

POLICY_NAMES = (
    "fifo",
    "priority-backfill",
    "elastic",
    "elastic-fixed-batch",
    "gang",
    "learner-at-a-time",
)
FLAT_PRIORITY = 50


class Policy(Protocol):
    name: str
    placement: str  # the cluster's default placement: "pack" or "spread"
    time_dependent: bool  # whether a pass may decide differently later with nothing changed

    def priority_of(self, job: SimJob) -> int: ...

    def queue_key(self, job: SimJob) -> tuple[int, float, str]: ...

    def admit(self, sim: Simulator, job: SimJob) -> JobRecord: ...

    def wants_pass(self, sim: Simulator) -> bool: ...

    def decide(self, sim: Simulator) -> None: ...


@dataclass(slots=True)
class _Base:
    name: str
    placement: str = "pack"
    use_priority: bool = True
    elastic: bool = False
    time_dependent: bool = True

    def priority_of(self, job: SimJob) -> int:
        return job.priority if self.use_priority else FLAT_PRIORITY

    def queue_key(self, job: SimJob) -> tuple[int, float, str]:
        return (-self.priority_of(job), job.submit_s, job.id)

    def admit(self, sim: Simulator, job: SimJob) -> JobRecord:
        elastic = self.elastic and job.elastic_gpus is not None and job.per_learner.gpus > 0
        learners = job.learners
        if elastic and job.elastic_gpus is not None:
            learners = max(job.elastic_gpus[0] // job.per_learner.gpus, 1)
        record = JobRecord(
            job=job,
            elastic=elastic,
            gpus_per_learner=job.per_learner.gpus,
            learners=learners,
            batch=job.model_family.base_batch,
        )
        if _never_fits(sim, learners, job.per_learner):
            record.state = JobState.REJECTED
        elif elastic:
            record.learners = job.learners  # what it asks for, until the autoscaler sizes it
        return record

    def wants_pass(self, sim: Simulator) -> bool:
        return bool(sim.queue)


def _never_fits(sim: Simulator, learners: int, per: Resources) -> bool:
    memo = sim.cache.setdefault("never_fits", {})
    assert isinstance(memo, dict)
    key = (learners, per)
    if key not in memo:
        shape = QueuedJob("shape", "", 0, 0.0, learners, per)
        memo[key] = never_fits(shape, sim.nodes) is not None
    return bool(memo[key])


@dataclass(slots=True)
class SchedulerPolicy(_Base):
    """A pass of the platform's scheduler with the given switches."""

    backfill: bool = True
    preemption: bool = True

    def decide(self, sim: Simulator) -> None:
        scheduler_pass(
            sim, list(sim.queued_in_order()), self.backfill, self.preemption, self.placement
        )


def scheduler_pass(
    sim: Simulator, records: list[JobRecord], backfill: bool, preemption: bool, placement: str
) -> None:
    """Call ``schedule`` on a snapshot of ``records`` and apply its starts and preemptions."""
    built = build_snapshot(
        sim, records, backfill=backfill, preemption=preemption, placement=placement
    )
    if built is None:
        return
    snapshot, _window = built
    sim.scheduler_calls += 1
    decisions = schedule(snapshot, backfill=backfill, preemption=preemption)
    for preempt in decisions.preemptions:
        sim.preempt(sim.records[preempt.job_id])
    for start in decisions.starts:
        record = sim.records[start.job_id]
        batch = record.target[1] if record.elastic and record.target is not None else None
        sim.start(record, start.placement, batch)


@dataclass(slots=True)
class ElasticPolicy(_Base):
    """The autoscaler's step (GPUs and, unless ``fixed_batch``, batch size), then the scheduler."""

    fixed_batch: bool = False
    restart_penalty: float = 0.1
    fairness_after_s: float = 600.0

    def wants_pass(self, sim: Simulator) -> bool:
        return bool(sim.queue) or any(r.elastic for r in sim.running.values())

    def decide(self, sim: Simulator) -> None:
        candidates: list[Candidate] = []
        capacity = sim.total_gpus
        for record in sim.running.values():
            if record.elastic and record.state == JobState.RUNNING:
                candidates.append(Candidate(self._elastic_job(sim, record, running=True)))
            else:
                capacity -= record.gpus if record.placement is not None else 0
        queued_elastic = [r for r in sim.queue.values() if r.elastic]
        candidates.extend(
            Candidate(self._elastic_job(sim, r, running=False)) for r in queued_elastic
        )
        if candidates:
            sim.autoscale_calls += 1
            decisions = autoscale(
                candidates,
                capacity,
                restart_penalty=self.restart_penalty,
                fixed_batch=self.fixed_batch,
                fairness_after_s=self.fairness_after_s,
                gpus_per_node=sim.gpus_per_node,
            )
            for record in queued_elastic:
                sim.set_target(record, None)
            for decision in decisions:
                record = sim.records[decision.job_id]
                if record.state == JobState.RUNNING:
                    sim.rescale(record, decision.to_gpus, decision.to_batch)
                elif record.state == JobState.QUEUED and decision.to_gpus > 0:
                    sim.set_target(record, decision.to_gpus, decision.to_batch)
            sim.settle()
        records = [r for r in sim.queued_in_order() if not r.elastic or r.target is not None]
        scheduler_pass(sim, records, True, True, self.placement)

    def _elastic_job(self, sim: Simulator, record: JobRecord, *, running: bool) -> ElasticJob:
        job = record.job
        family = job.model_family
        assert job.elastic_gpus is not None
        return ElasticJob(
            id=job.id,
            priority=self.priority_of(job),
            gpu_range=job.elastic_gpus,
            batch_range=family.batch_range,
            base_batch=family.base_batch,
            gpus_per_learner=record.gpus_per_learner,
            model=family.model,
            grad_stats=family.grad_stats,
            current_gpus=record.gpus if running else 0,
            current_batch=record.batch if running else None,
            waited_s=0.0 if running else sim.now - record.queued_since,
            remaining_samples=max(job.work - record.progress(sim.now), 0.0) if running else None,
        )


@dataclass(slots=True)
class LearnerAtATimePolicy(_Base):
    """Places learners one by one, round robin over waiting jobs, without gang scheduling."""

    def decide(self, sim: Simulator) -> None:
        waiting = list(sim.queued_in_order())
        placed = True
        while placed and waiting:
            placed = False
            for record in waiting:
                if record.state != JobState.QUEUED:
                    continue
                learner = self._first_fit(sim, record)
                if learner is not None:
                    sim.hold(record, learner)
                    placed = True
            waiting = [r for r in waiting if r.state == JobState.QUEUED]

    @staticmethod
    def _first_fit(sim: Simulator, record: JobRecord) -> LearnerPlacement | None:
        per = record.job.per_learner
        for node in sim.nodes:
            free = sim.free[node.name]
            if node.schedulable and slots_for(free.gpus, free.cpus, free.memory_mb, per) > 0:
                ids = tuple(free.gpu_ids[: per.gpus])
                return LearnerPlacement(len(record.held) + 1, node.name, ids)
        return None


def make_policy(name: str, *, placement: str = "pack") -> Policy:
    """The policy called ``name`` (one of ``POLICY_NAMES``) with a default placement."""
    if placement not in ("pack", "spread"):
        raise ValueError(f"placement must be pack or spread, not {placement!r}")
    if name == "fifo":
        return SchedulerPolicy(
            name,
            placement,
            use_priority=False,
            time_dependent=False,
            backfill=False,
            preemption=False,
        )
    if name in ("priority-backfill", "gang"):
        return SchedulerPolicy(name, placement)
    if name in ("elastic", "elastic-fixed-batch"):
        return ElasticPolicy(
            name, placement, elastic=True, fixed_batch=name == "elastic-fixed-batch"
        )
    if name == "learner-at-a-time":
        return LearnerAtATimePolicy(name, placement, use_priority=False, time_dependent=False)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
