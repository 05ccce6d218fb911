"""Gang placement on free capacity: pack, spread, label locality, GPU type, GPU ids.

Owns where the learners of one job go, given what is free:

- ``pack``: the fewest nodes, each filled as far as it goes (largest first); the last node
  is the best fit (fewest free GPUs that still hold the remaining learners). A job that
  fits on one node goes to the fullest node that can take it.
- ``spread``: one learner per node on the emptiest nodes; only when there are fewer
  fitting nodes than learners do nodes take a second learner (round robin).
- ``same_label``: every learner on nodes sharing one value of that label; among the values
  that fit, pack picks the one using the fewest nodes (then the least free capacity),
  spread the one using the most nodes (then the most free capacity).
- ``gpu_types``: only nodes of a GPU type the job accepts, and a gang's GPUs all of one
  type (the job's first choice that fits, else the group the tie-break prefers) unless the
  job sets ``mix_gpu_types``; unschedulable nodes take nothing.

Also owns ``never_fits`` (could the job be placed on the empty cluster at all?) and the
nodes a job could ever use.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import replace
from typing import NamedTuple

from ffdl.core.resources import (
    CPU_SLOTS,
    LearnerPlacement,
    Node,
    Placement,
    Resources,
    slot_noun,
)
from ffdl.scheduler.free import CPU_EPSILON, CapacityView, FreeState, Pool, node_slots, slots_for
from ffdl.scheduler.queue import describe, fmt_number, gang, plural
from ffdl.scheduler.snapshot import QueuedJob

# Node name → how many learners of the job go there, in learner order.
Choice = list[tuple[str, int]]

PACK = "pack"
SPREAD = "spread"


def effective_policy(job: QueuedJob, default: str) -> str:
    policy = job.placement_policy or default
    return SPREAD if policy == SPREAD else PACK


def may_fit(pool: Pool, job: QueuedJob) -> bool:
    """Cheap necessary conditions from pool totals; False means it certainly does not fit."""
    per, learners = job.per_learner, job.learners
    if per.gpus > 0 and (
        pool.top < per.gpus
        or pool.free_gpus < per.gpus * learners
        or pool.gpu_slot_bound(per.gpus) < learners
    ):
        return False
    if per.cpus > 0 and pool.free_cpus + CPU_EPSILON < per.cpus * learners:
        return False
    return not (per.memory_mb > 0 and pool.free_memory_mb < per.memory_mb * learners)


def find_nodes(
    view: CapacityView,
    job: QueuedJob,
    policy: str,
    excluded: Container[str] | None = None,
    *,
    any_fit: bool = False,
) -> Choice | None:
    """Where the whole gang fits on ``view`` (never on ``excluded`` nodes), or None.

    ``any_fit``: only whether it fits matters, so the first label value that holds the gang
    will do (no search for the best one).
    """
    if job.learners < 1:
        return None
    if job.same_label is None and (
        not view.mixed_types
        or job.spans_types
        or len(job.gpu_types) == 1
        or len(job.of_one_type(view.gpu_types)) == 1
    ):
        pool = view.pool_for(job.gpu_types)
        if pool is None or not may_fit(pool, job):
            return None
        return _place_in_pool(view, pool, job, policy, excluded, job.gpu_types)
    # A gang on GPUs of one type (unless it may mix them), and with locality on nodes of one
    # label value: each (type, value) group is a candidate. Visit them in the order of the
    # tie-break (pack: least free first; spread: most free first), so a group reaching the
    # best possible node count (pack: one node; spread: one node per learner) is the answer
    # and the rest need not be placed. A job's own order of GPU types comes first.
    groups: list[tuple[int, Pool, QueuedJob]] = []
    for rank, variant in enumerate(job.of_one_type(view.gpu_types)):
        if job.same_label is None:
            pool = view.pool_for(variant.gpu_types)
            groups.extend([] if pool is None else [(rank, pool, variant)])
        else:
            groups.extend((rank, p, variant) for p in view.label_groups(job.same_label).values())
    ordered = bool(job.gpu_types) and not job.spans_types
    groups.sort(
        key=lambda g: (
            g[0] if ordered else 0,
            (-1 if policy == SPREAD else 1) * g[1].free_gpus,
            (-1 if policy == SPREAD else 1) * g[1].free_cpus,
        )
    )
    ideal = job.learners if policy == SPREAD else 1
    best: Choice | None = None
    best_rank = 0
    for rank, pool, variant in groups:
        if best is not None and ordered and rank > best_rank:
            break  # the best of a type the job prefers
        if not may_fit(pool, job):
            continue
        choice = _place_in_pool(view, pool, variant, policy, excluded, variant.gpu_types)
        if choice is None:
            continue
        best_rank = rank
        if any_fit or len(choice) == ideal:
            return choice
        if (
            best is None
            or (policy == SPREAD and len(choice) > len(best))
            or (policy != SPREAD and len(choice) < len(best))
        ):
            best = choice
    return best


def assign(state: FreeState, job: QueuedJob, choice: Choice) -> Placement:
    """Allocate the chosen nodes on ``state`` and name each learner's GPU ids."""
    learners: list[LearnerPlacement] = []
    for name, count in choice:
        kind = state.free[name].node.gpu_type
        for gpu_ids in state.allocate(name, job.per_learner, count):
            learners.append(LearnerPlacement(len(learners) + 1, name, gpu_ids, kind))
    return Placement(tuple(learners))


