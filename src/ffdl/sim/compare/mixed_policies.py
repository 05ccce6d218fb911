"""The policies compared on mixed GPU types: Gavel's, Pollux treating every GPU alike, FIFO,
and ffdl's optimizer over types.

Each is written from its paper and, for Gavel's, from its published code
(stanford-futuredata/gavel, ``scheduler/policies/``), on the views the mixed engine shows.

- ``fifo``: in arrival order, each job at the GPUs it asked for, on the type with the most
  free GPUs that holds it whole; never preempts; later jobs backfill.
- ``gavel-las`` (Gavel's max-min fairness, its heterogeneity-aware LAS): an allocation
  ``X[i, t]``, the share of time job ``i`` spends on type ``t``, maximising the least
  normalised throughput ``sum_t X[i, t] * rate[i, t] * gpus_i / proportional_i`` (its
  throughput over what an even split of every type would give it), subject to every type's
  GPUs and to each job's time summing to at most 1. A second program keeps that minimum and
  maximises the sum, so that GPUs the minimum does not need are not left idle (Gavel's
  water-filling variant goes further; its paper reports them close).
- ``gavel-ftf`` (Gavel's finish-time fairness): the allocation minimising the largest
  ``rho = (time since arrival + steps left / throughput(X)) / (time isolated so far + steps
  left / isolated throughput)``, the isolated throughput being the job's on ``1/N`` of every
  type. Minimised exactly by bisection on ``rho`` over linear feasibility programs (the
  throughput each job needs at a given ``rho`` is linear in ``X``).
- ``-agnostic`` versions plan as if every type were alike, as Gavel's baselines do: LAS
  with every rate 1, FTF with every type at the reference type's rate; the engine still runs
  each job at its real speed.
- Gavel's **rounds** turn an allocation into GPUs: every ``round_s`` (6 minutes, Gavel's
  default) each (job, type) gets the priority ``X[i, t] / share of the time it has had on
  t`` since the allocation was computed, and jobs are placed in priority order on types
  with room for them whole; GPUs still free go to the remaining jobs by the same order
  (work-conserving). The allocation is recomputed when a job arrives or finishes, as
  Gavel's simulator does.
- ``pollux-agnostic``: Pollux's search (``pollux.Pollux.search``: speed-ups over the fair
  share, power mean ``p = -1``, restart discount) over the cluster as one pool of GPUs, each
  job valued at its rate on the reference type; the counts are then placed on whichever
  types have room, a gang spilling over types when no one type holds it (it then runs at
  the slower type's pace).
- ``ffdl``: ``ffdl.elastic.by_type.optimize_types``, the function the live autoscaler calls
  on mixed types, with every job's rate curve on each type given through the
  ``GoodputModel`` interface, its GPUs free between 1 and the most its model was measured
  on, the live defaults (objective, restart penalty and cost, fairness waits) and the
  tenant fairness setting chosen (``finish_time`` by default: each job's weight from its
  ``rho`` so far, ``ffdl.elastic.fairness``). ``ffdl-agnostic`` is the same optimizer on one
  pool at the reference type's rates; ``ffdl-fixed-size`` runs every job at exactly the
  GPUs it asked for, as Gavel's policies do, so that what elasticity brings shows apart
  from what choosing types and fairness bring.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.optimize import linprog

from ffdl.elastic.by_type import TypedJob, TypedPlan, optimize_types
from ffdl.elastic.fairness import (
    FairJob,
    TenantFairness,
    finish_time_fairness,
    share_weights,
)
from ffdl.elastic.optimizer import ElasticJob, Objective
from ffdl.elastic.throughput import FloatArray, prior
from ffdl.sim.compare.gavel import GavelTable
from ffdl.sim.compare.mixed import (
    WAIT,
    MixedCluster,
    MixedDecision,
    MixedView,
    gang_rate,
    isolated_rate,
    isolated_shares,
)
from ffdl.sim.compare.pollux import Pollux, SearchedJob
from ffdl.sim.live_defaults import LIVE_OBJECTIVE, live_default

GAVEL_ROUND_S = 360.0
FloatMatrix = npt.NDArray[np.float64]


def _most_free_first(free: Mapping[str, int]) -> list[str]:
    return sorted(free, key=lambda t: (-free[t], t))


@dataclass
class MixedFifo:
    name: str = "fifo"

    def decide(
        self, now: float, jobs: Sequence[MixedView], cluster: MixedCluster, table: GavelTable
    ) -> Mapping[str, MixedDecision]:
        free = dict(cluster.gpus)
        decisions: dict[str, MixedDecision] = {}
        for job in jobs:
            if job.gpus:
                decisions[job.id] = MixedDecision(job.gpus)
                for t, n in job.gpus.items():
                    free[t] -= n
        for job in sorted((j for j in jobs if not j.gpus), key=lambda j: (j.job.submit_s, j.id)):
            room = [
                t
                for t in _most_free_first(free)
                if free[t] >= job.job.gpus and table.rate(job.job.model, t, job.job.gpus) > 0
            ]
            decisions[job.id] = MixedDecision.on(room[0], job.job.gpus) if room else WAIT
            if room:
                free[room[0]] -= job.job.gpus
        return decisions


def _solve(
    cost: FloatMatrix,
    upper: FloatMatrix,
    bound: FloatMatrix,
    bounds: Sequence[tuple[float, float | None]],
) -> FloatMatrix | None:
    result = linprog(cost, A_ub=upper, b_ub=bound, bounds=bounds, method="highs")
    return result.x if result.status == 0 else None  # type: ignore[no-any-return]


def _base_rows(
    sizes: FloatMatrix, capacity: FloatMatrix, extra: int
) -> tuple[FloatMatrix, FloatMatrix]:
    """The constraints every Gavel allocation obeys, over ``X`` flattened row by row (jobs x
    types) followed by ``extra`` other variables: each type's GPUs, each job's time <= 1."""
    m, n = len(sizes), len(capacity)
    rows = np.zeros((n + m, m * n + extra))
    for t in range(n):
        rows[t, t : m * n : n] = sizes
    for i in range(m):
        rows[n + i, i * n : (i + 1) * n] = 1.0
    return rows, np.concatenate([capacity, np.ones(m)])


def max_min_allocation(
    rates: FloatMatrix, sizes: FloatMatrix, capacity: FloatMatrix
) -> FloatMatrix:
    """Gavel's max-min fairness: ``X`` (jobs x types) maximising the least normalised
    throughput, then the sum with that least kept. ``rates[i, t]`` is job ``i``'s throughput
    on type ``t`` at its size ``sizes[i]``; ``capacity[t]`` the type's GPUs."""
    m, n = rates.shape
    proportional = rates @ (capacity / capacity.sum())
    worth = rates * sizes[:, None] / proportional[:, None]
    base, limits = _base_rows(sizes, capacity, 1)
    # Maximise t: t - sum_t worth[i, t] X[i, t] <= 0 for every job.
    fairness = np.zeros((m, m * n + 1))
    for i in range(m):
        fairness[i, i * n : (i + 1) * n] = -worth[i]
    fairness[:, -1] = 1.0
    cost = np.zeros(m * n + 1)
    cost[-1] = -1.0
    bounds = [(0.0, 1.0)] * (m * n) + [(0.0, None)]
    first = _solve(cost, np.vstack([base, fairness]), np.concatenate([limits, np.zeros(m)]), bounds)
    if first is None:
        return np.zeros((m, n))
    least = float(first[-1]) * (1 - 1e-6)
    keep = np.zeros((m, m * n))
    for i in range(m):
        keep[i, i * n : (i + 1) * n] = -worth[i]
    base, limits = _base_rows(sizes, capacity, 0)
    second = _solve(
        -worth.ravel(),
        np.vstack([base, keep]),
        np.concatenate([limits, np.full(m, -least)]),
        [(0.0, 1.0)] * (m * n),
    )
    chosen = first[:-1] if second is None else second
    return np.clip(chosen.reshape(m, n), 0.0, 1.0)


