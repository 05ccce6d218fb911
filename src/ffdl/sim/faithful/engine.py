"""Jobs and rounds as Pollux's simulator runs them.

Every ``interval`` seconds (60) each job advances: a job given new GPUs first spends 30 s
restarting, then progresses at its true goodput (measured step times, validation-curve
efficiency) epoch by epoch, re-choosing its batch after each. Then the policy allocates
GPUs for the next round from what the jobs report (``JobInfo``). A job whose batch is
fixed (Tiresias', Optimus' jobs) splits it over its GPUs, accumulating gradients where a
GPU cannot hold its share; an adaptive job (Pollux's) takes the batch its fitted goodput
model says is best for its GPUs; where the policy sets batches (ffdl's), a job runs the one
it was given and a new batch on the same GPUs is a restart like any other change, unless
the policy says the job takes it in place (``RoundPlan.in_place``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ffdl.sim.faithful.goodput import GoodputFunction, SpeedupFunction, fit_perf_params
from ffdl.sim.faithful.traces import Application

RESTART_S = 30
EPS = 1e-8
# Pollux's simulator gives ncf a fixed batch under every policy.
FIXED_BATCH = {"ncf": 32768}

Allocation = list[int]  # one node index per GPU, in node order


@dataclass
class JobInfo:
    """What a policy sees of one active job."""

    name: str
    application: Application
    submitted: int
    attained_service: float
    age: int
    num_restarts: int
    epoch: int
    max_profiled_replicas: int
    target_replicas: int | None
    target_batch: int | None  # the batch it runs at, when fixed or set by the policy
    since_change_s: int  # since it last started, restarted or lost its GPUs
    speedup: SpeedupFunction | None  # for policies that plan with goodput
    goodput: GoodputFunction | None  # its fitted model, likewise


@dataclass
class RoundPlan:
    """A policy's answer: GPUs per job (node indices), and batches where it sets them."""

    allocations: dict[str, Allocation]
    batches: dict[str, int] = field(default_factory=dict)
    # Jobs whose new batch on the same GPUs is taken without a restart.
    in_place: set[str] = field(default_factory=set)


class Policy(Protocol):
    name: str
    # Who sets a job's batch: "fixed" (the workload's, split over its GPUs), "agent" (the
    # job, from its own goodput model, after each epoch: Pollux's agents) or "policy".
    batch: str

    def optimize(
        self,
        jobs: Mapping[str, JobInfo],
        nodes: int,
        gpus_per_node: int,
        current: Mapping[str, Allocation],
        now: int,
    ) -> RoundPlan: ...


@dataclass
class WorkloadJob:
    name: str
    submitted: int
    application: str
    num_replicas: int
    batch_size: int


def read_workload(path: Path) -> list[WorkloadJob]:
    with path.open(newline="") as stream:
        return [
            WorkloadJob(
                row["name"],
                int(row["time"]),
                row["application"],
                int(row["num_replicas"]),
                int(row["batch_size"]),
            )
            for row in csv.DictReader(stream)
        ]