def _eligible_slots(
    view: CapacityView,
    name: str,
    per: Resources,
    gpu_types: tuple[str, ...],
    excluded: Container[str] | None,
) -> int:
    if excluded is not None and name in excluded:
        return 0
    item = view.free[name]
    if gpu_types and item.node.gpu_type not in gpu_types:
        return 0
    return node_slots(item, per)


def _place_in_pool(
    view: CapacityView,
    pool: Pool,
    job: QueuedJob,
    policy: str,
    excluded: Container[str] | None,
    gpu_types: tuple[str, ...],
) -> Choice | None:
    if job.per_learner.gpus == 0:
        return _place_without_gpus(view, pool, job, policy, excluded, gpu_types)
    if policy == SPREAD:
        return _spread_by_gpus(view, pool, job, excluded, gpu_types)
    return _pack_by_gpus(view, pool, job, excluded, gpu_types)


def _needed(sorted_slots: Sequence[tuple[int, int, str]], learners: int) -> int:
    """How many of the (largest-first) nodes it takes to hold ``learners``."""
    held = 0
    for count, (slots, _level, _name) in enumerate(sorted_slots, start=1):
        held += slots
        if held >= learners:
            return count
    return len(sorted_slots) + 1


def _pack_by_gpus(
    view: CapacityView,
    pool: Pool,
    job: QueuedJob,
    excluded: Container[str] | None,
    gpu_types: tuple[str, ...],
) -> Choice | None:
    per, learners, gpus = job.per_learner, job.learners, job.per_learner.gpus
    if pool.top >= learners * gpus:
        for _level, name in pool.ascending(learners * gpus):
            if _eligible_slots(view, name, per, gpu_types, excluded) >= learners:
                return [(name, learners)]
    # Visit nodes from the most free GPUs down; a node at level L holds at most L // gpus
    # learners, so once the nodes seen already reach the gang with nodes no smaller than
    # anything unseen could be, the node count is minimal and the scan stops.
    collected: list[tuple[int, int, str]] = []
    total = 0
    lowest_visited = pool.top + 1
    for level in range(pool.top, gpus - 1, -1):
        lowest_visited = level
        # Thousands of empty nodes may share a level. Once ``learners`` of them hold the
        # most any node here can (``full``), the rest of the level changes nothing: sorted
        # largest first (stably, so unseen nodes would come after these), the fewest nodes
        # that hold the gang are among those seen, and the last full one seen is at or
        # past them, holding the remainder if any node of this level can.
        most, full = level // gpus, 0
        for name in pool.levels[level]:
            slots = _eligible_slots(view, name, per, gpu_types, excluded)
            if slots > 0:
                collected.append((slots, level, name))
                total += slots
                if slots == most:
                    full += 1
                    if full >= learners:
                        break
        if total >= learners:
            collected.sort(key=lambda c: -c[0])
            needed = _needed(collected, learners)
            if collected[needed - 1][0] >= (level - 1) // gpus:
                break
    if total < learners:
        return None
    collected.sort(key=lambda c: -c[0])
    needed = _needed(collected, learners)
    chosen = collected[: needed - 1]
    remaining = learners - sum(slots for slots, _level, _name in chosen)
    best: tuple[int, str] | None = None
    for slots, level, name in collected[needed - 1 :]:
        if slots >= remaining and (best is None or level < best[0]):
            best = (level, name)
    for level, name in pool.ascending(remaining * gpus, lowest_visited - 1):
        if best is not None and level >= best[0]:
            break
        if _eligible_slots(view, name, per, gpu_types, excluded) >= remaining:
            best = (level, name)
            break
    assert best is not None  # the needed-th collected node holds the remainder
    return [(name, slots) for slots, _level, name in chosen] + [(best[1], remaining)]


