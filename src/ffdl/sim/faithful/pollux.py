"""Pollux's scheduler as its simulator runs it: NSGA-II over GPUs per job per node.

A solution is a (jobs × nodes) matrix of GPUs. Two objectives, both maximised:

- **fitness**: the power mean (p = -1) of each job's speed-up, where a job's speed-up is its
  best goodput on its GPUs over its goodput on a fair share (the cluster's GPUs over the
  number of jobs, counted as one node), scaled so that one node's worth is 1, and shrunk by
  ``max(age - 30 s × restarts, 0) / (age + 30 s)`` when its GPUs change;
- **utility**: how much of ideal speed-up the allocated GPUs deliver.

The chosen solution is the one of the final front with the best fitness. The search:
population 100, 100 generations, seeded with the previous round's front; binary tournaments
by dominance then crowding; single-point crossover over jobs; mutations that reset a job to
its current GPUs, clear some of its nodes, or raise its GPUs on a node toward that node's
size; a repair that keeps at most one multi-node job per node, caps each job's GPUs (and
its nodes at 16), and fills each node in job order (least attained service first) until
full; duplicates are dropped. Speed-ups are tabulated once per round for every
(nodes, GPUs) a job may get, which is what the original's memo amounts to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ffdl.sim.faithful.engine import Allocation, JobInfo, RoundPlan
from ffdl.sim.faithful.policies import adaptive_cap

States = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
RESTART_S = 30
POWER = -1.0
MAX_NODES_PER_JOB = 16


@dataclass
class _Round:
    """One round's problem: the jobs in planning order, their caps and speed-up tables."""

    keys: list[str]
    base: States  # (jobs, nodes)
    caps: npt.NDArray[np.int64]  # (jobs,)
    tables: FloatArray  # (jobs, nodes + 1, max GPUs + 1)
    restart_factor: FloatArray  # (jobs,)
    nodes: int
    per_node: int

    def speedups(self, states: States) -> FloatArray:
        used_nodes = np.count_nonzero(states, axis=2)
        gpus = np.minimum(states.sum(axis=2), self.tables.shape[2] - 1)
        jobs = np.arange(len(self.keys))[None, :]
        return np.asarray(self.tables[jobs, used_nodes, gpus], dtype=np.float64)

    def objectives(self, states: States) -> FloatArray:
        """(solutions × 2) values to minimise: -fitness, -utility."""
        speedups = self.speedups(states)
        scaled = speedups / self.per_node
        moved = np.any(states != self.base[None], axis=2)
        scaled = scaled * np.where(moved, self.restart_factor[None, :], 1.0)
        fitness = (np.sum((scaled + 1e-3) ** POWER, axis=1) / states.shape[1]) ** (1.0 / POWER)
        return np.column_stack([-fitness, -self.utilities(states, speedups)])

    def utilities(self, states: States, speedups: FloatArray) -> FloatArray:
        gpus = states.sum(axis=2)
        active_nodes = np.count_nonzero(states.sum(axis=1), axis=1)
        total = active_nodes * self.per_node
        with np.errstate(divide="ignore", invalid="ignore"):
            shares = np.where(gpus > 0, gpus / total[:, None], 0.0)
            ideal = np.where(gpus > 0, speedups / gpus, 0.0)
        return np.asarray(np.sum(ideal * shares, axis=1), dtype=np.float64)


def _nondominated_ranks(values: FloatArray) -> npt.NDArray[np.int64]:
    count = len(values)
    better_eq = np.all(values[:, None, :] <= values[None, :, :], axis=2)
    strictly = np.any(values[:, None, :] < values[None, :, :], axis=2)
    dominates = better_eq & strictly  # [i, j]: i dominates j
    dominated_by = dominates.sum(axis=0)
    ranks = np.full(count, -1, dtype=np.int64)
    rank = 0
    current = np.flatnonzero(dominated_by == 0)
    while len(current):
        ranks[current] = rank
        dominated_by = dominated_by - dominates[current].sum(axis=0)
        dominated_by[ranks >= 0] = -1
        current = np.flatnonzero(dominated_by == 0)
        rank += 1
    return ranks


def _crowding(values: FloatArray) -> FloatArray:
    count = len(values)
    if count <= 2:
        return np.full(count, np.inf)
    distance = np.zeros(count)
    for column in range(values.shape[1]):
        order = np.argsort(values[:, column], kind="stable")
        sorted_values = values[order, column]
        span = sorted_values[-1] - sorted_values[0]
        distance[order[0]] = distance[order[-1]] = np.inf
        if span > 0:
            distance[order[1:-1]] += (sorted_values[2:] - sorted_values[:-2]) / span
    return distance


