"""Speed of the elastic optimizer on cluster-sized inputs, against its goal of 100 ms.

Two deterministic random workloads: 1,000 jobs on 4,096 GPUs and 100 jobs on 512 GPUs, with
a mix of running and queued jobs, GPU gangs, batch ranges and gradient statistics. Each is
solved repeatedly with each objective and the live autoscaler's other defaults (restarts
charged by age, admission after 60 s); the median and 95th percentile wall time are printed
beside the goal. The same jobs are then solved on GPUs of three types (``optimize_types``:
the 4,096 GPUs split evenly, each type's step twice as fast as the next one's), every job
accepting all three and each running job on one of them. Every timed solve starts with the
optimizer's caches empty.

Run: ``python benchmarks/bench_optimizer.py``.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import replace

from ffdl.elastic.by_type import TypedJob, optimize_types
from ffdl.elastic.choices import clear_caches
from ffdl.elastic.efficiency import GradientStats
from ffdl.elastic.optimizer import OBJECTIVES, ElasticJob, Objective, optimize
from ffdl.elastic.throughput import ThroughputModel

GOAL_MS = 100.0
WORKLOADS = ((1000, 4096), (100, 512))
# Three GPU types and the speed of each relative to the slowest.
TYPE_SPEEDS = {"h100": 4.0, "a100": 2.0, "v100": 1.0}
REPEATS = 21


def make_jobs(count: int, total_gpus: int, seed: int = 7) -> list[ElasticJob]:
    """A reproducible mix of jobs whose running allocations fit in ``total_gpus``."""
    rng = random.Random(seed)
    jobs = []
    used = 0
    for index in range(count):
        gang = rng.choice((1, 1, 1, 2, 4))
        low = gang * rng.choice((1, 1, 2))
        high = low * rng.choice((1, 2, 4, 8, 16))
        base = rng.choice((32, 64, 128, 256))
        batch_range = None if rng.random() < 0.3 else (base // 2, base * rng.choice((2, 4, 8)))
        model = ThroughputModel(
            alpha=rng.uniform(0.002, 0.02),
            beta=rng.uniform(0.0002, 0.005),
            gamma=rng.uniform(0.005, 0.05),
            delta=rng.uniform(0.005, 0.05),
        )
        stats = None
        if rng.random() < 0.5:
            stats = GradientStats(sq_norm=1.0, variance=rng.uniform(50.0, 5000.0))
        current = 0
        if rng.random() < 0.6 and used + low <= total_gpus:
            current = low * rng.choice((1, 1, 2))
            current = min(current, high // gang * gang)
            used += current
        jobs.append(
            ElasticJob(
                id=f"training-{index:05d}",
                priority=rng.randrange(0, 101),
                gpu_range=(low, high),
                batch_range=batch_range,
                base_batch=base,
                gpus_per_learner=gang,
                model=model,
                grad_stats=stats,
                current_gpus=current,
                current_batch=base if current else None,
                waited_s=0.0 if current else rng.uniform(0.0, 1200.0),
                age_s=rng.uniform(0.0, 86_400.0),
                restarts=rng.randrange(0, 4) if current else 0,
            )
        )
    return jobs


def make_typed_jobs(count: int, total_gpus: int) -> tuple[list[TypedJob], dict[str, int]]:
    """``make_jobs`` on three GPU types: each job's step takes 1 / speed as long on a type,
    and each running job runs on a type that still holds it."""
    share = {t: total_gpus // len(TYPE_SPEEDS) for t in TYPE_SPEEDS}
    share["h100"] += total_gpus - sum(share.values())
    free = dict(share)
    rng = random.Random(11)
    typed = []
    for job in make_jobs(count, total_gpus):
        variants = {
            t: replace(
                job, model=replace(job.model, alpha=job.model.alpha / s, beta=job.model.beta / s)
            )
            for t, s in TYPE_SPEEDS.items()
        }
        current = None
        if job.running:
            fitting = [t for t in TYPE_SPEEDS if free[t] >= job.current_gpus] or list(TYPE_SPEEDS)
            current = rng.choice(fitting)
            free[current] -= job.current_gpus
        typed.append(TypedJob(variants, current))
    return typed, share


def time_workload(
    count: int, total_gpus: int, objective: Objective, repeats: int = REPEATS, typed: bool = False
) -> tuple[float, float]:
    """Median and 95th percentile milliseconds of ``optimize`` (or, ``typed``,
    ``optimize_types``) on one workload."""
    jobs = make_jobs(count, total_gpus)
    typed_jobs, by_type = make_typed_jobs(count, total_gpus)

    def solve() -> None:
        if typed:
            optimize_types(
                typed_jobs, by_type, objective=objective, restart_cost_s=30.0, admit_after_s=60.0
            )
        else:
            optimize(jobs, total_gpus, objective=objective, restart_cost_s=30.0, admit_after_s=60.0)

    solve()  # warm numpy before timing
    samples = []
    for _ in range(repeats):
        # Jobs' candidate counts are cached by their fields; each solve starts without them,
        # as the first pass after a restart or on a new set of jobs does.
        clear_caches()
        start = time.perf_counter()
        solve()
        samples.append((time.perf_counter() - start) * 1000.0)
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
    return statistics.median(samples), p95


def main() -> dict[str, float]:
    results: dict[str, float] = {}
    print(
        f"{'workload':<31}{'objective':<14}{'median ms':>10}{'p95 ms':>10}{'goal ms':>10}"
        f"{'goal/median':>13}"
    )
    for (count, total_gpus), typed in [(w, False) for w in WORKLOADS] + [(WORKLOADS[0], True)]:
        for objective in OBJECTIVES:
            median, p95 = time_workload(count, total_gpus, objective, typed=typed)
            kinds = "_3_types" if typed else ""
            name = f"{count}_jobs_{total_gpus}_gpus{kinds}_{objective}"
            results[f"{name}_median_ms"] = median
            results[f"{name}_p95_ms"] = p95
            label = f"{count} jobs x {total_gpus} GPUs" + (", 3 types" if typed else "")
            print(
                f"{label:<31}{objective:<14}{median:>10.1f}{p95:>10.1f}{GOAL_MS:>10.0f}"
                f"{GOAL_MS / median:>12.1f}x"
            )
    return results


if __name__ == "__main__":
    main()
