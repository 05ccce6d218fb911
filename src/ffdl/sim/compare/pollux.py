"""Pollux (Qiao et al., OSDI'21), written from its paper and the rules of its published
simulator, for the policy comparison.

- **Goodput** of a job on ``g`` GPUs is its throughput times its statistical efficiency at
  the batch that maximises their product (``Family.best_goodputs``), read at the job's
  current gradient noise scale: Pollux re-tunes every job's batch at every round.
- **Speed-up** of ``g`` GPUs is that goodput over the job's goodput at the fair share,
  ``ceil(GPUs / jobs)`` GPUs; a job left without GPUs has speed-up 0.
- **Restarts**: a job whose GPU count changes has its speed-up scaled by
  ``max(age - restarts * 30 s, 0) / (age + 30 s)``, so young jobs and jobs that restarted
  often are moved less.
- **Fitness**: the power mean with ``p = -1`` of the speed-ups (each plus 1e-3, so a job
  without GPUs weighs heavily), which favours giving every job something before giving any
  job more.
- **Search**: a genetic algorithm over GPU counts per job, seeded with the current allocation
  and with the previous round's population; single-point crossover over the job axis;
  mutations that reset a job to its current count, take its GPUs away, or raise them toward
  its maximum; a repair that takes GPUs back from the jobs with the most attained service
  (then the newest) until the cluster's capacity holds. Jobs are packed on nodes by the
  comparison's common placement, which stands in for Pollux's node-level allocation matrix;
  a running gang that placement spread over more machines than it needs is valued at its
  speed there, as Pollux's own model of each placement would value it.
- **Speeds**: the family's true ones, or, for ``pollux-fit`` (``learns_speed``), each job's
  step times fitted online from what it was seen to take (``learning.OnlineFit``), as
  Pollux's agents fit theirs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ffdl.sim.compare.families import Family
from ffdl.sim.compare.jobs import Decision, JobView
from ffdl.sim.compare.learning import OnlineFit

IntMatrix = npt.NDArray[np.int64]
RESTART_S = 30.0
PROGRESS_BUCKETS = 100


@dataclass(frozen=True, slots=True)
class SearchedJob:
    """What the search needs of a job besides its goodput: the GPUs it holds, for the
    restart discount its age and restarts, and for repair its attained service and arrival."""

    id: str
    gpus: int
    age_s: float
    restarts: int
    attained_gpu_s: float
    submit_s: float


@dataclass
class Pollux:
    name: str = "pollux"
    population: int = 60
    generations: int = 40
    seed: int = 0
    learns_speed: bool = False
    learned: OnlineFit = field(init=False, default_factory=OnlineFit, repr=False)
    _rng: np.random.Generator = field(init=False)
    _previous: dict[str, npt.NDArray[np.int64]] = field(init=False, default_factory=dict)
    _tables: dict[tuple[str, int, int, int], tuple[npt.NDArray[np.float64], IntMatrix]] = field(
        init=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def decide(
        self, now: float, jobs: Sequence[JobView], total_gpus: int, gpus_per_node: int
    ) -> Mapping[str, Decision]:
        if not jobs:
            return {}
        count = len(jobs)
        fair = max(1, math.ceil(total_gpus / count))
        goodput = np.zeros((count, total_gpus + 1))
        batches = np.zeros((count, total_gpus + 1), dtype=np.int64)
        for i, job in enumerate(jobs):
            family = job.family
            if self.learns_speed:
                family = dataclasses.replace(job.family, speed=self.learned.model(job))
                table, best = family.best_goodputs(total_gpus, gpus_per_node, job.progress)
            else:
                table, best = self._table(job.family, job.progress, total_gpus, gpus_per_node)
            goodput[i], batches[i] = table, best
            if job.gpus and job.nodes > math.ceil(job.gpus / gpus_per_node):
                # A gang spread over more machines than it needs runs at that speed while
                # it keeps its count (the placement moves only gangs whose count changes).
                goodput[i, job.gpus], batches[i, job.gpus] = family.best_goodput_on(
                    job.gpus, job.nodes, job.progress
                )
        searched = [
            SearchedJob(j.id, j.gpus, j.age_s, j.restarts, j.attained_gpu_s, j.job.submit_s)
            for j in jobs
        ]
        chosen = self.search(searched, goodput, fair)
        return {
            j.id: Decision(int(chosen[i]), int(batches[i, chosen[i]]) if chosen[i] else j.batch)
            for i, j in enumerate(jobs)
        }

    def search(
        self, jobs: Sequence[SearchedJob], goodput: npt.NDArray[np.float64], fair: int
    ) -> npt.NDArray[np.int64]:
        """GPUs per job maximising the fitness: ``goodput[i, g]`` is job ``i``'s goodput on
        ``g`` GPUs (0 where it cannot run; the cluster is ``goodput.shape[1] - 1`` GPUs),
        ``fair`` the share speed-ups are counted against."""
        count, total_gpus = len(jobs), goodput.shape[1] - 1
        current = np.array([j.gpus for j in jobs], dtype=np.int64)
        factor = np.array(
            [max(j.age_s - j.restarts * RESTART_S, 0.0) / (j.age_s + RESTART_S) for j in jobs]
        )
        # Repair order: least attained service first, then the earliest submitted.
        keep_order = sorted(range(count), key=lambda i: (jobs[i].attained_gpu_s, jobs[i].submit_s))
        reference = np.array(
            [goodput[i, _nearest_feasible(goodput[i], fair)] for i in range(count)]
        )
        speedup = goodput / reference[:, None]
        high = np.array([_highest(goodput[i]) for i in range(count)])
        low = np.array([_lowest(goodput[i]) for i in range(count)])

        def fitness(pop: IntMatrix) -> npt.NDArray[np.float64]:
            rows = np.arange(count)[None, :]
            s = speedup[rows, pop]
            s = np.where(pop != current[None, :], s * factor[None, :], s)
            result: npt.NDArray[np.float64] = count / np.sum(1.0 / (s + 1e-3), axis=1)
            return result

        def repair(pop: IntMatrix) -> IntMatrix:
            pop = np.clip(pop, 0, high[None, :])
            pop = np.where((pop > 0) & (pop < low[None, :]), low[None, :], pop)
            # Counts no batch can run on are lowered to the next one that can.
            feasible = goodput > 0
            for i in range(count):
                bad = ~feasible[i, pop[:, i]] & (pop[:, i] > 0)
                while bad.any():
                    pop[bad, i] -= 1
                    bad = ~feasible[i, pop[:, i]] & (pop[:, i] > 0)
            totals = pop.sum(axis=1)
            for r in np.nonzero(totals > total_gpus)[0]:
                excess = int(totals[r] - total_gpus)
                for i in reversed(keep_order):
                    if excess <= 0:
                        break
                    take = min(int(pop[r, i]), excess)
                    if take:
                        remaining = int(pop[r, i]) - take
                        if remaining and remaining < low[i]:
                            take, remaining = int(pop[r, i]), 0
                        pop[r, i] = remaining
                        excess -= take
            return pop

        seeds = [current.copy()]
        seeds.append(
            np.array(
                [self._previous.get(j.id, j.gpus) for j in jobs],
                dtype=np.int64,
            )
        )
        while len(seeds) < self.population:
            seeds.append(self._mutate(current.copy(), current, high))
        pop = repair(np.array(seeds, dtype=np.int64))
        scores = fitness(pop)
        for _ in range(self.generations):
            parents = self._select(scores, self.population)
            children = pop[parents].copy()
            for k in range(0, self.population - 1, 2):
                cut = int(self._rng.integers(1, count)) if count > 1 else 0
                children[k, cut:], children[k + 1, cut:] = (
                    pop[parents[k + 1], cut:].copy(),
                    pop[parents[k], cut:].copy(),
                )
            for k in range(self.population):
                children[k] = self._mutate(children[k], current, high)
            children = repair(children)
            merged = np.vstack([pop, children])
            merged_scores = np.concatenate([scores, fitness(children)])
            best = np.argsort(-merged_scores, kind="stable")[: self.population]
            pop, scores = merged[best], merged_scores[best]
        chosen: npt.NDArray[np.int64] = pop[int(np.argmax(scores))]
        self._previous = {j.id: chosen[i].copy() for i, j in enumerate(jobs)}
        return chosen

    def _table(
        self, family: Family, progress: float, total_gpus: int, gpus_per_node: int
    ) -> tuple[npt.NDArray[np.float64], IntMatrix]:
        bucket = min(int(progress * PROGRESS_BUCKETS), PROGRESS_BUCKETS - 1)
        key = (family.name, bucket, total_gpus, gpus_per_node)
        if key not in self._tables:
            self._tables[key] = family.best_goodputs(
                total_gpus, gpus_per_node, (bucket + 0.5) / PROGRESS_BUCKETS
            )
        return self._tables[key]

    def _select(self, scores: npt.NDArray[np.float64], size: int) -> npt.NDArray[np.int64]:
        """Binary tournaments."""
        a = self._rng.integers(0, len(scores), size)
        b = self._rng.integers(0, len(scores), size)
        return np.where(scores[a] >= scores[b], a, b)

    def _mutate(
        self,
        genome: npt.NDArray[np.int64],
        current: npt.NDArray[np.int64],
        high: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        n = len(genome)
        reset = self._rng.random(n) < 0.1
        genome[reset] = current[reset]
        zero = self._rng.random(n) < 0.01
        genome[zero] = 0
        grow = self._rng.random(n) < 1.0 / max(n, 1)
        if grow.any():
            ceiling = np.maximum(high[grow], genome[grow])
            genome[grow] = self._rng.integers(genome[grow], ceiling + 1)
        return genome


def _highest(goodput: npt.NDArray[np.float64]) -> int:
    feasible = np.nonzero(goodput > 0)[0]
    return int(feasible[-1]) if len(feasible) else 0


def _lowest(goodput: npt.NDArray[np.float64]) -> int:
    feasible = np.nonzero(goodput > 0)[0]
    return int(feasible[0]) if len(feasible) else 0


def _nearest_feasible(goodput: npt.NDArray[np.float64], gpus: int) -> int:
    """``gpus``, or the closest count below (else above) on which some batch runs."""
    feasible = np.nonzero(goodput > 0)[0]
    below = feasible[feasible <= gpus]
    return int(below[-1]) if len(below) else int(feasible[0])
