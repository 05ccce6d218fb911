"""Elastic jobs on a cluster of several GPU types: the type each job runs on, and its GPUs
and batch size there.

A job is given as a ``TypedJob``: one ``ElasticJob`` per GPU type it accepts (its
*variants*, first choice first), each with that type's speed model and per-GPU batch
limits, and the type it runs on now. ``optimize_types`` returns the same ``Plan`` as
``optimize`` plus the type of every allocation. A gang never spans types here.

Objective
---------
The same as ``optimize``'s, summed over types, with one change: a job's speed-ups on every
type are counted against one reference, its progress on one GPU at ``b0`` of the slowest
type it accepts, so that a GPU of a faster type is worth more to it. A running job that
would move to another type pays a restart there whatever the size (its current progress is
its own type's), and keeps its fairness standing (it is not dropped by moving). The
fairness bonuses are set once over all variants, so they dominate the objective on every
type alike.

Assignment
----------
With several capacities the exact program is a knapsack in as many dimensions as types.
Instead, each type ``t`` keeps the last row ``best_t[c]`` of its own dynamic programme (the
best value of the jobs assigned to it with at most ``c`` units), and the value of adding a
job ``j`` to it is exact and cheap: ``max_g best_t[C_t - g] + v_j(g) - best_t[C_t]``.

1. Running jobs start on their own type.
2. Queued jobs go to the type where adding them is worth most (ties: the first type they
   name), those with the most to lose from a wrong type first: ordered by the gap between
   their worth alone on their best type and on their second best (a job with one type
   first of all). In the order given instead, a job that gains little from the fast type
   could take it before one that gains much, which then went to the slow type: with one
   H100 and one A100 free, an A3C job (1.1x faster on the H100) arriving before a
   Transformer (2.7x) kept the H100.
3. A running job moves to another type when adding it there is worth more than the most
   it can be worth where it is (``max_g v_j(g)``), which bounds what its own type loses
   without it: every move raises the objective. A type that lost a job is offered no other
   until its row is recomputed, which happens once per sweep over the running jobs (at
   most one sweep per type).
4. Each type's jobs are solved exactly by the programme kept for it (recomputed where it
   lost a job), walked back as ``optimize`` walks its own.

Evaluating a job on a type costs ``O(K)`` for ``K`` options, so the assignment adds little
to the per-type programmes, whose capacities sum to the cluster's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ffdl.elastic.choices import DEFAULT_GPUS_PER_NODE
from ffdl.elastic.optimizer import (
    OBJECTIVES,
    Allocation,
    ElasticJob,
    Objective,
    Plan,
    _add_fairness_terms,
    _evaluate,
    _Options,
    reaching,
    useful_progress,
)
from ffdl.elastic.throughput import FloatArray


@dataclass(frozen=True, slots=True)
class TypedJob:
    """One job as it would run on each GPU type it may run on (``variants``, first choice
    first, all with the same id), and the type it runs on now (None while queued). A running
    job offered no variant on its own type must move (``ffdl scale --gpu-type``); the
    variant it is offered then stands for where it runs now too."""

    variants: Mapping[str, ElasticJob]
    current_type: str | None = None

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError("a typed job needs at least one GPU type")
        ids = {job.id for job in self.variants.values()}
        if len(ids) != 1:
            raise ValueError(f"a typed job's variants must share one id, got {sorted(ids)}")
        running = [t for t, job in self.variants.items() if job.running]
        if running and self.current_type is None:
            raise ValueError(f"job {self.id}: a running job needs its current_type")

    @property
    def id(self) -> str:
        return next(iter(self.variants.values())).id

    @property
    def home(self) -> ElasticJob:
        """The variant on its current type (else its first choice)."""
        own = self.variants.get(self.current_type or "")
        return own if own is not None else next(iter(self.variants.values()))


@dataclass(frozen=True, slots=True)
class TypedPlan:
    """``plan`` as ``optimize`` gives it, and the type of each allocation (None: no GPUs)."""

    plan: Plan
    gpu_types: tuple[str | None, ...]


def optimize_types(
    jobs: Sequence[TypedJob],
    gpus_by_type: Mapping[str, int],
    *,
    restart_penalty: float = 0.1,
    batch_choices: int = 8,
    fairness_after_s: float = 600.0,
    fixed_batch: bool = False,
    gpus_per_node: int | Mapping[str, int] = DEFAULT_GPUS_PER_NODE,
    restart_cost_s: float | None = None,
    admit_after_s: float | None = None,
    objective: Objective = "throughput",
) -> TypedPlan:
    """Type, GPUs and batch size for every job; see the module docstring."""
    if any(count < 0 for count in gpus_by_type.values()):
        raise ValueError("GPU counts by type must be >= 0")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}")
    ids = [job.id for job in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("job ids must be unique")
    per_node = {
        t: (gpus_per_node if isinstance(gpus_per_node, int) else gpus_per_node.get(t, 1))
        for t in gpus_by_type
    }
    if any(size < 1 for size in per_node.values()):
        raise ValueError("gpus_per_node must be >= 1")
    if not jobs:
        return TypedPlan(Plan(allocations=(), objective=0.0, changed=()), ())

    # One row per (job, accepted type that the cluster has).
    rows: list[tuple[int, str]] = [
        (j, t) for j, job in enumerate(jobs) for t in job.variants if gpus_by_type.get(t, 0) > 0
    ]
    if not rows:
        nothing = tuple(Allocation(job.id, 0, None, 0.0) for job in jobs)
        stopped = tuple(job.id for job in jobs if job.home.running)
        return TypedPlan(
            Plan(allocations=nothing, objective=0.0, changed=stopped), (None,) * len(jobs)
        )
    variants = [_variant(jobs[j], t) for j, t in rows]
    anchors = _anchors(jobs, rows, per_node)
    by_type: dict[str, list[int]] = {}
    for r, (_, t) in enumerate(rows):
        by_type.setdefault(t, []).append(r)
    parts = {
        t: _evaluate(
            [variants[r] for r in members],
            gpus_by_type[t],
            gpus_per_node=per_node[t],
            anchors=(anchors[0][members], anchors[1][members]),
            moving=[jobs[rows[r][0]].current_type not in (None, t) for r in members],
            restart_penalty=restart_penalty,
            batch_choices=batch_choices,
            fixed_batch=fixed_batch,
            restart_cost_s=restart_cost_s,
            proportional=objective == "proportional",
        )
        for t, members in by_type.items()
    }
    order = [r for members in by_type.values() for r in members]
    options = _stack([parts[t] for t in by_type])
    options = _take(options, np.argsort(order))  # rows back in ``rows`` order
    preemptible = _add_fairness_terms(
        variants,
        options,
        fairness_after_s,
        fairness_after_s if admit_after_s is None else admit_after_s,
    )
    unit = math.gcd(*(job.home.gpus_per_learner for job in jobs))
    capacity = {t: gpus_by_type[t] // unit for t in by_type}
    chosen = _assign(jobs, rows, options, capacity, unit)
    assigned = {rows[r][0]: r for r in chosen}

    allocations: list[Allocation] = []
    types: list[str | None] = []
    changed: list[str] = []
    yielded: list[str] = []
    achieved = 0.0
    for j, job in enumerate(jobs):
        row = assigned.get(j)
        k = chosen[row] if row is not None else 0
        kind = rows[row][1] if row is not None else None
        gpus = int(options.gpus[row, k]) if row is not None else 0
        batch = int(options.batches[row, k]) if row is not None and gpus else None
        progress = float(options.progress[row, k]) if row is not None else 0.0
        on = kind if gpus else None
        allocations.append(Allocation(job.id, gpus, batch, progress))
        types.append(on)
        home = job.home
        if row is not None:
            achieved += float(options.utility[row, k])
            if preemptible[row] and gpus == 0:
                yielded.append(job.id)
        if home.running and (
            gpus != home.current_gpus
            or (gpus and batch != home.effective_current_batch)
            or (gpus and on != job.current_type)
        ):
            changed.append(job.id)
    plan = Plan(
        allocations=tuple(allocations),
        objective=achieved,
        changed=tuple(changed),
        yielded=tuple(yielded),
    )
    return TypedPlan(plan, tuple(types))


def _variant(job: TypedJob, gpu_type: str) -> ElasticJob:
    """The job's variant on ``gpu_type``; on a type it does not run on, a running job's
    machines there are not known (it would be placed afresh)."""
    variant = job.variants[gpu_type]
    home = job.home
    same = (variant.current_gpus, variant.current_batch, variant.current_nodes) == (
        home.current_gpus,
        home.current_batch,
        None,
    )
    if job.current_type is not None and gpu_type != job.current_type and not same:
        return replace(
            variant,
            current_gpus=home.current_gpus,
            current_batch=home.current_batch,
            current_nodes=None,
        )
    return variant


def _anchors(
    jobs: Sequence[TypedJob], rows: Sequence[tuple[int, str]], per_node: Mapping[str, int]
) -> tuple[FloatArray, FloatArray]:
    """Per row: the job's reference (one GPU at ``b0`` on the slowest type it accepts) and
    its progress now (on its own type)."""
    reference: dict[int, float] = {}
    current: dict[int, float] = {}
    for j, t in rows:
        variant = jobs[j].variants[t]
        one = useful_progress(variant, 1, variant.base_batch, gpus_per_node=per_node[t])
        if one <= 0:
            raise ValueError(f"job {variant.id}: its progress on one {t} GPU must be > 0")
        reference[j] = min(reference.get(j, math.inf), one)
    for j, job in enumerate(jobs):
        home = job.home
        if home.running:
            own = job.current_type in job.variants
            current[j] = useful_progress(
                home,
                home.current_gpus,
                home.effective_current_batch,
                gpus_per_node=per_node.get(str(job.current_type), DEFAULT_GPUS_PER_NODE),
                nodes=home.current_nodes if own else None,
            )
    refs = np.array([reference[j] for j, _ in rows], dtype=np.float64)
    nows = np.array([current.get(j, reference[j]) for j, _ in rows], dtype=np.float64)
    return refs, nows


class _Programme:
    """One type's dynamic programme: the rows (job variants) planned there, in order, and
    the table after each (``table[0]`` is no job; ``table[i + 1][c]`` the best value of the
    first ``i + 1`` with at most ``c`` units)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.members: list[int] = []
        self.table: list[FloatArray] = [np.zeros(capacity + 1)]

    @property
    def best(self) -> FloatArray:
        return self.table[-1]

    def add(self, row: int, sizes: Sequence[int], values: Sequence[float]) -> None:
        self.members.append(row)
        self.table.append(_extend(self.table[-1], sizes, values))

    def rebuild(self, sizes: Sequence[Sequence[int]], values: Sequence[Sequence[float]]) -> None:
        members, self.members, self.table = self.members, [], self.table[:1]
        for row in members:
            self.add(row, sizes[row], values[row])

    def walk_back(
        self,
        sizes: Sequence[Sequence[int]],
        values: Sequence[Sequence[float]],
        preferred: list[int],
    ) -> dict[int, int]:
        """row -> the option each member takes in the optimum (its current one on ties)."""
        chosen: dict[int, int] = {}
        remaining = self.capacity
        for i in range(len(self.members) - 1, -1, -1):
            row = self.members[i]
            target = float(self.table[i + 1][remaining])
            k = reaching(sizes[row], values[row], preferred[row], self.table[i], remaining, target)
            chosen[row] = k
            remaining -= sizes[row][k]
        return chosen


