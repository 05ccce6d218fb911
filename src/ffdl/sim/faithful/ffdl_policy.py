"""ffdl's elastic policy in the faithful engine, on the live autoscaler's path.

Every round each active job becomes a candidate through ``elastic_candidate``, the function
the live autoscaler loop calls, with the manifest an elastic version of its application
would carry: GPUs 1..64 (ncf: 1, at its fixed batch), batches from the smallest validated
to the largest, per-GPU batch limits from what was profiled. ``autoscale`` decides, with the
platform's default settings (a rescale's cost charged against the job's age, admission by
shrinking after 60 s of waiting, a job that waited 150 s stopping one that has had a turn of
300 s when shrinking is not enough, a job restarted less than
``min_rescale_interval_s`` ago held at its size). Its decisions are applied as the
platform applies them: a job whose GPUs change restarts on GPUs packed best-fit onto the
nodes (whole free nodes first for a job larger than one), and a job whose batch alone
changes restarts where it is (with ``rebatch_in_place=True`` it takes the batch there
without a restart, as a job with ``elastic.rebatch_in_place`` does). Every elastic version
accumulates gradients (``elastic.accumulate_gradients``), as AdaptDL's jobs do: a GPU's
share above the profiled per-GPU maximum runs as several micro-batches per step;
``accumulate=False`` measures the policy without it.

Speeds: the optimizer values a job through ``GoodputModel`` with the job's fitted Pollux
model (the estimate Pollux itself plans with), so that what is compared is how each policy
allocates; before a job's first step it has the live autoscaler's prior.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ffdl.core.manifest import ElasticSpec, IntRange, LocalBatchRange
from ffdl.elastic.autoscale import autoscale
from ffdl.elastic.candidates import JobState, elastic_candidate
from ffdl.elastic.optimizer import Objective
from ffdl.elastic.throughput import FloatArray, prior
from ffdl.sim.faithful.engine import FIXED_BATCH, Allocation, JobInfo, RoundPlan
from ffdl.sim.faithful.goodput import EPS, GoodputFunction
from ffdl.sim.faithful.policies import MAX_REPLICAS, ONE_GPU
from ffdl.sim.faithful.traces import Application
from ffdl.sim.live_defaults import LIVE_OBJECTIVE, live_default


@dataclass(frozen=True)
class PolluxGoodput:
    """A fitted Pollux model behind ffdl's ``GoodputModel``: the batch split evenly over
    the GPUs, each running ``steps`` micro-batches (Pollux counts the steps before the last
    one)."""

    model: GoodputFunction

    def goodput(
        self, gpus: FloatArray, nodes: FloatArray, batches: FloatArray, steps: FloatArray
    ) -> FloatArray:
        micro = np.ceil(batches / gpus / steps - EPS).astype(np.int64)
        extra = steps.astype(np.int64) - 1
        value = self.model.evaluate(nodes.astype(np.int64), gpus.astype(np.int64), micro, extra)
        return np.asarray(np.nan_to_num(np.maximum(value, 0.0)), dtype=np.float64)


def elastic_spec(
    app: Application, *, accumulate: bool = True, rebatch_in_place: bool = False
) -> ElasticSpec:
    """The ``elastic`` section an elastic version of ``app`` would be submitted with."""
    if app.name in ONE_GPU:
        batch = FIXED_BATCH[app.name]
        return ElasticSpec(gpus=IntRange(min=1, max=1), batch_size=IntRange(min=batch, max=batch))
    return ElasticSpec(
        gpus=IntRange(min=1, max=MAX_REPLICAS),
        batch_size=IntRange(min=app.init_batch_size, max=app.max_batch_size),
        local_batch_size=LocalBatchRange(min=app.min_local_bsz, max=app.max_local_bsz),
        accumulate_gradients=accumulate,
        rebatch_in_place=rebatch_in_place,
    )


def pack(wanted: int, free: list[int], per_node: int) -> Allocation:
    """GPUs for a job of ``wanted`` on nodes with ``free`` GPUs each (taken from ``free``):
    the fullest node that fits it whole, else whole free nodes, then the fullest that fit
    the rest."""
    taken: Allocation = []
    left = wanted
    while left >= per_node and per_node in free:
        node = free.index(per_node)
        taken.extend([node] * per_node)
        free[node] = 0
        left -= per_node
    while left > 0:
        fitting = [n for n, f in enumerate(free) if f >= left]
        if fitting:
            node = min(fitting, key=lambda n: (free[n], n))
            number = left
        else:
            node = max(range(len(free)), key=lambda n: (free[n], -n))
            number = free[node]
            if number == 0:
                raise ValueError(f"no room for {wanted} GPUs")
        taken.extend([node] * number)
        free[node] -= number
        left -= number
    return sorted(taken)


@dataclass
class FfdlElastic:
    name: str = "ffdl"
    batch: str = "policy"
    restart_penalty: float = live_default("restart_penalty")
    fairness_after_s: float = live_default("fairness_after_s")
    fairness_turn_s: float = live_default("fairness_turn_s")
    min_rescale_interval_s: float = live_default("min_rescale_interval_s")
    accumulate: bool = True
    # Batch-only changes taken without a restart (``elastic.rebatch_in_place``).
    rebatch_in_place: bool = False
    # A rescale's cost charged against the job's age (None: ``restart_penalty`` flat), and
    # how long a queued job waits before running jobs give up GPUs for it.
    restart_cost_s: float | None = live_default("restart_cost_s")
    admit_after_s: float = live_default("admit_after_s")
    objective: Objective = LIVE_OBJECTIVE

    def optimize(
        self,
        jobs: Mapping[str, JobInfo],
        nodes: int,
        gpus_per_node: int,
        current: Mapping[str, Allocation],
        now: int,
    ) -> RoundPlan:
        del now
        total = nodes * gpus_per_node
        candidates = [
            elastic_candidate(
                JobState(
                    id=key,
                    priority=0,
                    elastic=elastic_spec(
                        job.application,
                        accumulate=self.accumulate,
                        rebatch_in_place=self.rebatch_in_place,
                    ),
                    gpus_per_learner=1,
                    current_gpus=len(current.get(key, [])),
                    current_batch=job.target_batch,
                    current_nodes=len(set(current.get(key, []))) or None,
                    since_change_s=job.since_change_s,
                    age_s=job.age,
                    restarts=job.num_restarts,
                ),
                cluster_gpus=total,
                min_rescale_interval_s=self.min_rescale_interval_s,
                model=prior(),
                goodput=PolluxGoodput(job.goodput) if job.goodput is not None else None,
            )
            for key, job in jobs.items()
        ]
        decisions = autoscale(
            candidates,
            total,
            restart_penalty=self.restart_penalty,
            fairness_after_s=self.fairness_after_s,
            turn_s=self.fairness_turn_s,
            gpus_per_node=gpus_per_node,
            restart_cost_s=self.restart_cost_s,
            admit_after_s=self.admit_after_s,
            objective=self.objective,
        )
        allocations = {k: list(v) for k, v in current.items() if k in jobs}
        batches: dict[str, int] = {}
        in_place: set[str] = set()
        for decision in decisions:
            if decision.to_batch is not None:
                batches[decision.job_id] = decision.to_batch
            if decision.in_place:
                in_place.add(decision.job_id)
            if decision.to_gpus != decision.from_gpus:
                allocations.pop(decision.job_id, None)
        free = [gpus_per_node] * nodes
        for allocation in allocations.values():
            for node in allocation:
                free[node] -= 1
        for decision in decisions:
            if decision.to_gpus > 0 and decision.job_id not in allocations:
                allocations[decision.job_id] = pack(decision.to_gpus, free, gpus_per_node)
        return RoundPlan(allocations, batches, in_place)
