"""Tiresias and Optimus as Pollux's simulator runs them, and the GPU caps each policy
applies.

- **Tiresias** (two-queue discretised LAS): a job runs on the GPUs its row asks for, whole
  or not at all; jobs start in queue 0 and move to queue 1 once their GPU-time passes
  16 GPU-hours; queue 0 is served first, each queue in arrival order; a running job is
  never moved.
- **Optimus**: every job gets one GPU, then GPUs go one at a time to the job whose
  remaining time (its remaining iterations at its fixed batch times its true step time)
  drops most; jobs whose count is unchanged keep their GPUs, the rest are placed on the
  emptiest nodes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from ffdl.sim.faithful.engine import Allocation, JobInfo, RoundPlan

# Pollux's simulator: ncf is always a single-GPU job; no job is planned past 64 GPUs.
ONE_GPU = frozenset({"ncf"})
MAX_REPLICAS = 64
TIRESIAS_QUEUE_THRESHOLD = 3600 * 16


def fixed_batch_cap(job: JobInfo) -> int:
    """Optimus' cap: as many GPUs as the fixed batch has micro-batches of the minimum."""
    if job.application.name in ONE_GPU:
        return 1
    assert job.target_batch is not None
    return job.target_batch // job.application.min_local_bsz


def adaptive_cap(job: JobInfo) -> int:
    """Pollux's cap: twice the most GPUs it has been seen on, within the batch's reach."""
    app = job.application
    if app.name in ONE_GPU:
        return 1
    profiled = max(2 * job.max_profiled_replicas, 1)
    return min(profiled, MAX_REPLICAS, app.max_batch_size // app.min_local_bsz)


def place_on_emptiest(
    wanted: Mapping[str, int],
    order: list[str],
    allocations: dict[str, Allocation],
    nodes: int,
    gpus_per_node: int,
) -> None:
    """Give each job in ``order`` that has no GPUs yet its count, node by node from the
    one with the most free GPUs (ties: the lower index)."""
    free = Counter({i: gpus_per_node for i in range(nodes)})
    free.subtract(Counter(node for alloc in allocations.values() for node in alloc))
    for key in order:
        if wanted.get(key, 0) > 0 and not allocations.get(key):
            taken: Allocation = []
            while len(taken) < wanted[key]:
                node, count = free.most_common(1)[0]
                number = min(count, wanted[key] - len(taken))
                taken.extend([node] * number)
                free[node] -= number
            allocations[key] = taken


@dataclass
class Tiresias:
    name: str = "tiresias"
    batch: str = "fixed"
    _queues: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))
    _running: dict[str, bool] = field(default_factory=dict)
    _last_check: Counter[str] = field(default_factory=Counter)
    _executed: Counter[str] = field(default_factory=Counter)

    def optimize(
        self,
        jobs: Mapping[str, JobInfo],
        nodes: int,
        gpus_per_node: int,
        current: Mapping[str, Allocation],
        now: int,
    ) -> RoundPlan:
        first, second = self._queues
        first[:] = [k for k in first if k in jobs]
        second[:] = [k for k in second if k in jobs]
        self._running = {k: v for k, v in self._running.items() if k in jobs}
        allocations = {k: list(v) for k, v in current.items() if k in jobs}
        for key in jobs:
            if key not in self._running:
                self._running[key] = False
                first.append(key)
        for key, job in jobs.items():
            elapsed = int(now - self._last_check[key])
            self._last_check[key] = now
            if self._running[key]:
                self._executed[key] += elapsed
                gpu_time = self._executed[key] * (job.target_replicas or 1)
                if key in first and gpu_time >= TIRESIAS_QUEUE_THRESHOLD:
                    first.remove(key)
                    second.append(key)
        left = nodes * gpus_per_node
        for queue in (first, second):
            for key in queue:
                want = jobs[key].target_replicas or 1
                if want <= left:
                    self._running[key] = True
                    left -= want
                else:
                    self._running[key] = False
                    allocations.pop(key, None)
        wanted = {k: jobs[k].target_replicas or 1 for k, run in self._running.items() if run}
        place_on_emptiest(wanted, [*first, *second], allocations, nodes, gpus_per_node)
        return RoundPlan(allocations)


@dataclass
class Optimus:
    name: str = "optimus"
    batch: str = "fixed"

    def optimize(
        self,
        jobs: Mapping[str, JobInfo],
        nodes: int,
        gpus_per_node: int,
        current: Mapping[str, Allocation],
        now: int,
    ) -> RoundPlan:
        del now
        remaining = {key: self._remaining(job) for key, job in jobs.items()}
        left = nodes * gpus_per_node
        counts: dict[str, int] = {}
        gain: dict[str, float] = {}
        for key, job in jobs.items():
            if left < 1:
                counts[key], gain[key] = 0, 0.0
                continue
            counts[key] = 1
            left -= 1
            gain[key] = self._gain(job, 1, remaining[key], left, gpus_per_node)
        while left > 0 and gain and max(gain.values()) > 0:
            key = max(gain, key=lambda k: gain[k])
            counts[key] += 1
            gain[key] = self._gain(jobs[key], counts[key], remaining[key], left, gpus_per_node)
            left -= 1
        allocations = {k: list(v) for k, v in current.items() if k in jobs and len(v) == counts[k]}
        order = sorted(jobs, key=lambda k: counts[k])
        place_on_emptiest(counts, order, allocations, nodes, gpus_per_node)
        return RoundPlan(allocations)

    def _remaining(self, job: JobInfo) -> float:
        app = job.application
        assert job.target_batch is not None
        done = app.completion_epoch(job.target_batch)
        if done <= job.epoch:
            return 1.0
        return app.iteration(job.target_batch, done) - app.iteration(job.target_batch, job.epoch)

    def _gain(self, job: JobInfo, count: int, remaining: float, left: int, per_node: int) -> float:
        if count + 1 > fixed_batch_cap(job) or left < 1:
            return 0.0
        return (
            self.step_time(job, count, per_node) - self.step_time(job, count + 1, per_node)
        ) * remaining

    @staticmethod
    def step_time(job: JobInfo, count: int, per_node: int) -> float:
        """The true time of one step of ``job``'s fixed batch on ``count`` packed GPUs."""
        app = job.application
        assert job.target_batch is not None
        placement: tuple[int, ...] = ()
        while sum(placement) < count:
            placement = (*placement, min(count - sum(placement), per_node))
        local = math.ceil(job.target_batch / count - 1e-8)
        steps = math.ceil(local / app.max_local_bsz - 1e-8) - 1
        if count == 1:
            steps = max(1, steps)
        micro = math.ceil(local / (steps + 1) - 1e-8)
        micro = min(micro, int(app.max_batch_size / (count * (steps + 1))))
        step, sync = app.throughput(placement, micro)
        return step + (step - sync) * steps