def finish_time_allocation(
    rates: FloatMatrix,
    sizes: FloatMatrix,
    capacity: FloatMatrix,
    elapsed: FloatMatrix,
    isolated_elapsed: FloatMatrix,
    isolated: FloatMatrix,
    left: FloatMatrix,
) -> FloatMatrix:
    """Gavel's finish-time fairness: ``X`` minimising the largest ``rho`` (module docstring),
    by bisection; ``elapsed`` per job since arrival, ``isolated_elapsed`` the time its progress
    so far would have taken isolated, ``isolated`` its isolated throughput, ``left`` its
    steps left."""
    m, n = rates.shape
    denominator = isolated_elapsed + left / isolated
    base, limits = _base_rows(sizes, capacity, 0)
    normalised = rates / isolated[:, None]

    def feasible(rho: float) -> FloatMatrix | None:
        slack = rho * denominator - elapsed
        if np.any(slack <= 0):
            return None
        need = left / slack
        rows = np.zeros((m, m * n))
        for i in range(m):
            rows[i, i * n : (i + 1) * n] = -rates[i]
        x = _solve(
            -normalised.ravel(),
            np.vstack([base, rows]),
            np.concatenate([limits, -need]),
            [(0.0, 1.0)] * (m * n),
        )
        return None if x is None else x.reshape(m, n)

    best_rate = rates.max(axis=1)
    low = float(np.max((elapsed + left / best_rate) / denominator))
    high = max(low * 2, 1.0)
    found = feasible(high)
    while found is None and high < 1e9:
        high *= 4
        found = feasible(high)
    if found is None:
        return np.zeros((m, n))
    for _ in range(14):
        middle = (low + high) / 2
        attempt = feasible(middle)
        if attempt is None:
            low = middle
        else:
            high, found = middle, attempt
    return np.clip(found, 0.0, 1.0)


