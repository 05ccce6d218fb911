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

``KeptFree`` keeps one loop's ``FreeState`` from one pass to the next and brings it up to
date instead of building it again.
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
    """A set of schedulable nodes bucketed by free GPUs, with running totals.

    Within a level, nodes are in the order they were added, then in the order they moved
    in: placement breaks ties in that order. ``restore_order`` puts the levels nodes moved
    into back in the order of addition, as a pool built anew has them.
    """

    __slots__ = (
        "free_cpus",
        "free_gpus",
        "free_memory_mb",
        "levels",
        "moved_into",
        "names",
        "rank",
        "top_hint",
    )

    def __init__(self, max_gpus: int) -> None:
        self.levels: list[dict[str, None]] = [{} for _ in range(max_gpus + 1)]
        self.names: list[str] = []
        self.free_gpus = 0
        self.free_cpus = 0.0
        self.free_memory_mb = 0
        self.top_hint = 0
        self.moved_into: set[int] = set()
        self.rank: dict[str, int] | None = None

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
            self.moved_into.add(new)
            if new > self.top_hint:
                self.top_hint = new
        self.free_gpus += max(after.gpus, 0) - max(before[0], 0)
        self.free_cpus += max(after.cpus, 0.0) - max(before[1], 0.0)
        self.free_memory_mb += max(after.memory_mb, 0) - max(before[2], 0)

    def restore_order(self) -> None:
        """Order the levels nodes moved into as a pool built anew orders them."""
        if self.rank is None:
            self.rank = {name: index for index, name in enumerate(self.names)}
        rank = self.rank.__getitem__
        for level in self.moved_into:
            if len(self.levels[level]) > 1:
                self.levels[level] = dict.fromkeys(sorted(self.levels[level], key=rank))
        self.moved_into.clear()

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

    def pools(self) -> Iterable[Pool]:
        """Every pool built so far."""
        yield self.all
        yield from self._by_type.values()
        for groups in self._by_label.values():
            yield from groups.values()
        yield from (pool for pool in self._by_types.values() if pool is not None)

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
        # What each node held before the pass changed it; kept only while a ``KeptFree``
        # will put the state back after the pass.
        self._before: dict[str, tuple[int, float, int, list[int]]] | None = None

    def set_free(self, name: str, gpus: int, cpus: float, memory_mb: int) -> None:
        self._remember(name)
        super().set_free(name, gpus, cpus, memory_mb)

    def allocate(self, name: str, per: Resources, learners: int) -> list[tuple[int, ...]]:
        """Take ``learners`` learners of ``per`` on a node; each gets the lowest free GPU ids."""
        self._remember(name)
        item = self.free[name]
        taken = item.gpu_ids[: per.gpus * learners]
        del item.gpu_ids[: per.gpus * learners]
        self.subtract(name, per.scaled(learners))
        return [tuple(taken[i * per.gpus : (i + 1) * per.gpus]) for i in range(learners)]

    def release(self, name: str, amount: Resources, gpu_ids: Iterable[int]) -> None:
        """Give back resources (and their GPU ids) on a node."""
        self._remember(name)
        item = self.free[name]
        returned = [g for g in gpu_ids if 0 <= g < item.node.gpus and g not in item.gpu_ids]
        item.gpu_ids = sorted([*item.gpu_ids, *returned])
        self.add(name, amount)

    def claim(self, name: str, amount: Resources, gpu_ids: Iterable[int]) -> None:
        """Mark resources (and those GPU ids) as held again, e.g. by a checkpointing job."""
        self._remember(name)
        item = self.free[name]
        claimed = set(gpu_ids)
        item.gpu_ids = [g for g in item.gpu_ids if g not in claimed]
        self.subtract(name, amount)

    def _remember(self, name: str) -> None:
        before = self._before
        if before is not None and name not in before:
            item = self.free[name]
            before[name] = (item.gpus, item.cpus, item.memory_mb, [*item.gpu_ids])

    def _put(self, name: str, gpus: int, cpus: float, memory_mb: int, gpu_ids: list[int]) -> None:
        """Set a node's free capacity outright, remembering nothing."""
        self.free[name].gpu_ids = gpu_ids
        CapacityView.set_free(self, name, gpus, cpus, memory_mb)

    def _start_remembering(self) -> None:
        self._before = {}

    def _roll_back(self) -> None:
        """Put back every node the pass changed since ``_start_remembering``."""
        before, self._before = self._before or {}, None
        for name, (gpus, cpus, memory_mb, gpu_ids) in before.items():
            self._put(name, gpus, cpus, memory_mb, gpu_ids)


