"""Turning GPU counts into nodes, the same way for every policy of the comparison.

A job whose GPU count is unchanged keeps its nodes (moving it would cost a restart and gain
nothing). The others are placed largest first: a job that fits on one node goes to the
fullest node it fits on (best fit, keeping whole nodes free for large jobs); a larger one
takes the emptiest nodes first, so it spans as few machines as it can. Any set of counts whose
sum fits the cluster can be placed, by spreading when nothing better is left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class _Shape(Protocol):
    @property
    def nodes(self) -> int: ...

    @property
    def gpus_per_node(self) -> int: ...


def place(
    counts: Mapping[str, int], current: Mapping[str, Mapping[int, int]], shape: _Shape
) -> dict[str, dict[int, int]]:
    """Nodes (node index -> GPUs) for every job with a non-zero count."""
    free = [shape.gpus_per_node] * shape.nodes
    placed: dict[str, dict[int, int]] = {}
    for job_id, gpus in counts.items():
        kept = current.get(job_id) or {}
        if gpus and sum(kept.values()) == gpus:
            placed[job_id] = dict(kept)
            for node, n in kept.items():
                free[node] -= n
    moving = sorted(
        ((job_id, gpus) for job_id, gpus in counts.items() if gpus and job_id not in placed),
        key=lambda item: (-item[1], item[0]),
    )
    for job_id, gpus in moving:
        placed[job_id] = _fit(gpus, free, shape.gpus_per_node)
    return placed


def _fit(gpus: int, free: list[int], per_node: int) -> dict[int, int]:
    if gpus <= per_node:
        fitting = [n for n in range(len(free)) if free[n] >= gpus]
        if fitting:
            node = min(fitting, key=lambda n: (free[n], n))
            free[node] -= gpus
            return {node: gpus}
    taken: dict[int, int] = {}
    left = gpus
    for node in sorted(range(len(free)), key=lambda n: (-free[n], n)):
        if left == 0:
            break
        n = min(free[node], left)
        if n:
            taken[node] = n
            free[node] -= n
            left -= n
    if left:
        raise ValueError(f"{gpus} GPUs do not fit in what is free")
    return taken