@dataclass
class GavelPolicy:
    """Gavel's LAS (``objective="las"``) or finish-time fairness (``"ftf"``), aware of GPU
    types or not, with its rounds (module docstring)."""

    objective: str = "las"
    aware: bool = True
    round_s: float = GAVEL_ROUND_S
    name: str = ""
    _jobs: tuple[str, ...] = field(init=False, default=())
    _allocation: dict[str, dict[str, float]] = field(init=False, default_factory=dict)
    _since: float = field(init=False, default=0.0)
    _time_then: dict[str, dict[str, float]] = field(init=False, default_factory=dict)
    _next_round: float = field(init=False, default=-math.inf)
    _held: dict[str, MixedDecision] = field(init=False, default_factory=dict)
    # Finish-time fairness's bookkeeping, as Gavel's: isolated time so far, per job.
    _isolated_s: dict[str, float] = field(init=False, default_factory=dict)
    _isolated_rate: dict[str, float] = field(init=False, default_factory=dict)
    _done_then: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.objective not in ("las", "ftf"):
            raise ValueError("objective must be 'las' or 'ftf'")
        self.name = self.name or f"gavel-{self.objective}" + ("" if self.aware else "-agnostic")

    def decide(
        self, now: float, jobs: Sequence[MixedView], cluster: MixedCluster, table: GavelTable
    ) -> Mapping[str, MixedDecision]:
        ids = tuple(sorted(j.id for j in jobs))
        if ids != self._jobs:
            self._allocate(now, jobs, cluster, table)
            self._jobs = ids
        if now < self._next_round:
            return {j.id: self._held.get(j.id, WAIT) for j in jobs}
        self._next_round = now + self.round_s
        self._held = self._round(now, jobs, cluster)
        return self._held

    def _planned_rates(
        self, jobs: Sequence[MixedView], types: Sequence[str], table: GavelTable, reference: str
    ) -> FloatMatrix:
        def planned(job: MixedView, t: str) -> float:
            # Where a job does not fit at all (memory) every version knows; only the aware
            # ones know how fast it runs.
            real = table.rate(job.job.model, t, job.job.gpus)
            if self.aware or real == 0:
                return real
            if self.objective == "las":
                return 1.0
            return table.rate(job.job.model, reference, job.job.gpus)

        return np.array([[planned(j, t) for t in types] for j in jobs])

    def _allocate(
        self, now: float, jobs: Sequence[MixedView], cluster: MixedCluster, table: GavelTable
    ) -> None:
        types = sorted(cluster.gpus)
        capacity = np.array([float(cluster.gpus[t]) for t in types])
        sizes = np.array([float(j.job.gpus) for j in jobs])
        rates = self._planned_rates(jobs, types, table, cluster.reference)
        if not jobs:
            x = np.zeros((0, len(types)))
        elif self.objective == "las":
            x = max_min_allocation(rates, sizes, capacity)
        else:
            x = self._finish_time(jobs, cluster, rates, sizes, capacity, types)
        self._allocation = {
            j.id: {t: float(x[i, k]) for k, t in enumerate(types) if rates[i, k] > 0}
            for i, j in enumerate(jobs)
        }
        self._since = now
        self._time_then = {j.id: dict(j.time_on) for j in jobs}

    def _finish_time(
        self,
        jobs: Sequence[MixedView],
        cluster: MixedCluster,
        rates: FloatMatrix,
        sizes: FloatMatrix,
        capacity: FloatMatrix,
        types: Sequence[str],
    ) -> FloatMatrix:
        for job in jobs:
            if job.id in self._done_then:
                progressed = job.steps_done - self._done_then[job.id]
                self._isolated_s[job.id] += progressed / self._isolated_rate[job.id]
            else:
                self._isolated_s[job.id] = 0.0
        isolated = np.array(
            [
                sum(
                    share * rates[i, types.index(t)]
                    for t, share in isolated_shares(cluster, j.job.gpus, len(jobs)).items()
                )
                for i, j in enumerate(jobs)
            ]
        )
        x = finish_time_allocation(
            rates,
            sizes,
            capacity,
            np.array([j.age_s for j in jobs]),
            np.array([self._isolated_s[j.id] for j in jobs]),
            isolated,
            np.array([j.steps_left for j in jobs]),
        )
        self._done_then = {j.id: j.steps_done for j in jobs}
        self._isolated_rate = {j.id: float(isolated[i]) for i, j in enumerate(jobs)}
        return x

    def _round(
        self, now: float, jobs: Sequence[MixedView], cluster: MixedCluster
    ) -> dict[str, MixedDecision]:
        elapsed = max(now - self._since, 1e-9)
        entries: list[tuple[float, float, str, str]] = []
        for job in jobs:
            then = self._time_then.get(job.id, {})
            for t, share in self._allocation.get(job.id, {}).items():
                had = (job.time_on.get(t, 0.0) - then.get(t, 0.0)) / elapsed
                priority = share / had if had > 0 else (math.inf if share > 1e-6 else 0.0)
                entries.append((priority, share, job.id, t))
        entries.sort(key=lambda e: (-e[0], -e[1], e[2], e[3]))
        by_id = {j.id: j for j in jobs}
        free = dict(cluster.gpus)
        decisions: dict[str, MixedDecision] = {}
        for _, _, job_id, t in entries:
            size = by_id[job_id].job.gpus
            if job_id not in decisions and free[t] >= size:
                decisions[job_id] = MixedDecision.on(t, size)
                free[t] -= size
        return {j.id: decisions.get(j.id, WAIT) for j in jobs}