class KeptFree:
    """One scheduler loop's free capacity, kept between passes and brought up to date.

    At 10,000 nodes, building ``FreeState`` from every node and running job is a fifth of a
    pass, while between two passes only the nodes of jobs that started, ended or moved
    change. ``state`` puts back what the last pass took on paper (what it decided comes
    back as running jobs, or does not), then recomputes only the nodes whose running jobs
    differ. A running job is the same while it is the same object (``RunningJobs`` keeps a
    job's object while its row is unchanged; a new object with equal values only costs its
    nodes a recomputation). The nodes changing builds the state anew, and so does every
    ``REBUILD_EVERY``-th pass, so that rounding in the pools' running CPU totals never adds
    up over a long-lived loop. One per loop: a state is not shared between threads.
    """

    REBUILD_EVERY = 64

    def __init__(self) -> None:
        self._state: FreeState | None = None
        self._nodes: tuple[Node, ...] = ()
        self._jobs: dict[str, RunningJob] = {}
        self._on_node: dict[str, set[str]] = {}  # node -> ids of the running jobs there
        self._passes = 0

    def state(self, nodes: Sequence[Node], running: Sequence[RunningJob]) -> FreeState:
        """Free capacity of ``nodes`` with ``running`` holding what they hold: equal to a
        new ``FreeState(nodes, running)``, for the caller to allocate from until the next
        call."""
        nodes = tuple(nodes)
        jobs = {job.id: job for job in running}
        state = self._state
        self._passes += 1
        if (
            state is None
            or nodes != self._nodes
            or len(jobs) != len(running)  # the same id twice: left to the full build
            or self._passes % self.REBUILD_EVERY == 0
        ):
            state = FreeState(nodes, running)
            self._on_node = {}
            self._index(jobs.items())
        else:
            state._roll_back()
            self._bring_up_to_date(state, jobs)
            for pool in state.pools():
                pool.restore_order()
        self._state, self._nodes, self._jobs = state, nodes, jobs
        state._start_remembering()
        return state

    def _index(self, jobs: Iterable[tuple[str, RunningJob]]) -> set[str]:
        touched: set[str] = set()
        on_node = self._on_node
        for job_id, job in jobs:
            for learner in job.placement.learners:
                touched.add(learner.node)
                on_node.setdefault(learner.node, set()).add(job_id)
        return touched

    def _bring_up_to_date(self, state: FreeState, jobs: dict[str, RunningJob]) -> None:
        old, on_node = self._jobs, self._on_node
        dirty: set[str] = set()
        for job_id, job in old.items():
            if jobs.get(job_id) is not job:
                for learner in job.placement.learners:
                    dirty.add(learner.node)
                    on_node.get(learner.node, set()).discard(job_id)
        dirty |= self._index((i, job) for i, job in jobs.items() if old.get(i) is not job)
        if not dirty:
            return
        # Each node is recomputed as ``compute_free`` computes it, jobs in the same order,
        # so that fractional CPUs come out the same to the last bit.
        position = {job_id: index for index, job_id in enumerate(jobs)}
        for name in dirty:
            item = state.free.get(name)
            if item is None:
                continue
            holders = sorted(on_node.get(name, ()), key=position.__getitem__)
            state._put(name, *_free_on(item.node, [jobs[i] for i in holders]))


def _free_on(node: Node, jobs: Iterable[RunningJob]) -> tuple[int, float, int, list[int]]:
    """What is free on one node with ``jobs`` running: ``compute_free`` for one node. (That
    one stays a single pass over every learner, which builds a whole cluster faster than a
    call per node; tests/scheduler/test_kept_free.py holds the two to the same results.)"""
    gpus, cpus, memory_mb = node.gpus, node.cpus, node.memory_mb
    gpu_ids = [*range(node.gpus)]
    used: set[int] = set()
    held = False
    for job in jobs:
        per = job.per_learner
        for learner in job.placement.learners:
            if learner.node == node.name:
                held = True
                gpus -= per.gpus
                cpus -= per.cpus
                memory_mb -= per.memory_mb
                used.update(learner.gpu_ids)
    if held:
        if used:
            gpu_ids = [g for g in gpu_ids if g not in used]
        gpus = min(gpus, len(gpu_ids))
    return gpus, cpus, memory_mb, gpu_ids