def _assign(
    jobs: Sequence[TypedJob],
    rows: Sequence[tuple[int, str]],
    options: _Options,
    capacity: Mapping[str, int],
    unit: int,
) -> dict[int, int]:
    """row -> the option it takes, for the row (variant on one type) each job is planned
    on; steps 1-4 of the module docstring."""
    sizes = (options.gpus // unit).tolist()
    values = options.value.tolist()
    rows_of: dict[int, list[int]] = {}
    for r, (j, _) in enumerate(rows):
        rows_of.setdefault(j, []).append(r)
    programmes = {t: _Programme(c) for t, c in capacity.items()}
    assigned: dict[int, int] = {}
    stale: set[str] = set()  # types that lost a job since their table was computed

    # Per row and option: the units left on its type after it, and its value (-inf for an
    # option it cannot have there).
    room = np.array([capacity[t] for _, t in rows], dtype=np.int64)[:, None]
    left = room - options.gpus // unit
    worth = np.where(left >= 0, options.value, -math.inf)
    left = np.maximum(left, 0)

    def gain(r: int) -> float:
        programme = programmes[rows[r][1]]
        top = programme.best
        return float((top[left[r]] + worth[r]).max()) - float(top[programme.capacity])

    def add(j: int, r: int) -> None:
        assigned[j] = r
        programmes[rows[r][1]].add(r, sizes[r], values[r])

    queued: list[int] = []
    for j, job in enumerate(jobs):
        home_rows = [r for r in rows_of.get(j, []) if rows[r][1] == job.current_type]
        if job.home.running and home_rows:
            add(j, home_rows[0])
        elif j in rows_of:
            queued.append(j)
    for j in sorted(queued, key=lambda j: -_regret([float(worth[r].max()) for r in rows_of[j]])):
        gains = [(gain(r), -i, r) for i, r in enumerate(rows_of[j])]
        add(j, max(gains)[2])
    # Moves, in sweeps: a type that lost a job is not offered one until its table is
    # recomputed, once per sweep, so a sweep costs one programme per type at most.
    running = [j for j in assigned if jobs[j].home.running]
    for _ in range(len(capacity)):
        waiting = False
        for j in running:
            here = assigned[j]
            others = [r for r in rows_of[j] if r != here]
            if not others:
                continue
            worth_here = float(worth[here].max())
            moves = [(gain(r), r) for r in others if rows[r][1] not in stale]
            waiting = waiting or len(moves) < len(others)
            if not moves:
                continue
            top_gain, target = max(moves)
            if top_gain > worth_here + 1e-9 * (1.0 + abs(worth_here)):
                source = rows[here][1]
                programmes[source].members.remove(here)
                stale.add(source)
                add(j, target)
        if not (waiting and stale):
            break
        for t in stale:
            programmes[t].rebuild(sizes, values)
        stale.clear()
    for t in stale:
        programmes[t].rebuild(sizes, values)
    chosen: dict[int, int] = {}
    for programme in programmes.values():
        chosen.update(programme.walk_back(sizes, values, options.preferred))
    return chosen


def _regret(worths: Sequence[float]) -> float:
    """What a job loses if it gets its second-best type instead of its best (each valued
    alone there); infinite for a job with one type."""
    if len(worths) < 2:
        return math.inf
    best, second = sorted(worths, reverse=True)[:2]
    return best - second


def _extend(best: FloatArray, sizes: Sequence[int], values: Sequence[float]) -> FloatArray:
    """The next row of the programme: ``best`` with one more job of these options."""
    capacity = len(best) - 1
    row = best + values[0]
    for size, value in zip(sizes[1:], values[1:], strict=True):
        if value > -math.inf and size <= capacity:
            np.maximum(row[size:], best[: capacity + 1 - size] + value, out=row[size:])
    return row


def _take(options: _Options, rows: npt.NDArray[np.int64]) -> _Options:
    return _Options(
        gpus=options.gpus[rows],
        batches=options.batches[rows],
        progress=options.progress[rows],
        utility=options.utility[rows],
        value=options.value[rows],
        preferred=[options.preferred[r] for r in rows.tolist()],
    )


def _stack(parts: Sequence[_Options]) -> _Options:
    """Options of several evaluations as one, padded to the widest with options that do not
    exist."""
    width = max(part.gpus.shape[1] for part in parts)

    def pad(array: npt.NDArray[Any], fill: float) -> npt.NDArray[Any]:
        extra = width - array.shape[1]
        return np.pad(array, ((0, 0), (0, extra)), constant_values=fill) if extra else array

    return _Options(
        gpus=np.vstack([pad(p.gpus, 0) for p in parts]),
        batches=np.vstack([pad(p.batches, 0) for p in parts]),
        progress=np.vstack([pad(p.progress, 0.0) for p in parts]),
        utility=np.vstack([pad(p.utility, -math.inf) for p in parts]),
        value=np.vstack([pad(p.value, -math.inf) for p in parts]),
        preferred=[k for p in parts for k in p.preferred],
    )