@dataclass
class PolluxAgnostic:
    """Pollux's search over one pool of GPUs, every job at its reference-type rate."""

    name: str = "pollux-agnostic"
    pollux: Pollux = field(default_factory=Pollux)

    def decide(
        self, now: float, jobs: Sequence[MixedView], cluster: MixedCluster, table: GavelTable
    ) -> Mapping[str, MixedDecision]:
        if not jobs:
            return {}
        total = cluster.total
        goodput = np.array(
            [table.rates(j.job.model, cluster.reference, total) for j in jobs], dtype=np.float64
        )
        searched = [
            SearchedJob(j.id, j.count, j.age_s, j.restarts, j.attained_gpu_s, j.job.submit_s)
            for j in jobs
        ]
        counts = self.pollux.search(searched, goodput, max(1, math.ceil(total / len(jobs))))
        return place_anywhere(jobs, [int(c) for c in counts], cluster, table)


def place_anywhere(
    jobs: Sequence[MixedView], counts: Sequence[int], cluster: MixedCluster, table: GavelTable
) -> dict[str, MixedDecision]:
    """GPU counts on types, blind to speed: a job whose count is unchanged keeps its GPUs;
    the others, largest first, go to the type with the most free GPUs, spilling over to the
    next when one type does not hold them, on types where the job fits at that count (a
    gang that finds too few such GPUs waits)."""
    free = dict(cluster.gpus)
    decisions: dict[str, MixedDecision] = {}
    for job, count in zip(jobs, counts, strict=True):
        if count and count == job.count:
            decisions[job.id] = MixedDecision(job.gpus)
            for t, n in job.gpus.items():
                free[t] -= n
    moving = sorted(
        ((j, c) for j, c in zip(jobs, counts, strict=True) if c and j.id not in decisions),
        key=lambda item: (-item[1], item[0].id),
    )
    for job, count in moving:
        fits = [t for t in _most_free_first(free) if table.rate(job.job.model, t, count) > 0]
        if sum(free[t] for t in fits) < count:
            continue
        taken: dict[str, int] = {}
        for t in fits:
            n = min(free[t], count - sum(taken.values()))
            if n:
                taken[t] = n
                free[t] -= n
        decisions[job.id] = MixedDecision(taken)
    return {j.id: decisions.get(j.id, WAIT) for j in jobs}