def _spread_by_gpus(
    view: CapacityView,
    pool: Pool,
    job: QueuedJob,
    excluded: Container[str] | None,
    gpu_types: tuple[str, ...],
) -> Choice | None:
    per, learners = job.per_learner, job.learners
    collected: list[tuple[int, str]] = []
    for _level, name in pool.descending(per.gpus):
        slots = _eligible_slots(view, name, per, gpu_types, excluded)
        if slots > 0:
            collected.append((slots, name))
            if len(collected) == learners:
                return [(name, 1) for _slots, name in collected]
    return _round_robin(collected, learners)


def _round_robin(collected: Sequence[tuple[int, str]], learners: int) -> Choice | None:
    if sum(slots for slots, _name in collected) < learners:
        return None
    counts = [0] * len(collected)
    remaining = learners
    while remaining:
        for i, (slots, _name) in enumerate(collected):
            if remaining and counts[i] < slots:
                counts[i] += 1
                remaining -= 1
    return [(name, n) for (_slots, name), n in zip(collected, counts, strict=True) if n]


def _place_without_gpus(
    view: CapacityView,
    pool: Pool,
    job: QueuedJob,
    policy: str,
    excluded: Container[str] | None,
    gpu_types: tuple[str, ...],
) -> Choice | None:
    # CPU-only learners: GPU buckets say nothing about fit, so every node is looked at.
    per, learners = job.per_learner, job.learners
    candidates: list[tuple[int, float, int, str]] = []
    for name in pool.names:
        slots = _eligible_slots(view, name, per, gpu_types, excluded)
        if slots > 0:
            item = view.free[name]
            candidates.append((slots, item.cpus, item.memory_mb, name))
    if policy == SPREAD:
        candidates.sort(key=lambda c: (-c[1], -c[2]))
        if len(candidates) >= learners:
            return [(c[3], 1) for c in candidates[:learners]]
        return _round_robin([(c[0], c[3]) for c in candidates], learners)
    whole = [c for c in candidates if c[0] >= learners]
    if whole:
        return [(min(whole, key=lambda c: (c[1], c[2]))[3], learners)]
    if sum(c[0] for c in candidates) < learners:
        return None
    candidates.sort(key=lambda c: -c[0])
    needed = _needed([(c[0], 0, c[3]) for c in candidates], learners)
    chosen = candidates[: needed - 1]
    remaining = learners - sum(c[0] for c in chosen)
    last = min(
        (c for c in candidates[needed - 1 :] if c[0] >= remaining),
        key=lambda c: (c[0], c[1], c[2]),
    )
    return [(c[3], c[0]) for c in chosen] + [(last[3], remaining)]


# ---------------------------------------------------------------------------------------
# Could the job ever fit?  (the empty cluster)


class _NodeClass(NamedTuple):
    """Nodes with the same capacity and GPU type (a tuple: hashed fast for big clusters)."""

    gpus: int
    cpus: float
    memory_mb: int
    gpu_type: str


