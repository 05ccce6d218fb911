"""``FreeIndex``: the cluster's nodes by free GPUs, which the engine keeps up to date and
the snapshot reductions (``ffdl.sim.snapshots``) read to pick the nodes a pass needs."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ffdl.core.resources import Node

_CPU_EPSILON = 1e-9


class FreeIndex:
    """Nodes by free GPUs, each level in cluster order, kept up to date by the engine.

    A node is *proportional* when its free CPUs and memory are at least its free GPUs times
    the largest CPUs and memory per GPU any job of the run asks for: then GPUs alone bound
    how many learners of any job fit there. Other nodes are listed apart and always kept.
    """

    def __init__(self, nodes: Sequence[Node], cpus_per_gpu: float, memory_per_gpu_mb: float):
        self.nodes = tuple(nodes)
        self.position = {n.name: i for i, n in enumerate(self.nodes)}
        top = max((n.gpus for n in self.nodes), default=0)
        self.levels: list[list[int]] = [[] for _ in range(top + 1)]
        self.irregular: dict[int, int] = {}  # position -> free GPUs, for the other nodes
        self._where: dict[int, tuple[int, bool]] = {}
        self._cpus_per_gpu = cpus_per_gpu
        self._memory_per_gpu_mb = memory_per_gpu_mb

    def update(self, name: str, gpus: int, cpus: float, memory_mb: int) -> None:
        position = self.position[name]
        previous = self._where.get(position)
        if previous is not None:
            level, proportional = previous
            if proportional:
                row = self.levels[level]
                del row[bisect.bisect_left(row, position)]
            else:
                self.irregular.pop(position, None)
        level = max(gpus, 0)
        proportional = (
            cpus + _CPU_EPSILON >= level * self._cpus_per_gpu
            and memory_mb >= level * self._memory_per_gpu_mb
        )
        if proportional:
            bisect.insort(self.levels[level], position)
        else:
            self.irregular[position] = level
        self._where[position] = (level, proportional)

    def subset(self, per_level: int) -> list[Node]:
        """Every irregular node with a free GPU and the first ``per_level`` proportional nodes
        of every free-GPU level from 1 up, in cluster order."""
        chosen = [p for p, level in self.irregular.items() if level > 0]
        for row in self.levels[1:]:
            chosen.extend(row[:per_level])
        chosen.sort()
        return [self.nodes[p] for p in chosen]
