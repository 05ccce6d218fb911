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

Cost
----
Every (job, type) variant is valued in one pass (``ffdl.elastic.options``: rows may sit on
clusters of different sizes). Evaluating a job on a type costs ``O(K)`` for ``K`` options,
so the assignment adds little to the per-type programmes, whose capacities sum to the
cluster's. Both look only at a job's *rising* options, those worth more than every smaller
one of the same job: a programme's row never falls as units grow, so an option worth no
more than a smaller one can neither extend the row nor be the best addition (about 3 of a
job's 7 real options on the benchmark's mix). A running job's move to a type is not valued
at all when its best option there, alone, could not beat where it is (``max_g v_j(g)``
bounds what adding it can gain).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ffdl.elastic.choices import DEFAULT_GPUS_PER_NODE
from ffdl.elastic.optimizer import (
    OBJECTIVES,
    Allocation,
    ElasticJob,
    Objective,
    Plan,
    _add_fairness_terms,
    reaching,
    useful_progress,
)
from ffdl.elastic.options import IntArray, Options, ProgressGrid, evaluate, progress_grid
from ffdl.elastic.throughput import FloatArray


@dataclass(frozen=True, slots=True)
class TypedJob:
    """One job as it would run on each GPU type it may run on (``variants``, first choice
    first, all with the same id), and the type it runs on now (None while queued). A running
    job offered no variant on its own type must move (``ffdl scale --gpu-type``); the
    variant it is offered then stands for where it runs now too."""

    variants: Mapping[str, ElasticJob]
    current_type: str | None = None
    _home: ElasticJob = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError("a typed job needs at least one GPU type")
        ids = {job.id for job in self.variants.values()}
        if len(ids) != 1:
            raise ValueError(f"a typed job's variants must share one id, got {sorted(ids)}")
        running = [t for t, job in self.variants.items() if job.running]
        if running and self.current_type is None:
            raise ValueError(f"job {ids.pop()}: a running job needs its current_type")
        own = self.variants.get(self.current_type or "")
        home = own if own is not None else next(iter(self.variants.values()))
        object.__setattr__(self, "_home", home)  # asked for often, by every pass over jobs

    @property
    def id(self) -> str:
        return self._home.id

    @property
    def home(self) -> ElasticJob:
        """The variant on its current type (else its first choice)."""
        return self._home


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
    turn_s: float | None = None,
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
    grid = progress_grid(
        variants,
        [gpus_by_type[t] for _, t in rows],
        batch_choices=batch_choices,
        fixed_batch=fixed_batch,
        gpus_per_node=[per_node[t] for _, t in rows],
    )
    options = evaluate(
        grid,
        restart_penalty=restart_penalty,
        restart_cost_s=restart_cost_s,
        proportional=objective == "proportional",
        anchors=_anchors(jobs, rows, grid, per_node),
        moving=np.array([jobs[j].current_type not in (None, t) for j, t in rows], dtype=bool),
    )
    preemptible = _add_fairness_terms(
        variants,
        options,
        fairness_after_s,
        fairness_after_s if admit_after_s is None else admit_after_s,
        fairness_after_s if turn_s is None else turn_s,
    )
    unit = math.gcd(*(job.home.gpus_per_learner for job in jobs))
    capacity = {t: gpus_by_type[t] // unit for _, t in rows}
    chosen = _assign(jobs, rows, options, capacity, unit)

    planned = [(rows[r][0], r, k) for r, k in chosen.items()]  # (job, row, option)
    at_row = np.array([r for _, r, _ in planned], dtype=np.int64)
    at_option = np.array([k for _, _, k in planned], dtype=np.int64)
    outcome = {
        j: (r, gpus, batch, progress, utility)
        for (j, r, _), gpus, batch, progress, utility in zip(
            planned,
            options.gpus[at_row, at_option].tolist(),
            options.batches[at_row, at_option].tolist(),
            options.progress[at_row, at_option].tolist(),
            options.utility[at_row, at_option].tolist(),
            strict=True,
        )
    }
    allocations: list[Allocation] = []
    types: list[str | None] = []
    changed: list[str] = []
    yielded: list[str] = []
    achieved = 0.0
    for j, job in enumerate(jobs):
        row, gpus, batch, progress, utility = outcome.get(j, (None, 0, 0, 0.0, 0.0))
        on = rows[row][1] if row is not None and gpus else None
        allocations.append(Allocation(job.id, gpus, batch if gpus else None, progress))
        types.append(on)
        home = job.home
        if row is not None:
            achieved += utility
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
    if job.current_type is None or gpu_type == job.current_type:
        return variant
    home = job.home
    if (variant.current_gpus, variant.current_batch, variant.current_nodes) == (
        home.current_gpus,
        home.current_batch,
        None,
    ):
        return variant
    return replace(
        variant,
        current_gpus=home.current_gpus,
        current_batch=home.current_batch,
        current_nodes=None,
    )


def _anchors(
    jobs: Sequence[TypedJob],
    rows: Sequence[tuple[int, str]],
    grid: ProgressGrid,
    per_node: Mapping[str, int],
) -> tuple[FloatArray, FloatArray]:
    """Per row: the job's reference (one GPU at ``b0`` on the slowest type it accepts) and
    its progress now (on its own type)."""
    for r in np.flatnonzero(grid.reference <= 0).tolist():
        j, t = rows[r]
        raise ValueError(f"job {jobs[j].id}: its progress on one {t} GPU must be > 0")
    job_of = np.array([j for j, _ in rows], dtype=np.int64)
    reference = np.full(len(jobs), np.inf)
    np.minimum.at(reference, job_of, grid.reference)
    # A row on the job's own type evaluated its progress now; a queued job's is its reference.
    current = reference.copy()
    evaluated: set[int] = set()
    for r, (j, t) in enumerate(rows):
        if t == jobs[j].current_type and jobs[j].home.running:
            current[j] = grid.current[r]
            evaluated.add(j)
    for j, job in enumerate(jobs):
        home = job.home
        if home.running and j not in evaluated:  # its type is gone or not among its own
            own = job.current_type in job.variants
            current[j] = useful_progress(
                home,
                home.current_gpus,
                home.effective_current_batch,
                gpus_per_node=per_node.get(str(job.current_type), DEFAULT_GPUS_PER_NODE),
                nodes=home.current_nodes if own else None,
            )
    return reference[job_of], current[job_of]


class _Programme:
    """One type's dynamic programme: the rows (job variants) planned there, in order, and
    the table after each (``table[0]`` is no job; ``table[i + 1][c]`` the best value of the
    first ``i + 1`` with at most ``c`` units)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.members: list[int] = []
        self.table: list[FloatArray] = [np.zeros(capacity + 1)]
        self._scratch = np.empty(capacity + 1)

    @property
    def best(self) -> FloatArray:
        return self.table[-1]

    def add(self, row: int, options: _Rising) -> None:
        self.members.append(row)
        self.table.append(_extend(self.table[-1], options, self._scratch))

    def rebuild(self, rising: _RisingOptions) -> None:
        members, self.members, self.table = self.members, [], self.table[:1]
        for row in members:
            self.add(row, rising[row])

    def walk_back(self, units: IntArray, value: FloatArray, preferred: list[int]) -> dict[int, int]:
        """row -> the option each member takes in the optimum (its current one on ties);
        ``units`` and ``value`` per row and option."""
        chosen: dict[int, int] = {}
        remaining = self.capacity
        for i in range(len(self.members) - 1, -1, -1):
            row = self.members[i]
            sizes: list[int] = units[row].tolist()
            target = float(self.table[i + 1][remaining])
            k = reaching(
                sizes, value[row].tolist(), preferred[row], self.table[i], remaining, target
            )
            chosen[row] = k
            remaining -= sizes[k]
        return chosen


def _assign(
    jobs: Sequence[TypedJob],
    rows: Sequence[tuple[int, str]],
    options: Options,
    capacity: Mapping[str, int],
    unit: int,
) -> dict[int, int]:
    """row -> the option it takes, for the row (variant on one type) each job is planned
    on; steps 1-4 of the module docstring."""
    units = options.gpus // unit
    rising = _RisingOptions(units, options.value)
    rows_of: dict[int, list[int]] = {}
    for r, (j, _) in enumerate(rows):
        rows_of.setdefault(j, []).append(r)
    programmes = {t: _Programme(c) for t, c in capacity.items()}
    assigned: dict[int, int] = {}
    stale: set[str] = set()  # types that lost a job since their table was computed

    # Per row and option: its value, -inf for an option larger than its type.
    room = np.array([capacity[t] for _, t in rows], dtype=np.int64)[:, None]
    worth = np.where(units <= room, options.value, -math.inf)
    # The most a row can add to its type, whatever is there already: ``gain`` never exceeds
    # it, since the best value of the others never grows as they lose units (but for the
    # rounding of sums of large values: ``could_exceed``).
    most: list[float] = worth.max(axis=1).tolist()

    def could_exceed(r: int, bar: float) -> bool:
        programme = programmes[rows[r][1]]
        total = abs(float(programme.best[programme.capacity]))
        return most[r] + 1e-12 * (1.0 + total + abs(most[r])) > bar

    def gain(r: int) -> float:
        # Only options worth more than every smaller one can be the best addition, as in
        # ``_extend``: what is left for the others shrinks with the size.
        programme = programmes[rows[r][1]]
        top, room = programme.best, programme.capacity
        whole = float(top[room])
        none, kept = rising[r]
        best = whole + none
        for size, value in kept:
            if size > room:
                break
            best = max(best, float(top[room - size]) + value)
        return best - whole

    def add(j: int, r: int) -> None:
        assigned[j] = r
        programmes[rows[r][1]].add(r, rising[r])

    queued: list[int] = []
    for j, job in enumerate(jobs):
        home_rows = [r for r in rows_of.get(j, []) if rows[r][1] == job.current_type]
        if job.home.running and home_rows:
            add(j, home_rows[0])
        elif j in rows_of:
            queued.append(j)
    for j in sorted(queued, key=lambda j: -_regret([most[r] for r in rows_of[j]])):
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
            worth_here = most[here]
            bar = worth_here + 1e-9 * (1.0 + abs(worth_here))
            offered = [r for r in others if rows[r][1] not in stale]
            waiting = waiting or len(offered) < len(others)
            # A row whose most falls short of the bar cannot be the move.
            moves = [(gain(r), r) for r in offered if could_exceed(r, bar)]
            if not moves:
                continue
            top_gain, target = max(moves)
            if top_gain > bar:
                source = rows[here][1]
                programmes[source].members.remove(here)
                stale.add(source)
                add(j, target)
        if not (waiting and stale):
            break
        for t in stale:
            programmes[t].rebuild(rising)
        stale.clear()
    for t in stale:
        programmes[t].rebuild(rising)
    chosen: dict[int, int] = {}
    for programme in programmes.values():
        chosen.update(programme.walk_back(units, options.value, options.preferred))
    return chosen


def _regret(worths: Sequence[float]) -> float:
    """What a job loses if it gets its second-best type instead of its best (each valued
    alone there); infinite for a job with one type."""
    if len(worths) < 2:
        return math.inf
    best, second = sorted(worths, reverse=True)[:2]
    return best - second


# One job's options that can win in a programme: (units, value), ascending in both.
_Rising = tuple[float, list[tuple[int, float]]]


class _RisingOptions:
    """Per row, option 0's value and the options worth more than every smaller one of the
    same job, (units, value) ascending in both; worked out for a row when it is first
    asked for (most rows are never planned on their type).

    A programme's row never falls as units grow (it is the best value with *at most* ``c``
    units), so an option worth no more than a smaller one never wins there."""

    def __init__(self, sizes: IntArray, value: FloatArray) -> None:
        self._none: list[float] = value[:, 0].tolist()
        # Options are in ascending GPUs, padding (-inf) last.
        keep = value[:, 1:] > np.maximum.accumulate(value, axis=1)[:, :-1]
        rows, columns = np.nonzero(keep)
        self._kept = list(
            zip(sizes[rows, columns + 1].tolist(), value[rows, columns + 1].tolist(), strict=True)
        )
        self._ends: list[int] = np.cumsum(keep.sum(axis=1)).tolist()

    def __getitem__(self, row: int) -> _Rising:
        start = self._ends[row - 1] if row else 0
        return self._none[row], self._kept[start : self._ends[row]]


def _extend(best: FloatArray, options: _Rising, scratch: FloatArray) -> FloatArray:
    """The next row of the programme: ``best`` with one more job of these options
    (``scratch``: room for one row, overwritten)."""
    capacity = len(best) - 1
    none, rising = options
    row = best + none
    for size, value in rising:
        if size > capacity:
            break
        span = capacity + 1 - size
        shifted = scratch[:span]
        np.add(best[:span], value, out=shifted)
        tail = row[size:]
        np.maximum(tail, shifted, out=tail)
    return row