@dataclass
class Job:
    name: str
    application: Application
    submitted: int
    target_replicas: int | None = None
    target_batch: int | None = None
    completed: int | None = None
    now: int = 0
    rescale_left: int = 0
    placement: tuple[int, ...] = ()
    micro: int = 0
    accum_steps: int = 0
    progress: float = 0.0
    epoch: int = 0
    attained_service: float = 0.0
    num_restarts: int | None = None
    grad: tuple[float, float] | None = None
    changed_at: int = 0
    # Pollux's rule: one GPU past the initial batch accumulates at least once (its gradient
    # statistics need two micro-batches); a platform that does not accumulate says False.
    accumulates_alone: bool = True
    profile: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)
    _goodput: GoodputFunction | None = None

    @property
    def max_profiled_replicas(self) -> int:
        return max((key[1] for key in self.profile), default=0)

    def goodput_model(self) -> GoodputFunction | None:
        """The goodput model fitted to every configuration this job has run in."""
        if not self.profile or self.grad is None:
            return None
        if self._goodput is None:
            keys = np.array(list(self.profile), dtype=np.float64)
            times = np.array(list(self.profile.values()))
            params = fit_perf_params(
                keys[:, 0], keys[:, 1], keys[:, 2], times[:, 0] - times[:, 1], times[:, 0]
            )
            self._goodput = GoodputFunction(params, 0.0, 0.0, self.application.init_batch_size)
        self._goodput.grad_sqr, self._goodput.grad_var = self.grad
        return self._goodput

    def speedup_function(self) -> SpeedupFunction | None:
        model = self.goodput_model()
        if model is None:
            return None
        app = self.application
        return SpeedupFunction(model, app.max_batch_size, (app.min_local_bsz, app.max_local_bsz))

    def choose_batch(self) -> None:
        app = self.application
        placement = tuple(p for p in self.placement if p)
        nodes, replicas = len(placement), sum(placement)
        batch = self.target_batch
        model = self.goodput_model() if batch is None else None
        if batch is None and model is None:
            batch = max(app.init_batch_size, app.min_local_bsz * replicas)
        if batch is None:
            assert model is not None
            _, micro, steps = model.optimize(
                nodes, replicas, app.max_batch_size, (app.min_local_bsz, app.max_local_bsz)
            )
            self.micro, self.accum_steps = int(micro), int(steps)
        else:
            local = math.ceil(batch / replicas - EPS)
            self.accum_steps = math.ceil(local / app.max_local_bsz - EPS) - 1
            if self.accumulates_alone and replicas == 1 and batch > app.init_batch_size:
                self.accum_steps = max(1, self.accum_steps)
            self.micro = math.ceil(local / (self.accum_steps + 1) - EPS)
        count = replicas * (self.accum_steps + 1)
        self.micro = min(self.micro, int(app.max_batch_size / count))

    def _observe(
        self, nodes: int, replicas: int, step: float, sync: float, grad: tuple[float, float]
    ) -> None:
        self.grad = grad
        key = (nodes, replicas, self.micro)
        if key not in self.profile:
            self.profile[key] = (step, sync)
            self._goodput = None

    def advance(self, seconds: int) -> None:
        if not self.placement:
            self.now += seconds
            return
        gpus = sum(self.placement)
        delay = min(self.rescale_left, seconds)
        self.now += delay
        self.attained_service += delay * gpus
        self.rescale_left -= delay
        seconds -= delay
        app = self.application
        while seconds > 0 and self.completed is None:
            placement = tuple(p for p in self.placement if p)
            nodes, replicas = len(placement), sum(placement)
            batch = replicas * self.micro * (self.accum_steps + 1)
            scale = batch / app.init_batch_size
            step, sync = app.throughput(placement, self.micro)
            grad_sqr, grad_var = app.grad_stats(batch, self.epoch)
            gain = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)
            self._observe(nodes, replicas, step, sync, (grad_sqr, grad_var))
            goodput = gain / (step + (step - sync) * self.accum_steps)
            next_progress = app.progress_at(self.epoch + 1)
            if self.progress + goodput * seconds < next_progress:
                self.progress += goodput * seconds
                self.now += seconds
                self.attained_service += seconds * gpus
                seconds = 0
            else:
                self.epoch += 1
                delta = round(float((next_progress - self.progress) / goodput))
                if self.epoch > app.completion_epoch(batch):
                    self.completed = self.now + delta
                self.progress = next_progress
                self.now += delta
                self.attained_service += delta * gpus
                seconds -= delta
            self.choose_batch()
        self.now += seconds

    def reallocate(self, placement: tuple[int, ...]) -> None:
        self.changed_at = self.now
        if placement:
            self.placement = placement
            self.choose_batch()
            self.rescale_left = RESTART_S
            self.num_restarts = 0 if self.num_restarts is None else self.num_restarts + 1
        else:
            self.placement = ()
            self.micro = 0


def placement_of(allocation: Allocation) -> tuple[int, ...]:
    """GPUs per node, in the order the allocation lists them."""
    counts: list[int] = []
    for i, node in enumerate(allocation):
        if i == 0 or node != allocation[i - 1]:
            counts.append(1)
        else:
            counts[-1] += 1
    return tuple(counts)


