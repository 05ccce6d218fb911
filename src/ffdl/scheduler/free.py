"""Free capacity per node, and the indexed working copy a scheduling pass allocates from.

Owns the step from a snapshot to free capacity (node capacity minus what running jobs'
placements hold, plus the concrete GPU ids in use), the learner-slot arithmetic (how many
learners of one size fit in what is free) and two mutable views:

- ``CapacityView``: free GPUs/CPUs/memory of the schedulable nodes, bucketed by free GPU
  count in *pools* (the whole cluster, one per GPU type, one per value of a label) so that
  a placement looks only at nodes with enough free GPUs and a job that cannot fit is
  rejected from pool totals without touching any node.
- ``FreeState``: a ``CapacityView`` that also tracks which GPU ids are free on each node,
  so that starts get concrete, lowest-first GPU ids.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ffdl.core.resources import CPU_SLOTS, Node, Resources
from ffdl.scheduler.snapshot import RunningJob

# Tolerance for fractional CPUs, the same one Resources.fits_in uses.
CPU_EPSILON = 1e-9
# A learner asking for nothing fits any number of times; this stands for "unbounded".
UNBOUNDED_SLOTS = 1 << 30


@dataclass(slots=True)
class NodeFree:
    """What is free on one node; ``gpu_ids`` (ascending) is only kept by ``FreeState``."""

    node: Node
    gpus: int
    cpus: float
    memory_mb: int
    gpu_ids: list[int] = field(default_factory=list)

    @property
    def resources(self) -> Resources:
        return Resources(self.gpus, self.cpus, self.memory_mb)


def slots_for(gpus: int, cpus: float, memory_mb: int, per: Resources) -> int:
    """How many learners needing ``per`` fit into the given free amounts."""
    if gpus < 0 or cpus < -CPU_EPSILON or memory_mb < 0:
        return 0
    slots = UNBOUNDED_SLOTS
    if per.gpus > 0:
        slots = gpus // per.gpus
    if per.cpus > 0:
        slots = min(slots, math.floor((cpus + CPU_EPSILON) / per.cpus))
    if per.memory_mb > 0:
        slots = min(slots, memory_mb // per.memory_mb)
    return slots


def node_slots(free: NodeFree, per: Resources) -> int:
    return slots_for(free.gpus, free.cpus, free.memory_mb, per)


def gpu_ids_in_use(nodes: Sequence[Node], running: Iterable[RunningJob]) -> dict[str, set[int]]:
    """GPU ids held by running jobs on each known node (ids outside the node are ignored)."""
    known = {node.name: node.gpus for node in nodes}
    in_use: dict[str, set[int]] = {name: set() for name in known}
    for job in running:
        for learner in job.placement.learners:
            if learner.node in known:
                limit = known[learner.node]
                in_use[learner.node].update(g for g in learner.gpu_ids if 0 <= g < limit)
    return in_use


def compute_free(nodes: Sequence[Node], running: Iterable[RunningJob]) -> dict[str, NodeFree]:
    """Free capacity of every node: its capacity minus what running learners hold.

    A running learner without recorded GPU ids still takes its GPU count; the free count is
    then the smaller of "capacity minus counts" and "ids nobody holds", so a GPU is never
    handed out twice. Placements on nodes that are no longer known are ignored.
    """
    free = {
        node.name: NodeFree(node, node.gpus, node.cpus, node.memory_mb, [*range(node.gpus)])
        for node in nodes
    }
    used_ids: dict[str, set[int]] = {}
    held: set[str] = set()
    for job in running:
        per = job.per_learner
        for learner in job.placement.learners:
            item = free.get(learner.node)
            if item is None:
                continue
            held.add(learner.node)
            item.gpus -= per.gpus
            item.cpus -= per.cpus
            item.memory_mb -= per.memory_mb
            if learner.gpu_ids:
                used_ids.setdefault(learner.node, set()).update(learner.gpu_ids)
    # Only nodes something runs on differ from their capacity (most, on a large cluster).
    for name in held:
        item = free[name]
        used = used_ids.get(name)
        if used:
            item.gpu_ids = [g for g in item.gpu_ids if g not in used]
        item.gpus = min(item.gpus, len(item.gpu_ids))
    return free


class Pool:
    """A set of schedulable nodes bucketed by free GPUs, with running totals."""

    __slots__ = ("free_cpus", "free_gpus", "free_memory_mb", "levels", "names", "top_hint")

    def __init__(self, max_gpus: int) -> None:
        self.levels: list[dict[str, None]] = [{} for _ in range(max_gpus + 1)]
        self.names: list[str] = []
        self.free_gpus = 0
        self.free_cpus = 0.0
        self.free_memory_mb = 0
        self.top_hint = 0

    @staticmethod
    def level_of(gpus: int, size: int) -> int:
        return min(max(gpus, 0), size - 1)

    def add_all(self, items: Iterable[NodeFree]) -> None:
        """Add nodes (one pass over them: building views is on every pass's path)."""
        levels, size = self.levels, len(self.levels)
        top, gpus, cpus, memory = self.top_hint, 0, 0.0, 0
        for item in items:
            name = item.node.name
            self.names.append(name)
            level = item.gpus if 0 <= item.gpus < size else (0 if item.gpus < 0 else size - 1)
            levels[level][name] = None
            if level > top:
                top = level
            if item.gpus > 0:
                gpus += item.gpus
            if item.cpus > 0:
                cpus += item.cpus
            if item.memory_mb > 0:
                memory += item.memory_mb
        self.top_hint = top
        self.free_gpus += gpus
        self.free_cpus += cpus
        self.free_memory_mb += memory

    def move(self, name: str, before: tuple[int, float, int], after: NodeFree) -> None:
        size = len(self.levels)
        old, new = self.level_of(before[0], size), self.level_of(after.gpus, size)
        if old != new:
            del self.levels[old][name]
            self.levels[new][name] = None
            if new > self.top_hint:
                self.top_hint = new
        self.free_gpus += max(after.gpus, 0) - max(before[0], 0)
        self.free_cpus += max(after.cpus, 0.0) - max(before[1], 0.0)
        self.free_memory_mb += max(after.memory_mb, 0) - max(before[2], 0)

    @property
    def top(self) -> int:
        """The largest free GPU count on any node of the pool (the largest free block)."""
        level = self.top_hint
        while level > 0 and not self.levels[level]:
            level -= 1
        self.top_hint = level
        return level

    def nodes_with_free_gpus(self) -> int:
        return sum(len(bucket) for bucket in self.levels[1:])

    def gpu_slot_bound(self, gpus_per_learner: int) -> int:
        """Learners of that GPU size the pool could hold if CPUs and memory never bound."""
        return sum(
            len(self.levels[level]) * (level // gpus_per_learner)
            for level in range(gpus_per_learner, self.top + 1)
        )

    def descending(self, min_level: int) -> Iterable[tuple[int, str]]:
        for level in range(self.top, min_level - 1, -1):
            for name in self.levels[level]:
                yield level, name

    def ascending(self, min_level: int, max_level: int | None = None) -> Iterable[tuple[int, str]]:
        upper = self.top if max_level is None else min(max_level, self.top)
        for level in range(min_level, upper + 1):
            for name in self.levels[level]:
                yield level, name


class CapacityView:
    """Free counts of the schedulable nodes, indexed in pools by free GPUs."""

    def __init__(self, free: dict[str, NodeFree]) -> None:
        self.free = free
        # Nodes out of service (drained): they take nothing, but a queued job's reason names
        # them when they could hold it.
        self.drained: list[Node] = []
        schedulable: list[NodeFree] = []
        by_type: dict[str, list[NodeFree]] = {}
        max_gpus = 0
        for item in free.values():  # one pass: every scheduling pass builds this anew
            node = item.node
            if not node.schedulable:
                self.drained.append(node)
                continue
            schedulable.append(item)
            by_type.setdefault(node.gpu_type, []).append(item)
            if node.gpus > max_gpus:
                max_gpus = node.gpus
        # A cluster of hosts without GPUs, whose "GPUs" are CPU slots (reasons say so).
        self.cpu_slots_only = bool(free) and all(
            f.node.gpu_type == CPU_SLOTS for f in free.values()
        )
        self._max_gpus = max_gpus
        self.all = Pool(self._max_gpus)
        self.all.add_all(schedulable)
        self._by_type: dict[str, Pool] = {}
        for gpu_type, items in by_type.items():
            self._by_type[gpu_type] = Pool(self._max_gpus)
            self._by_type[gpu_type].add_all(items)
        # Pools a node is in beyond the whole cluster's and its type's (label groups, sets
        # of types), added as they are built.
        self._extra_pools: dict[str, list[Pool]] = {}
        self._by_label: dict[str, dict[str, Pool]] = {}
        self._by_types: dict[tuple[str, ...], Pool | None] = {}
        self.version = 0

    @property
    def gpu_types(self) -> list[str]:
        """The GPU types of the schedulable nodes."""
        return list(self._by_type)

    @property
    def mixed_types(self) -> bool:
        """Whether the schedulable nodes have more than one GPU type."""
        return len(self._by_type) > 1

    def pool_for(self, gpu_types: tuple[str, ...]) -> Pool | None:
        """The pool a job may use: the whole cluster (no types named), or the nodes of the
        GPU types it accepts (None when there are none)."""
        if not gpu_types:
            return self.all
        if len(gpu_types) == 1:
            return self._by_type.get(gpu_types[0])
        key = tuple(sorted(set(gpu_types)))
        if key not in self._by_types:
            items = [
                self.free[name] for kind in key if kind in self._by_type
                for name in self._by_type[kind].names
            ]  # fmt: skip
            pool = None
            if items:
                pool = Pool(self._max_gpus)
                pool.add_all(items)
                for item in items:
                    self._extra_pools.setdefault(item.node.name, []).append(pool)
            self._by_types[key] = pool
        return self._by_types[key]

    def label_groups(self, key: str) -> dict[str, Pool]:
        """One pool per value of label ``key`` (built on first use, then kept up to date)."""
        groups = self._by_label.get(key)
        if groups is None:
            members: dict[str, list[NodeFree]] = {}
            for name in self.all.names:
                item = self.free[name]
                value = item.node.labels.get(key)
                if value is not None:
                    members.setdefault(value, []).append(item)
            groups = {}
            for value in sorted(members):
                pool = groups[value] = Pool(self._max_gpus)
                pool.add_all(members[value])
                for item in members[value]:
                    self._extra_pools.setdefault(item.node.name, []).append(pool)
            self._by_label[key] = groups
        return groups

    def set_free(self, name: str, gpus: int, cpus: float, memory_mb: int) -> None:
        item = self.free[name]
        before = (item.gpus, item.cpus, item.memory_mb)
        item.gpus, item.cpus, item.memory_mb = gpus, cpus, memory_mb
        if item.node.schedulable:
            self.all.move(name, before, item)
            self._by_type[item.node.gpu_type].move(name, before, item)
            for pool in self._extra_pools.get(name, ()):
                pool.move(name, before, item)
        self.version += 1

    def subtract(self, name: str, amount: Resources) -> None:
        item = self.free[name]
        self.set_free(
            name,
            item.gpus - amount.gpus,
            item.cpus - amount.cpus,
            item.memory_mb - amount.memory_mb,
        )

    def add(self, name: str, amount: Resources) -> None:
        item = self.free[name]
        self.set_free(
            name,
            item.gpus + amount.gpus,
            item.cpus + amount.cpus,
            item.memory_mb + amount.memory_mb,
        )


class FreeState(CapacityView):
    """The pass's working copy of free capacity, with concrete free GPU ids per node."""

    def __init__(self, nodes: Sequence[Node], running: Iterable[RunningJob]) -> None:
        super().__init__(compute_free(nodes, running))

    def allocate(self, name: str, per: Resources, learners: int) -> list[tuple[int, ...]]:
        """Take ``learners`` learners of ``per`` on a node; each gets the lowest free GPU ids."""
        item = self.free[name]
        taken = item.gpu_ids[: per.gpus * learners]
        del item.gpu_ids[: per.gpus * learners]
        self.subtract(name, per.scaled(learners))
        return [tuple(taken[i * per.gpus : (i + 1) * per.gpus]) for i in range(learners)]

    def release(self, name: str, amount: Resources, gpu_ids: Iterable[int]) -> None:
        """Give back resources (and their GPU ids) on a node."""
        item = self.free[name]
        returned = [g for g in gpu_ids if 0 <= g < item.node.gpus and g not in item.gpu_ids]
        item.gpu_ids = sorted([*item.gpu_ids, *returned])
        self.add(name, amount)

    def claim(self, name: str, amount: Resources, gpu_ids: Iterable[int]) -> None:
        """Mark resources (and those GPU ids) as held again, e.g. by a checkpointing job."""
        item = self.free[name]
        claimed = set(gpu_ids)
        item.gpu_ids = [g for g in item.gpu_ids if g not in claimed]
        self.subtract(name, amount)