@dataclass
class Pollux:
    name: str = "pollux"
    batch: str = "agent"
    population: int = 100
    generations: int = 100
    seed: int = 0
    _rng: np.random.Generator = field(init=False)
    _previous: tuple[list[str], States] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    # -- the round ----------------------------------------------------------------------------

    def optimize(
        self,
        jobs: Mapping[str, JobInfo],
        nodes: int,
        gpus_per_node: int,
        current: Mapping[str, Allocation],
        now: int,
    ) -> RoundPlan:
        del now
        problem = self._problem(jobs, nodes, gpus_per_node, current)
        states = self._search(problem)
        keys = problem.keys
        return RoundPlan(
            {
                key: [n for n in range(nodes) for _ in range(int(states[j, n]))]
                for j, key in enumerate(keys)
            }
        )

    def _problem(
        self,
        jobs: Mapping[str, JobInfo],
        nodes: int,
        per_node: int,
        current: Mapping[str, Allocation],
    ) -> _Round:
        keys = [
            k
            for k, _ in sorted(
                jobs.items(), key=lambda kv: (kv[1].attained_service, kv[1].submitted)
            )
        ]
        base = np.zeros((len(keys), nodes), dtype=np.int64)
        for j, key in enumerate(keys):
            for node in current.get(key, []):
                base[j, node] += 1
        total = nodes * per_node
        fair = math.ceil(total / len(keys))
        caps = np.array([adaptive_cap(jobs[k]) for k in keys], dtype=np.int64)
        most = int(min(total, max(caps.max(), base.sum(axis=1).max())))
        tables = np.zeros((len(keys), nodes + 1, most + 1))
        gpus = np.arange(most + 1)
        for j, key in enumerate(keys):
            speedup = jobs[key].speedup
            if speedup is None:
                tables[j, 1:, :] = gpus[None, :] / fair
                continue
            speedup.rebase(1, fair)
            node_counts, gpu_counts = np.meshgrid(np.arange(1, nodes + 1), gpus[1:], indexing="ij")
            valid = node_counts <= gpu_counts
            values = np.zeros(node_counts.shape)
            values[valid] = speedup(node_counts[valid], gpu_counts[valid])
            tables[j, 1:, 1:] = values
        ages = np.array([jobs[k].age for k in keys], dtype=np.float64)
        restarts = np.array([jobs[k].num_restarts for k in keys], dtype=np.float64)
        factor = np.maximum(ages - restarts * RESTART_S, 0.0) / (ages + RESTART_S)
        return _Round(keys, base, caps, tables, factor, nodes, per_node)

    def _seed_population(self, problem: _Round) -> States:
        if self._previous is None:
            return problem.base[None].copy()
        keys, states = self._previous
        seeded = np.zeros((len(states), *problem.base.shape), dtype=np.int64)
        index = {k: i for i, k in enumerate(keys)}
        for j, key in enumerate(problem.keys):
            if key in index:
                seeded[:, j, :] = states[:, index[key], :]
        return seeded

    def _search(self, problem: _Round) -> States:
        population = self._unique(self._repair(problem, self._seed_population(problem)))
        values = problem.objectives(population)
        keep, ranks, crowding = self._survivors(values, len(values))
        population, values = population[keep], values[keep]
        for _ in range(self.generations - 1):
            offspring = self._offspring(problem, population, values, crowding)
            merged = np.concatenate([population, offspring])
            merged_values = np.concatenate([values, problem.objectives(offspring)])
            keep, ranks, crowding = self._survivors(merged_values, self.population)
            population, values = merged[keep], merged_values[keep]
        front = ranks == 0
        self._previous = (problem.keys, population[front])
        best = int(np.argmin(values[front, 0]))
        return np.asarray(population[front][best], dtype=np.int64)

    # -- NSGA-II --------------------------------------------------------------------------------

    def _survivors(
        self, values: FloatArray, size: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray]:
        """The ``size`` best by front then crowding, with their ranks and crowding
        distances (each computed over its whole front, as NSGA-II keeps them)."""
        ranks = _nondominated_ranks(values)
        chosen: list[npt.NDArray[np.int64]] = []
        distances: list[FloatArray] = []
        taken = 0
        for rank in np.unique(ranks):
            members = np.flatnonzero(ranks == rank)
            distance = _crowding(values[members])
            if taken + len(members) > size:
                # Most crowded last, ties broken at random.
                order = np.lexsort((self._rng.random(len(members)), -distance))[: size - taken]
                members, distance = members[order], distance[order]
            chosen.append(members)
            distances.append(distance)
            taken += len(members)
            if taken >= size:
                break
        keep = np.concatenate(chosen)
        return keep, ranks[keep], np.concatenate(distances)

    def _tournament(
        self, values: FloatArray, crowding: FloatArray, count: int
    ) -> npt.NDArray[np.int64]:
        size = len(values)
        rounds = math.ceil(2 * count / size)
        contenders = np.concatenate([self._rng.permutation(size) for _ in range(rounds)])
        contenders = contenders[: 2 * count].reshape(count, 2)
        first, second = contenders[:, 0], contenders[:, 1]
        va, vb = values[first], values[second]
        first_dominates = np.all(va <= vb, axis=1) & np.any(va < vb, axis=1)
        second_dominates = np.all(vb <= va, axis=1) & np.any(vb < va, axis=1)
        ca, cb = crowding[first], crowding[second]
        coin = self._rng.random(count) < 0.5
        by_crowding = np.where(
            ca > cb, first, np.where(cb > ca, second, np.where(coin, first, second))
        )
        winners = np.where(first_dominates, first, np.where(second_dominates, second, by_crowding))
        return winners

    def _offspring(
        self, problem: _Round, population: States, values: FloatArray, crowding: FloatArray
    ) -> States:
        wanted = self.population
        found: list[States] = []
        seen = {state.tobytes() for state in population}
        for _ in range(100):
            matings = math.ceil(wanted / 2)
            parents = self._tournament(values, crowding, 2 * matings).reshape(matings, 2)
            children = self._crossover(population[parents[:, 0]], population[parents[:, 1]])
            children = self._repair(problem, self._mutate(problem, children))
            before = len(found)
            for child in children:
                key = child.tobytes()
                if key not in seen:
                    seen.add(key)
                    found.append(child)
            # pymoo tries up to 100 times to fill the offspring with new solutions; once a
            # try finds none, the reachable ones are (nearly) exhausted: stop there.
            if len(found) >= wanted or len(found) == before:
                break
        if not found:
            return population[:0]
        return np.stack(found[:wanted])

    def _unique(self, states: States) -> States:
        _, first = np.unique(states.reshape(len(states), -1), axis=0, return_index=True)
        return states[np.sort(first)]

    # -- Pollux's operators ------------------------------------------------------------------------

    def _crossover(self, first: States, second: States) -> States:
        matings, jobs, _ = first.shape
        points = self._rng.integers(jobs, size=(matings, 1))
        swap = (np.arange(jobs)[None, :] < points)[:, :, None]
        one = np.where(swap, second, first)
        two = np.where(swap, first, second)
        return np.concatenate([one, two])

    def _mutate(self, problem: _Round, states: States) -> States:
        rng = self._rng
        count, jobs, _ = states.shape
        reset = rng.random((count, jobs)) < 0.1
        states = np.where(reset[:, :, None], problem.base[None], states)
        cleared = np.where(rng.random((count, jobs)) < 0.1, 0.1, 0.0)
        states = np.where(rng.random(states.shape) < cleared[:, :, None], 0, states)
        free = problem.per_node - states.sum(axis=1)  # (count, nodes)
        fits = np.broadcast_to((free >= 1)[:, None, :], states.shape)
        chance_any = fits / np.maximum(fits.sum(axis=1, keepdims=True), 1.0)
        already = (states > 0) & fits
        chance_own = already / np.maximum(already.sum(axis=1, keepdims=True), 1.0)
        raise_it = rng.random(states.shape) < chance_any + chance_own - chance_any * chance_own
        raised = rng.integers(states, problem.per_node + 1)
        return np.where(raise_it, raised, states)

    def _repair(self, problem: _Round, states: States) -> States:
        rng = self._rng
        states = states.copy()
        # At most one multi-node job per node.
        spread = np.count_nonzero(states, axis=2) > 1
        on_node = (states * spread[:, :, None]) > 0
        states[np.cumsum(on_node, axis=1) > 1] = 0
        # Each job within its cap, and on at most 16 nodes, taken in a random node order.
        shuffle = np.argsort(rng.random(states.shape), axis=2)
        states = np.take_along_axis(states, shuffle, axis=2)
        capped = np.minimum(np.cumsum(states, axis=2), problem.caps[None, :, None])
        states = np.diff(capped, axis=2, prepend=0)
        used = np.minimum(np.cumsum(states > 0, axis=2), MAX_NODES_PER_JOB)
        states[np.diff(used, axis=2, prepend=0) == 0] = 0
        states = np.take_along_axis(states, np.argsort(shuffle, axis=2), axis=2)
        # Each node filled in job order until full.
        filled = np.minimum(np.cumsum(states, axis=1), problem.per_node)
        return np.asarray(np.diff(filled, axis=1, prepend=0), dtype=np.int64)
