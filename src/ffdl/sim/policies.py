"""Named cluster policies: how a simulated pass decides, over the platform's own decision cores.

- ``fifo``: ``schedule(backfill=False, preemption=False)`` with every job at the same
  priority: strict arrival order, whole gangs.
- ``priority-backfill``: ``schedule()`` as the live scheduler loop calls it (priorities,
  backfill behind the head's reservation, preemption of lower-priority jobs).
- ``elastic``: the live autoscaler's step, then the scheduler: ``autoscale()`` over the
  running elastic jobs and the queued ones, on the GPUs that non-elastic jobs do not hold;
  its decisions on running jobs are checkpoint-restarts, a queued job it sizes is placed at
  that size (a gang of ``to_gpus / gpus_per_learner`` learners) by ``schedule()``, which sees
  every queued job as the live scheduler does (an elastic job not sized yet at the size it
  asked for). As in ``ffdl.server.loops.autoscaler``: the GPUs shared out are the cluster's
  minus those of non-elastic jobs and of jobs in transition (halting, or within their
  restart time), minus what a blocked higher-priority non-elastic job needs; a job
  restarted less than ``min_rescale_interval_s`` ago keeps its size; shrinking a job to zero
  is not applied; elastic jobs are never preempted. GPUs and batch size both change.
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

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ffdl.core.resources import LearnerPlacement, Resources
from ffdl.elastic.autoscale import Candidate, autoscale
from ffdl.elastic.optimizer import ElasticJob, Objective
from ffdl.scheduler.free import slots_for
from ffdl.scheduler.placement import never_fits
from ffdl.scheduler.policy import schedule
from ffdl.scheduler.snapshot import QueuedJob
from ffdl.sim.jobs import JobRecord, JobState
from ffdl.sim.live_defaults import LIVE_OBJECTIVE, live_default
from ffdl.sim.snapshots import build_snapshot
from ffdl.sim.workload import SimJob

if TYPE_CHECKING:
    from ffdl.sim.state import Policy, SimState

POLICY_NAMES = (
    "fifo",
    "priority-backfill",
    "elastic",
    "elastic-fixed-batch",
    "gang",
    "learner-at-a-time",
)
FLAT_PRIORITY = 50


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

    def admit(self, sim: SimState, job: SimJob) -> JobRecord:
        elastic = self.elastic and job.elastic_gpus is not None and job.per_learner.gpus > 0
        record = JobRecord(
            job=job,
            elastic=elastic,
            gpus_per_learner=job.per_learner.gpus,
            learners=job.learners,
            batch=job.model_family.base_batch,
        )
        smallest = job.learners
        if elastic and job.elastic_gpus is not None:
            smallest = max(job.elastic_gpus[0] // job.per_learner.gpus, 1)
        if _never_fits(sim, smallest, job.per_learner):
            record.state = JobState.REJECTED
        elif _never_fits(sim, job.learners, job.per_learner):
            # Too big as asked, but the autoscaler may start it smaller.
            record.learners = smallest
        return record

    def wants_pass(self, sim: SimState) -> bool:
        return bool(sim.queue)


def _never_fits(sim: SimState, learners: int, per: Resources) -> bool:
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

    def decide(self, sim: SimState) -> None:
        records = list(sim.queued_in_order())
        scheduler_pass(sim, records, self.backfill, self.preemption, self.placement)


def scheduler_pass(
    sim: SimState, records: list[JobRecord], backfill: bool, preemption: bool, placement: str
) -> None:
    """Call ``schedule`` on a snapshot of ``records`` and apply its starts and preemptions."""
    built = build_snapshot(
        sim, records, backfill=backfill, preemption=preemption, placement=placement
    )
    if built is None:
        return
    sim.scheduler_calls += 1
    decisions = schedule(built.snapshot, backfill=backfill, preemption=preemption)
    if built.optimistic and len(decisions.starts) < len(built.window):
        sim.scheduler_calls += 1
        decisions = schedule(built.full(sim), backfill=backfill, preemption=preemption)
    for preempt in decisions.preemptions:
        sim.preempt(sim.records[preempt.job_id])
    for start in decisions.starts:
        sim.start(sim.records[start.job_id], start.placement)


@dataclass(slots=True)
class ElasticPolicy(_Base):
    """The live autoscaler's step (GPUs and, unless ``fixed_batch``, batch size), then the
    scheduler over every queued job, elastic ones at the size last chosen for them."""

    fixed_batch: bool = False
    restart_penalty: float = live_default("restart_penalty")
    fairness_after_s: float = live_default("fairness_after_s")
    fairness_turn_s: float = live_default("fairness_turn_s")
    min_rescale_interval_s: float = live_default("min_rescale_interval_s")
    restart_cost_s: float | None = live_default("restart_cost_s")
    admit_after_s: float = live_default("admit_after_s")
    objective: Objective = LIVE_OBJECTIVE

    def wants_pass(self, sim: SimState) -> bool:
        return bool(sim.queue) or any(r.elastic for r in sim.running.values())

    def decide(self, sim: SimState) -> None:
        if self._autoscale(sim):
            sim.settle()
        scheduler_pass(sim, list(sim.queued_in_order()), True, True, self.placement)

    def _autoscale(self, sim: SimState) -> bool:
        """One autoscaler pass, as ``ffdl.server.loops.autoscaler`` makes it; True if it
        rescaled a running job."""
        capacity = sim.total_gpus
        held = 0
        candidates: list[Candidate] = []
        elastic_priorities: list[int] = []
        for record in sim.running.values():
            if record.placement is None:
                continue
            held += record.gpus
            # Jobs halting or (re)starting are in transition: their GPUs are not shared out.
            transition = record.state != JobState.RUNNING or sim.now < record.productive_from
            if not record.elastic or transition:
                capacity -= record.gpus
                continue
            elastic_priorities.append(self.priority_of(record.job))
            recent = sim.now - record.productive_from < self.min_rescale_interval_s
            candidates.append(Candidate(self._elastic_job(sim, record, True), hold=recent))
        blocked: JobRecord | None = None
        for record in sim.queued_in_order():
            if record.elastic:
                candidates.append(Candidate(self._elastic_job(sim, record, False)))
            elif blocked is None:
                blocked = record
        if blocked is not None and elastic_priorities:
            # Elastic jobs shrink to admit a blocked higher-priority job instead of it
            # preempting them.
            demand = blocked.gpus
            if demand > sim.total_gpus - held and self.priority_of(blocked.job) > min(
                elastic_priorities
            ):
                capacity -= demand
        if not candidates:
            return False
        sim.autoscale_calls += 1
        decisions = autoscale(
            candidates,
            capacity,
            restart_penalty=self.restart_penalty,
            fixed_batch=self.fixed_batch,
            fairness_after_s=self.fairness_after_s,
            turn_s=self.fairness_turn_s,
            gpus_per_node=sim.gpus_per_node,
            restart_cost_s=self.restart_cost_s,
            admit_after_s=self.admit_after_s,
            objective=self.objective,
        )
        rescaled = False
        for decision in decisions:
            record = sim.records[decision.job_id]
            if decision.to_gpus <= 0:
                continue
            if record.state == JobState.QUEUED:
                sim.resize(record, decision.to_gpus, decision.to_batch)
            elif record.state == JobState.RUNNING:
                sim.rescale(record, decision.to_gpus, decision.to_batch)
                rescaled = True
        return rescaled

    def _elastic_job(self, sim: SimState, record: JobRecord, running: bool) -> ElasticJob:
        # A running job's view changes only when it restarts, but for its age and time run.
        if (
            running
            and isinstance(record.memo, ElasticJob)
            and record.memo_attempt == record.attempt
        ):
            return replace(
                record.memo,
                age_s=sim.now - record.submitted,
                running_s=sim.now - record.productive_from,
            )
        job = record.job
        family = job.model_family
        assert job.elastic_gpus is not None
        view = ElasticJob(
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
            # A gang keeps its machines while its count stays: value it where it runs.
            current_nodes=len(record.placement.nodes)
            if running and record.placement is not None and record.gpus > 0
            else None,
            waited_s=0.0 if running else sim.now - record.queued_since,
            running_s=sim.now - record.productive_from if running else 0.0,
            age_s=sim.now - record.submitted,
            restarts=record.restarts,
        )
        if running:
            record.memo, record.memo_attempt = view, record.attempt
        return view


@dataclass(slots=True)
class LearnerAtATimePolicy(_Base):
    """Places learners one by one, round robin over waiting jobs, without gang scheduling."""

    def decide(self, sim: SimState) -> None:
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
    def _first_fit(sim: SimState, record: JobRecord) -> LearnerPlacement | None:
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