@dataclass(frozen=True, slots=True)
class RateCurve:
    """A job's measured rate at 0..N GPUs, for the optimizer's ``GoodputModel`` interface."""

    rates: tuple[float, ...]

    def goodput(
        self, gpus: FloatArray, nodes: FloatArray, batches: FloatArray, steps: FloatArray
    ) -> FloatArray:
        table = np.asarray(self.rates, dtype=np.float64)
        index = np.clip(np.rint(gpus).astype(np.int64), 0, len(table) - 1)
        result: FloatArray = table[index]
        return result


@dataclass
class FfdlMixed:
    """ffdl's optimizer over types (``aware``) or on one pool (module docstring)."""

    name: str = "ffdl"
    aware: bool = True
    fairness: TenantFairness = "finish_time"
    # Each job at exactly the GPUs it asked for, as Gavel's jobs are: the type and when to
    # run are chosen, the size is not.
    fixed_size: bool = False
    restart_penalty: float = live_default("restart_penalty")
    fairness_after_s: float = live_default("fairness_after_s")
    fairness_turn_s: float = live_default("fairness_turn_s")
    restart_cost_s: float | None = live_default("restart_cost_s")
    admit_after_s: float = live_default("admit_after_s")
    objective: Objective = LIVE_OBJECTIVE

    def decide(
        self, now: float, jobs: Sequence[MixedView], cluster: MixedCluster, table: GavelTable
    ) -> Mapping[str, MixedDecision]:
        if not jobs:
            return {}
        weights = self._weights(jobs, cluster, table)
        if not self.aware:
            pool = {cluster.reference: cluster.total}
            typed = [
                self._typed(j, table, pool, weights[j.id], pool_of=cluster.reference) for j in jobs
            ]
            plan = self._plan(typed, pool)
            counts = [a.gpus for a in plan.plan.allocations]
            return place_anywhere(jobs, counts, cluster, table)
        typed = [self._typed(j, table, cluster.gpus, weights[j.id]) for j in jobs]
        plan = self._plan(typed, cluster.gpus)
        return {
            a.job_id: MixedDecision.on(t, a.gpus) if t is not None and a.gpus else WAIT
            for a, t in zip(plan.plan.allocations, plan.gpu_types, strict=True)
        }

    def _plan(self, typed: Sequence[TypedJob], gpus: Mapping[str, int]) -> TypedPlan:
        return optimize_types(
            typed,
            gpus,
            restart_penalty=self.restart_penalty,
            fairness_after_s=self.fairness_after_s,
            turn_s=self.fairness_turn_s,
            fixed_batch=True,
            gpus_per_node=dict(gpus),  # no machines within a type: one "node" each
            restart_cost_s=self.restart_cost_s,
            admit_after_s=self.admit_after_s,
            objective=self.objective,
        )

    def _weights(
        self, jobs: Sequence[MixedView], cluster: MixedCluster, table: GavelTable
    ) -> dict[str, float]:
        fair: list[FairJob] = []
        for job in jobs:
            model = job.job.model
            share = isolated_rate(table, cluster, job.job, float(len(jobs)))
            one_gpu = min(table.rate(model, t, 1) for t in cluster.gpus)
            speedup = gang_rate(table, model, job.gpus) / one_gpu
            rho = finish_time_fairness(job.age_s, job.steps_done, share)
            fair.append(FairJob(job.id, job.job.tenant, speedup, rho, job.count))
        return share_weights(fair, {}, self.fairness)

    def _typed(
        self,
        job: MixedView,
        table: GavelTable,
        gpus: Mapping[str, int],
        weight: float,
        pool_of: str | None = None,
    ) -> TypedJob:
        variants: dict[str, ElasticJob] = {}
        for t, capacity in gpus.items():
            high = min(table.max_gpus(job.job.model, pool_of or t), capacity)
            low = 1
            if self.fixed_size:
                if job.job.gpus > high:
                    continue  # it does not fit on this type at its size
                low = high = job.job.gpus
            variants[t] = ElasticJob(
                id=job.id,
                priority=50,
                gpu_range=(low, high),
                batch_range=None,
                base_batch=high,
                model=prior(),
                goodput=RateCurve(tuple(table.rates(job.job.model, pool_of or t, high))),
                current_gpus=job.count,
                waited_s=job.waited_s,
                running_s=job.running_s,
                age_s=job.age_s,
                restarts=job.restarts,
                remaining_samples=job.steps_left,
                share_weight=weight,
            )
        current = None
        if job.count:
            current = pool_of or job.gpu_type or max(job.gpus, key=lambda t: job.gpus[t])
        return TypedJob(variants, current_type=current)
