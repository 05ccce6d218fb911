"""Every job's options as arrays (``ffdl.elastic.options``): rows valued on different
clusters in one pass are valued as each cluster alone would value them."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from ffdl.elastic.efficiency import GradientStats
from ffdl.elastic.optimizer import ElasticJob
from ffdl.elastic.options import Options, evaluate, progress_grid
from ffdl.elastic.throughput import ThroughputModel


def random_jobs(rng: random.Random, count: int) -> list[ElasticJob]:
    jobs = []
    for index in range(count):
        gang = rng.choice((1, 2, 4))
        current = rng.choice((0, 0, gang, 2 * gang))
        wide = rng.random() < 0.5  # widths differ, so the padded grid has real padding
        jobs.append(
            ElasticJob(
                id=f"j{index}",
                priority=rng.choice((0, 50, 100)),
                gpu_range=(gang, (32 if wide else 2) * gang),
                batch_range=None if rng.random() < 0.2 else (32, 2048),
                base_batch=32,
                gpus_per_learner=gang,
                model=ThroughputModel(
                    alpha=rng.uniform(0.001, 0.01),
                    beta=rng.uniform(0.0005, 0.003),
                    gamma=rng.uniform(0.005, 0.05),
                    delta=rng.uniform(0.005, 0.05),
                ),
                grad_stats=GradientStats(1.0, rng.uniform(50.0, 5000.0))
                if rng.random() < 0.5
                else None,
                local_batch_range=rng.choice((None, (4, 64), (8, 16))),
                accumulate=rng.random() < 0.3,
                rebatch_in_place=rng.random() < 0.3,
                current_gpus=current,
                current_batch=64 if current else None,
                current_nodes=rng.choice((None, 2)) if current >= 2 else None,
                age_s=rng.choice((None, rng.uniform(0.0, 7200.0))),
                restarts=rng.randrange(3),
            )
        )
    return jobs


def by_gpus(options: Options, row: int) -> dict[int, tuple[float, int, float]]:
    """A row's real options: GPUs -> (utility, batch, progress)."""
    return {
        int(g): (float(u), int(b), float(p))
        for g, u, b, p in zip(
            options.gpus[row],
            options.utility[row],
            options.batches[row],
            options.progress[row],
            strict=True,
        )
        if g > 0 or u == options.utility[row, 0]
    }


@pytest.mark.parametrize("proportional", [False, True])
def test_rows_on_different_clusters_are_valued_as_each_cluster_alone(proportional: bool) -> None:
    rng = random.Random(3)
    first = random_jobs(rng, 12)
    second = [replace(job, id=f"{job.id}-b") for job in random_jobs(rng, 9)]
    settings = {"restart_penalty": 0.1, "restart_cost_s": 30.0, "proportional": proportional}
    alone = [
        evaluate(
            progress_grid(jobs, total, batch_choices=8, fixed_batch=False, gpus_per_node=per_node),
            **settings,
        )
        for jobs, total, per_node in ((first, 48, 8), (second, 20, 4))
    ]
    together = evaluate(
        progress_grid(
            first + second,
            [48] * len(first) + [20] * len(second),
            batch_choices=8,
            fixed_batch=False,
            gpus_per_node=[8] * len(first) + [4] * len(second),
        ),
        **settings,
    )
    rows = [(0, r) for r in range(len(first))] + [(1, r) for r in range(len(second))]
    for row, (part, own) in enumerate(rows):
        assert by_gpus(together, row) == by_gpus(alone[part], own)
        assert together.preferred[row] == alone[part].preferred[own]
    # Both clusters' shapes took part: some options exist on one and not the other.
    assert np.any(together.gpus[: len(first)] > 20)
    assert together.gpus.shape[1] > min(part.gpus.shape[1] for part in alone)
