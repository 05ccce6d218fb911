"""The policies compared, besides Pollux (``pollux.py``): FIFO, Tiresias, Optimus and ffdl's
own elastic optimizer, with and without batch-size adaptation.

Each is written from its paper, on the views the engine shows (``JobView``), and answers a
``Decision`` per job. Only ffdl's two call platform code: ``ffdl.elastic.optimizer.optimize``,
the same pure function the live autoscaler calls.

- ``fifo``: in arrival order, each job at the GPUs its user asked for and its own batch, as
  soon as they are free; never preempts, never resizes; later jobs backfill when they fit.
- ``tiresias`` (Gu et al., NSDI'19): discretised two-dimensional least-attained-service. A
  job's attained service is the GPU-seconds it has held; thresholds split jobs into queues
  (fewer GPU-seconds, higher queue); inside a queue, first come first served. Every round the
  jobs are taken in that order at their requested GPUs, and a running job that no longer
  fits is preempted. A job that waited more than ``starve_factor`` times its last run goes
  back to the top queue (the paper's starvation guard; off, as in Pollux's evaluation). Its
  batch is its own.
- ``optimus`` (Peng et al., EuroSys'18): every job first gets the fewest GPUs that can run its
  batch, in arrival order while they last; then GPUs go one at a time to the job whose
  remaining time falls the most for it (marginal gain per GPU), from each job's true speed
  curve and remaining work (the oracle variant of Pollux's evaluation). Its batch is its own.
- ``elastic-fixed-batch``: ffdl's optimizer choosing GPU counts at each job's own batch
  (the elastic scaling paper's baseline, here bounded by memory: a batch of ``b`` runs on
  ``g`` GPUs only when ``b / g`` fits).
- ``elastic``: ffdl's optimizer choosing GPU counts and batch sizes.
- ``elastic-fit``: the same, knowing no job's true speed: it plans on each job's step times
  fitted online (``learning.OnlineFit``), as the live autoscaler does. On families whose
  speed is a measured table, the fit's four parameters cannot follow the table, and the
  optimizer plans on the fit's error; ``elastic`` is instead given each job's true curve
  through the optimizer's ``GoodputModel`` interface.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ffdl.elastic.efficiency import GradientStats
from ffdl.elastic.optimizer import ElasticJob, Objective, optimize
from ffdl.elastic.throughput import FloatArray, prior
from ffdl.sim.compare.families import Family
from ffdl.sim.compare.jobs import Decision, JobView
from ffdl.sim.compare.learning import OnlineFit
from ffdl.sim.live_defaults import LIVE_OBJECTIVE, live_default

# Tiresias as Pollux's evaluation configures it: two queues, a job moving to the second once
# it has held 16 GPU-hours, and no starvation rule (a factor of 0 turns it off).
TIRESIAS_THRESHOLDS_GPU_S = (16 * 3600.0,)
TIRESIAS_STARVE_FACTOR = 0.0


def _hold(job: JobView) -> Decision:
    return Decision(0, job.batch)


def _as_requested_in_order(order: Sequence[JobView], free: int) -> dict[str, Decision]:
    """Each job of ``order`` at its requested GPUs and batch while they fit, else held."""
    decisions = {}
    for job in order:
        wanted = job.job.requested_gpus
        if wanted <= free:
            decisions[job.id] = Decision(wanted, job.job.requested_batch)
            free -= wanted
        else:
            decisions[job.id] = _hold(job)
    return decisions


@dataclass
class Fifo:
    name: str = "fifo"

    def decide(
        self, now: float, jobs: Sequence[JobView], total_gpus: int, gpus_per_node: int
    ) -> Mapping[str, Decision]:
        free = total_gpus - sum(j.gpus for j in jobs)
        waiting = sorted((j for j in jobs if not j.gpus), key=lambda j: (j.job.submit_s, j.id))
        decisions = {j.id: Decision(j.gpus, j.batch) for j in jobs if j.gpus}
        decisions.update(_as_requested_in_order(waiting, free))
        return decisions


@dataclass
class Tiresias:
    name: str = "tiresias"
    thresholds_gpu_s: tuple[float, ...] = TIRESIAS_THRESHOLDS_GPU_S
    starve_factor: float = TIRESIAS_STARVE_FACTOR

    def queue_of(self, job: JobView) -> int:
        starving = self.starve_factor * job.last_run_s
        if starving > 0 and job.waited_s > starving:
            return 0
        return sum(1 for limit in self.thresholds_gpu_s if job.attained_gpu_s >= limit)

    def decide(
        self, now: float, jobs: Sequence[JobView], total_gpus: int, gpus_per_node: int
    ) -> Mapping[str, Decision]:
        order = sorted(jobs, key=lambda j: (self.queue_of(j), j.job.submit_s, j.id))
        return _as_requested_in_order(order, total_gpus)


@dataclass
class Optimus:
    name: str = "optimus"

    def decide(
        self, now: float, jobs: Sequence[JobView], total_gpus: int, gpus_per_node: int
    ) -> Mapping[str, Decision]:
        free = total_gpus
        gpus: dict[str, int] = {}
        for job in sorted(jobs, key=lambda j: (j.job.submit_s, j.id)):
            low, _ = job.job.fixed_batch_gpus()
            if low <= free:
                gpus[job.id] = low
                free -= low
        by_id = {j.id: j for j in jobs}

        def remaining_s(job: JobView, g: int) -> float:
            family = job.family
            nodes = -(-g // gpus_per_node)
            rate = family.goodput(g, nodes, job.job.requested_batch, job.progress)
            return job.remaining_samples / rate

        while free > 0:
            best, best_gain = None, 0.0
            for job_id, g in gpus.items():
                job = by_id[job_id]
                _, high = job.job.fixed_batch_gpus()
                if g + 1 > high:
                    continue
                gain = remaining_s(job, g) - remaining_s(job, g + 1)
                if gain > best_gain:
                    best, best_gain = job_id, gain
            if best is None:
                break
            gpus[best] += 1
            free -= 1
        return {
            j.id: Decision(gpus[j.id], j.job.requested_batch) if j.id in gpus else _hold(j)
            for j in jobs
        }


@dataclass(frozen=True, slots=True)
class TrueGoodput:
    """A family's true goodput at one point of a job's training, for the optimizer's
    ``GoodputModel`` interface."""

    family: Family
    progress: float

    def goodput(
        self, gpus: FloatArray, nodes: FloatArray, batches: FloatArray, steps: FloatArray
    ) -> FloatArray:
        # The comparison engine's jobs never accumulate: ``steps`` is always 1.
        return self.family.goodputs(gpus, nodes, batches, self.progress)


@dataclass
class FfdlElastic:
    """ffdl's optimizer; ``fixed_batch`` keeps every job at its own batch; ``learns_speed``
    plans on speeds fitted online instead of the true ones."""

    name: str = "elastic"
    fixed_batch: bool = False
    learns_speed: bool = False
    restart_penalty: float = live_default("restart_penalty")
    fairness_after_s: float = live_default("fairness_after_s")
    fairness_turn_s: float = live_default("fairness_turn_s")
    restart_cost_s: float | None = live_default("restart_cost_s")
    admit_after_s: float = live_default("admit_after_s")
    objective: Objective = LIVE_OBJECTIVE
    learned: OnlineFit = field(init=False, default_factory=OnlineFit, repr=False)

    def decide(
        self, now: float, jobs: Sequence[JobView], total_gpus: int, gpus_per_node: int
    ) -> Mapping[str, Decision]:
        if not jobs:
            return {}
        plan = optimize(
            [self._elastic_job(j, total_gpus) for j in jobs],
            total_gpus,
            restart_penalty=self.restart_penalty,
            fairness_after_s=self.fairness_after_s,
            turn_s=self.fairness_turn_s,
            fixed_batch=self.fixed_batch,
            gpus_per_node=gpus_per_node,
            restart_cost_s=self.restart_cost_s,
            admit_after_s=self.admit_after_s,
            objective=self.objective,
        )
        return {
            a.job_id: Decision(a.gpus, a.batch_size or jobs[i].batch)
            for i, a in enumerate(plan.allocations)
        }

    def _elastic_job(self, view: JobView, total_gpus: int) -> ElasticJob:
        family = view.family
        low, high = view.job.fixed_batch_gpus() if self.fixed_batch else family.adaptive_gpus()
        # As the live autoscaler does: no range beyond the cluster (see its _candidate).
        high = max(min(high, total_gpus), low)
        learned = self.learned.model(view) if self.learns_speed else None
        return ElasticJob(
            id=view.id,
            priority=50,
            gpu_range=(low, high),
            batch_range=family.batch_range,
            base_batch=view.job.requested_batch,
            local_batch_range=family.local_batch,
            model=learned or prior(),
            grad_stats=GradientStats(sq_norm=1.0, variance=view.noise_scale),
            goodput=None if learned else TrueGoodput(family, view.progress),
            current_gpus=view.gpus,
            current_batch=view.batch if view.gpus else None,
            current_nodes=view.nodes if view.gpus else None,
            waited_s=view.waited_s,
            running_s=view.running_s,
            age_s=view.age_s,
            restarts=view.restarts,
            remaining_samples=view.remaining_samples,
        )