class ClusterShape:
    """Nodes grouped by identical capacity, so fit-on-empty checks cost per class."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = tuple(nodes)
        self.classes, self.schedulable = self._group(self.nodes)
        self._by_label: dict[str, dict[str, dict[_NodeClass, int]]] = {}
        self._names_by_label: dict[str, dict[str, dict[_NodeClass, list[str]]]] = {}

    @staticmethod
    def _group(
        nodes: Sequence[Node],
    ) -> tuple[dict[_NodeClass, int], dict[_NodeClass, list[str]]]:
        """Nodes per class, and the schedulable ones' names per class (one pass: every
        scheduling pass groups the whole cluster)."""
        classes: dict[_NodeClass, int] = {}
        names: dict[_NodeClass, list[str]] = {}
        for node in nodes:
            key = _NodeClass(node.gpus, node.cpus, node.memory_mb, node.gpu_type)
            classes[key] = classes.get(key, 0) + 1
            if node.schedulable:
                names.setdefault(key, []).append(node.name)
        return classes, names

    def label_classes(self, key: str) -> dict[str, dict[_NodeClass, int]]:
        groups = self._by_label.get(key)
        if groups is None:
            members: dict[str, list[Node]] = {}
            for node in self.nodes:
                value = node.labels.get(key)
                if value is not None:
                    members.setdefault(value, []).append(node)
            grouped = {value: self._group(members[value]) for value in sorted(members)}
            groups = {value: classes for value, (classes, _names) in grouped.items()}
            self._by_label[key] = groups
            self._names_by_label[key] = {value: names for value, (_c, names) in grouped.items()}
        return groups

    def label_names(self, key: str) -> dict[str, dict[_NodeClass, list[str]]]:
        self.label_classes(key)
        return self._names_by_label[key]


_last_shape: ClusterShape | None = None


def cluster_shape(nodes: Sequence[Node]) -> ClusterShape:
    """``ClusterShape(nodes)``, the last one again while the nodes are the same: a cluster
    of thousands of nodes rarely changes between two scheduling passes, and comparing the
    nodes (the same objects, mostly) costs a small part of grouping them."""
    global _last_shape
    last = _last_shape
    nodes = tuple(nodes)
    if last is None or last.nodes != nodes:
        last = _last_shape = ClusterShape(nodes)
    return last


def _typed(classes: dict[_NodeClass, int], gpu_types: tuple[str, ...]) -> dict[_NodeClass, int]:
    if not gpu_types:
        return classes
    return {c: n for c, n in classes.items() if c.gpu_type in gpu_types}


def _class_slots(classes: dict[_NodeClass, int], per: Resources) -> int:
    return sum(slots_for(c.gpus, c.cpus, c.memory_mb, per) * n for c, n in classes.items())


def never_fits_on(job: QueuedJob, shape: ClusterShape) -> str | None:
    """``never_fits`` against a prepared ``ClusterShape`` (reused across a pass)."""
    variants = job.of_one_type({c.gpu_type for c in shape.classes})
    if len(variants) == 1:
        return _never_fits_one(variants[0], shape)
    reasons = []
    for variant in variants:
        reason = _never_fits_one(variant, shape)
        if reason is None:
            return None
        reasons.append(reason)
    if _never_fits_one(replace(job, mix_gpu_types=True), shape) is None:
        return f"{reasons[0]}, and a gang runs on GPUs of one type (mix_gpu_types allows more)"
    return reasons[0]


def _never_fits_one(job: QueuedJob, shape: ClusterShape) -> str | None:
    per, learners = job.per_learner, job.learners
    if learners < 1:
        return "needs at least one learner"
    classes = _typed(shape.classes, job.gpu_types)
    if not classes:
        if job.gpu_types and shape.classes:
            present = sorted({c.gpu_type for c in shape.classes})
            field = f"gpu_type={job.gpu_type}" if job.gpu_type else f"gpu_types {_names(job)}"
            return f"no node has {field} (the cluster's: {', '.join(present)})"
        return "the cluster has no nodes"
    kind = f"{_names(job)} " if job.gpu_types else ""
    # Hosts without GPUs offer CPU slots in their place: say so.
    unit = slot_noun(CPU_SLOTS if all(c.gpu_type == CPU_SLOTS for c in classes) else None)
    if _class_slots(classes, per) == 0:
        most = (
            max(c.gpus for c in classes),
            max(c.cpus for c in classes),
            max(c.memory_mb for c in classes),
        )
        largest = f"the largest {kind}node has"
        if per.gpus > most[0]:
            return f"needs {plural(per.gpus, unit)} per learner but {largest} {most[0]}"
        if per.cpus > most[1] + CPU_EPSILON:
            return (
                f"needs {plural(per.cpus, 'CPU')} per learner but {largest} {fmt_number(most[1])}"
            )
        if per.memory_mb > most[2]:
            return (
                f"needs {per.memory_mb} MiB memory per learner but the largest {kind}node "
                f"has {most[2]} MiB"
            )
        return f"no single {kind}node has {describe(per, unit)} for one learner"
    if job.same_label is None:
        room = _class_slots(classes, per)
        if room >= learners:
            return None
        total = per.scaled(learners)
        gpus = sum(c.gpus * n for c, n in classes.items())
        cpus = sum(c.cpus * n for c, n in classes.items())
        memory = sum(c.memory_mb * n for c, n in classes.items())
        where = f"the {_names(job)} nodes have" if job.gpu_types else "the cluster has"
        if total.gpus > gpus:
            return f"needs {plural(total.gpus, unit)} in total but {where} {gpus}"
        if total.cpus > cpus + CPU_EPSILON:
            return f"needs {fmt_number(total.cpus)} CPUs in total but {where} {fmt_number(cpus)}"
        if total.memory_mb > memory:
            return f"needs {total.memory_mb} MiB memory in total but {where} {memory} MiB"
        return (
            f"needs {gang(learners, describe(per, unit))} but {where} room for only "
            f"{plural(room, 'such learner')}"
        )
    label = job.same_label
    groups = {
        value: _typed(classes_in, job.gpu_types)
        for value, classes_in in shape.label_classes(label).items()
    }
    groups = {value: classes_in for value, classes_in in groups.items() if classes_in}
    if not groups:
        return f"no {kind}node has a {label} label"
    if max(_class_slots(classes_in, per) for classes_in in groups.values()) >= learners:
        return None
    need = f"needs {gang(learners, describe(per, unit))} on {kind}nodes with one {label} value"
    if per.gpus:
        most_gpus = max(sum(c.gpus * n for c, n in g.items()) for g in groups.values())
        return f"{need}; the largest {label} has {plural(most_gpus, unit)}"
    room = max(_class_slots(classes_in, per) for classes_in in groups.values())
    return f"{need}; the largest {label} has room for {plural(room, 'learner')}"


def never_fits(job: QueuedJob, nodes: Sequence[Node]) -> str | None:
    """Why ``job`` could not be placed even on the EMPTY cluster, or None if it could.

    Cordoned (unschedulable) nodes count: a drain is temporary, and rejecting a job at
    submit time is final.
    """
    return never_fits_on(job, ClusterShape(nodes))


def _names(job: QueuedJob) -> str:
    return " or ".join(job.gpu_types)


def usable_nodes(job: QueuedJob, shape: ClusterShape) -> set[str]:
    """Schedulable nodes this job could ever use: a GPU type it accepts, big enough for a
    learner, and (with locality) carrying a label value whose nodes could hold the whole
    gang; a gang of one GPU type needs that type's nodes to hold it."""
    variants = job.of_one_type({c.gpu_type for c in shape.classes})
    usable: set[str] = set()
    for variant in variants:
        if len(variants) == 1 or _never_fits_one(variant, shape) is None:
            usable |= _usable_one(variant, shape)
    return usable


def _usable_one(job: QueuedJob, shape: ClusterShape) -> set[str]:
    per = job.per_learner

    def fitting(c: _NodeClass) -> bool:
        return job.accepts(c.gpu_type) and slots_for(c.gpus, c.cpus, c.memory_mb, per) > 0

    if job.same_label is None:
        return {name for c, names in shape.schedulable.items() if fitting(c) for name in names}
    usable: set[str] = set()
    names_by_value = shape.label_names(job.same_label)
    for value, classes in shape.label_classes(job.same_label).items():
        typed = {c: n for c, n in classes.items() if fitting(c)}
        if _class_slots(typed, per) >= job.learners:
            for c, names in names_by_value[value].items():
                if c in typed:
                    usable.update(names)
    return usable