@dataclass
class RunResult:
    jcts: dict[str, int]
    waits: dict[str, int]
    rounds: int

    @property
    def average_jct(self) -> float:
        return float(np.mean(list(self.jcts.values())))

    @property
    def p99_jct(self) -> float:
        return float(np.percentile(list(self.jcts.values()), 99))

    @property
    def p99_wait(self) -> float:
        return float(np.percentile(list(self.waits.values()), 99))


class Cluster:
    """``nodes`` × ``gpus_per_node`` GPUs running one workload under one policy."""

    def __init__(
        self,
        workload: list[WorkloadJob],
        applications: Mapping[str, Application],
        policy: Policy,
        nodes: int = 16,
        gpus_per_node: int = 4,
    ) -> None:
        self.policy = policy
        self.nodes, self.gpus_per_node = nodes, gpus_per_node
        self.now = 0
        self.jobs = []
        for row in workload:
            app = applications[row.application]
            job = Job(row.name, app, row.submitted, changed_at=row.submitted)
            if policy.batch == "fixed":
                job.target_batch = row.batch_size
                job.target_replicas = row.num_replicas
            else:
                job.target_batch = FIXED_BATCH.get(row.application)
            if policy.batch == "policy":
                job.target_batch = job.target_batch or app.init_batch_size
                job.accumulates_alone = False
            self.jobs.append(job)
        self.allocations: dict[str, Allocation] = {}
        self.first_gpus: dict[str, int] = {}

    def job_info(self, job: Job) -> JobInfo:
        return JobInfo(
            name=job.name,
            application=job.application,
            submitted=job.submitted,
            attained_service=job.attained_service,
            age=self.now - job.submitted,
            num_restarts=job.num_restarts or 0,
            epoch=job.epoch,
            max_profiled_replicas=job.max_profiled_replicas,
            target_replicas=job.target_replicas,
            target_batch=job.target_batch,
            since_change_s=self.now - job.changed_at,
            speedup=job.speedup_function() if self.policy.batch == "agent" else None,
            goodput=job.goodput_model() if self.policy.batch == "policy" else None,
        )

    def step(self, seconds: int) -> None:
        for job in self.jobs:
            job.advance(seconds)
        self.now += seconds
        active = {
            job.name: self.job_info(job)
            for job in self.jobs
            if job.submitted <= self.now and job.completed is None
        }
        if not active:
            return
        current = {k: v for k, v in self.allocations.items() if k in active}
        plan = self.policy.optimize(active, self.nodes, self.gpus_per_node, current, self.now)
        chosen = plan.allocations
        for job in self.jobs:
            new, old = chosen.get(job.name), current.get(job.name)
            batch = plan.batches.get(job.name)
            rebatched = batch is not None and batch != job.target_batch
            if batch is not None:
                job.target_batch = batch
            # A new batch on the same GPUs restarts the job too, unless it takes it in place
            # (at once here: the live learners take it at their next epoch).
            if new != old or (rebatched and new and job.name not in plan.in_place):
                job.reallocate(placement_of(new or []))
                if new and job.name not in self.first_gpus:
                    self.first_gpus[job.name] = self.now
        self.allocations = chosen

    def run(
        self,
        interval: int = 60,
        max_rounds: int = 100_000,
        on_round: Callable[[int], None] | None = None,
    ) -> RunResult:
        rounds = 0
        while not all(job.completed is not None for job in self.jobs):
            if rounds >= max_rounds:
                raise RuntimeError(f"{self.policy.name}: not done after {rounds} rounds")
            self.step(interval)
            rounds += 1
            if on_round is not None:
                on_round(rounds)
        jcts = {
            j.name: int(j.completed - j.submitted) for j in self.jobs if j.completed is not None
        }
        waits = {j.name: self.first_gpus.get(j.name, j.submitted) - j.submitted for j in self.jobs}
        return RunResult(jcts, waits, rounds)
