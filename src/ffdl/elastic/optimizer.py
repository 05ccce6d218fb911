"""The elastic optimizer: GPUs and batch size for every elastic job, by dynamic programming.

A pure function from a snapshot of elastic jobs and the cluster's GPU count to a ``Plan``;
the live autoscaler and the simulator call the same ``optimize``.

Objective
---------
Choose for every job ``j`` a GPU count ``g_j`` and a batch size ``b_j`` maximising::

    sum_j  w_j * (U_j(g_j) - penalty_j(g_j, b_j))      subject to  sum_j g_j <= total_gpus

with ``objective="throughput"``, or with ``objective="proportional"`` (the live default)::

    sum_j  w_j * log(U_j(g_j) - penalty_j(g_j, b_j))

The logarithm is proportional fairness, the power mean of speed-ups with p -> 0, between
the sum (p = 1) and Pollux's p = -1: a GPU goes to the job it speeds up by the largest
*factor*, so a job's first GPU is worth far more than a well-scaling job's thirtieth, and
the best-scaling jobs no longer take most of the cluster while the others crawl. On
Pollux's workloads the sum gave imagenet 61-75% of GPU-time and left every other class
1.5-3x slower than under Pollux; p = -1 cut average JCT but let long jobs fall behind on
p99 (``docs/simulations``, section 7). Below a speed-up of ``_LOG_FLOOR`` the logarithm
goes on as its tangent, so that no GPUs and a net loss stay finite and ordered. A job's
weight and its restart penalty enter as they do in the sum, so for one job alone both
objectives rescale it at exactly the same gains.

* ``g_j`` is 0 or a multiple of ``gpus_per_learner`` inside ``gpu_range`` (a gang of whole
  learners). Long ranges are thinned (``ffdl.elastic.choices``) to at most
  ``MAX_GPU_CHOICES`` geometrically spaced values that always include the range's ends and
  the job's current count, plus the counts that fill whole nodes (every one up to
  ``MAX_GPU_CHOICES`` of them). Callers give no
  range wider than the cluster (the autoscaler clamps it): thinned, a range of hundreds of
  GPUs leaves steps of about 50% among the sizes a 64-GPU cluster has, and in the policy
  comparison (``docs/simulations``, section 6) that alone cost long jobs 3% of p99 JCT.
* ``U_j(g) = max_b T_j(g, b) * E_j(b) / (T_j(1, b0) * E_j(b0))``: the best useful progress over
  the batch candidates, counting only batches whose share per GPU ``b / g`` lies inside the
  job's ``local_batch_range`` (what fits in a GPU's memory and keeps it busy; at least one
  sample per GPU when the job gives none). A job that accumulates gradients
  (``ElasticJob.accumulate``) may also take a share above the maximum, as ``s`` micro-batches
  per step, each paying the step's fixed overhead again without an exchange
  (``ffdl.elastic.accumulation``): on one GPU or a few, a batch too large for their memory is
  still within reach, at the price the model gives it. The candidates are a geometric grid of
  ``batch_choices`` sizes over ``batch_range`` plus ``b0`` and the current batch
  (``batch_candidates``; only ``b0`` when the job has no range or ``fixed_batch`` asks for the
  paper's baseline), and, for each GPU count ``g``, the largest and the smallest batch of
  the range that ``g`` GPUs can run. The grid alone is coarse: 8 sizes over a range that
  often spans 64x lie 1.8x apart, so for most GPU counts the batch that fills every GPU's
  memory, often the fastest per sample, was not a candidate. In the policy comparison on
  measured speed curves (``docs/simulations``, section 6), where yolov3's step is cheapest
  per sample at 8 per GPU, its longest jobs were planned at 2 GPUs x 7 samples and 4 x 6.5
  instead of 2 x 8 and 4 x 8, and ffdl's p99 JCT at load 0.5 trailed Pollux's by 8-9% on two
  of four workloads; with the two filling batches per GPU count it leads on all four, and its
  average JCT there went from 0.94x Pollux's to 0.91x.
  The result is normalised by the job's progress on one GPU at its own batch size ``b0``:
  the value of a GPU is a speed-up, so a huge model and a tiny one compete on how well they
  use GPUs, not on how many samples per second they happen to process. ``U_j(0) = 0``.
  Each GPU count is valued on the fewest machines that hold it, but a running job's current
  count on the machines it has (``current_nodes``): the gang keeps them while its count
  stays. A gang that the scheduler had to spread over more machines than it needs can be
  slower there than on fewer GPUs, and valuing it as if packed kept it there: in the policy
  comparison on measured speeds, fixed-batch yolov3 jobs placed on two GPUs of two machines
  ran 2.5x slower than on one GPU for a day (``docs/simulations``, section 6).
  ``T_j * E_j`` is the job's goodput: the fitted step-time model times the noise-scale
  efficiency, evaluated for all jobs at once (``ffdl.elastic.options``), or, for a job that
  brings one, its own ``GoodputModel`` (``ffdl.elastic.goodput``: a measured or externally
  given curve, taken as it is rather than fitted to that form).
* ``w_j = 1 + priority / 50`` (priority clamped to 0..100, so weights run 1..3 and the
  default priority 50 weighs 2): a priority-100 job's speed-up counts three times a
  priority-0 job's; times the job's ``share_weight``, fairness between tenants
  (``ffdl.elastic.fairness``).
* ``penalty_j = restart_penalty * U_j(current)`` when a running job's GPU count or batch
  size changes (a rescale is a checkpoint-restart); keeping the current allocation, starting
  a queued job and stopping a job cost nothing. A change is therefore made only when it
  gains more than ``restart_penalty`` of the job's current progress. A job that takes a new
  batch while it runs (``rebatch_in_place``) pays a tenth of that for a batch-only change
  (``REBATCH_IN_PLACE_SHARE``): no restart, but a fitted model's noise should not flip its
  batch back and forth.
  With ``restart_cost_s`` (the live autoscaler's default), the share is the job's own,
  ``restart_cost_s * (restarts + 1) / (age_s + restart_cost_s)`` (``restart_share``), as
  Pollux's restart factor has it: a restart costs a fixed time, so it is dear to a job that
  has run briefly (its age is the best guess of the time it has left to gain back that
  cost) and to one that has restarted often, and cheap to one that has run for hours. On
  Pollux's workloads a flat share kept long jobs on a size they had outgrown and moved
  young ones for gains they did not live to collect (``docs/simulations``, section 7).

Fairness is lexicographic on top of the objective, in this order:

1. A running job keeps at least its minimum: dropping it to 0 costs more than any other gain,
   so it happens only when the running jobs' minimums alone exceed the cluster (as many as
   possible are kept; preemption proper is the scheduler's job) -- or for rule 2.
2. A queued job that has waited more than ``admit_after_s`` is admitted by shrinking other
   jobs toward their minimums whenever that makes room; one that has waited more than
   ``fairness_after_s`` (it is *starved*) is admitted
   (at its minimum if need be, shrinking other jobs toward theirs) whenever it can fit:
   admission earns a bonus ``A`` larger than any possible difference in the objective. Its
   GPUs beyond the minimum are worth only their normal weight, so a starved job does not
   hog the cluster once admitted. When shrinking is not enough, a running job that has held
   its allocation for a turn (``turn_s``, by default ``fairness_after_s``), at a priority no
   higher than a starved job's, is stopped (checkpointed and queued) for it: stopping such
   a job costs less than an admission but more than any objective difference, so one is
   stopped for each starved job admitted and never more, and only when shrinking others to
   their minimums leaves no room. Waiting is thereby bounded: at the worst, jobs take turns
   of ``turn_s`` on the GPUs (as time-sharing schedulers do), and a job waits for one from
   ``fairness_after_s`` on, instead of waiting until a long job ends while every running
   job sits at its minimum. ``admit_after_s`` (by default
   ``fairness_after_s``) is the shorter bound of the two: a newcomer gets a share of GPUs
   that running jobs can spare within a round or two, as under Pollux, while stopping a
   job for it waits for the longer one.

``Plan.objective`` reports the objective above, without the fairness bonuses.

Recurrence
----------
GPU counts are counted in units of ``u = gcd(gpus_per_learner)`` over the jobs, ``C`` units
in all. With ``v_j(g)`` the value of option ``g`` for job ``j`` (including the fairness
bonuses)::

    best[0][c] = 0                                             for 0 <= c <= C
    best[i][c] = max_{g in options_i, g <= c} best[i-1][c - g] + v_i(g)

``best[i][c]`` is the best value of the first ``i`` jobs using at most ``c`` units. Every row
is computed with one shifted numpy ``add`` and ``maximum`` per option: ``O(J * C * K)`` for
``K`` options per job (``K <= 2 * MAX_GPU_CHOICES + 1``), and row ``i`` only as wide as the first
``i`` jobs can fill. The whole float table is kept (1,000 jobs x 4,097 units is 33 MB) instead
of a table of choices, because recognising the winning option while walking back is cheaper
than tracking it in every cell. The walk back from ``best[J][C]`` prefers, at each job, its
current allocation among the options that reach the optimum (stability on ties).
The fairness rules become bonuses in ``v``: +A for admitting a starved job, -(A - 2S) for
stopping a preemptible one and -D for dropping any other running one, with ``S`` the spread
of the whole objective, A = (2n + 4) S for n starved jobs and D larger than every admission
together, which is exactly the lexicographic order above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from ffdl.elastic.accumulation import layout
from ffdl.elastic.choices import DEFAULT_GPUS_PER_NODE
from ffdl.elastic.efficiency import GradientStats, efficiency
from ffdl.elastic.goodput import GoodputModel, goodput_at
from ffdl.elastic.options import REBATCH_IN_PLACE_SHARE as REBATCH_IN_PLACE_SHARE
from ffdl.elastic.options import Options, evaluate, progress_grid
from ffdl.elastic.options import priority_weight as priority_weight
from ffdl.elastic.options import restart_share as restart_share
from ffdl.elastic.throughput import FloatArray, ThroughputModel

Objective = Literal["throughput", "proportional"]
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
# Relative slack when recognising which option reached the optimum during the walk back.
_TIE_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class ElasticJob:
    """What the optimizer knows about one elastic job (a running one or a queued one)."""

    id: str
    priority: int
    gpu_range: tuple[int, int]  # allowed total GPUs (min, max); min >= 1
    batch_range: tuple[int, int] | None  # global batch size range; None: fixed at base_batch
    base_batch: int  # b0, the user's batch size, inside batch_range
    gpus_per_learner: int = 1  # allocations are multiples of this (a gang of learners)
    model: ThroughputModel
    grad_stats: GradientStats | None = None
    # Any other goodput curve (measured, profiled): when given, it is what the optimizer
    # values, and ``model`` and ``grad_stats`` are not used.
    goodput: GoodputModel | None = None
    # Per-GPU batch limits (min, max): what fits in a GPU's memory and keeps it busy. A batch
    # ``b`` runs on ``g`` GPUs only with ``min <= b / g <= max``; None: at least 1 per GPU.
    local_batch_range: tuple[int, int] | None = None
    # The training loop accumulates gradients (``elastic.accumulate_gradients``): a share
    # above the per-GPU maximum runs as several micro-batches per step instead of being out
    # of reach (``ffdl.elastic.accumulation``).
    accumulate: bool = False
    # The training loop takes a new batch size at its next epoch (``elastic.rebatch_in_place``):
    # a batch-only change costs ``REBATCH_IN_PLACE_SHARE`` of a restart's penalty.
    rebatch_in_place: bool = False
    current_gpus: int = 0  # 0: queued, not running
    current_batch: int | None = None  # None while running means base_batch
    # Machines the running gang spans; None: the fewest that hold it (``nodes_for``). A gang
    # keeps its machines while its GPU count stays, so its options at that count are valued
    # there: a gang spread over more machines than it needs is as slow as it really is.
    current_nodes: int | None = None
    waited_s: float = 0.0  # time since the job last made progress (fairness)
    running_s: float = 0.0  # time since a running job last started or was resized (fairness)
    # Seconds since it was submitted, and the restarts it has taken (rescales included):
    # with ``restart_cost_s``, what a rescale costs it (``restart_share``).
    age_s: float | None = None
    restarts: int = 0
    # Work left, when known: not part of the objective; plan.diff uses it to show ETAs.
    remaining_samples: float | None = None
    # A factor on its weight from fairness between tenants (``ffdl.elastic.fairness``).
    share_weight: float = 1.0

    def __post_init__(self) -> None:
        low, high = self.gpu_range
        if low < 1 or high < low:
            raise ValueError(f"job {self.id}: gpu_range must satisfy 1 <= min <= max")
        if self.gpus_per_learner < 1:
            raise ValueError(f"job {self.id}: gpus_per_learner must be >= 1")
        if high // self.gpus_per_learner * self.gpus_per_learner < low:
            raise ValueError(f"job {self.id}: gpu_range holds no multiple of gpus_per_learner")
        if self.base_batch < 1:
            raise ValueError(f"job {self.id}: base_batch must be >= 1")
        if self.batch_range is not None:
            batch_low, batch_high = self.batch_range
            if not 1 <= batch_low <= self.base_batch <= batch_high:
                raise ValueError(f"job {self.id}: need 1 <= batch min <= base_batch <= batch max")
        if self.local_batch_range is not None:
            local_low, local_high = self.local_batch_range
            if not 1 <= local_low <= local_high:
                raise ValueError(f"job {self.id}: need 1 <= local batch min <= local batch max")
        if self.current_gpus < 0:
            raise ValueError(f"job {self.id}: current_gpus must be >= 0")
        if self.current_batch is not None and self.current_batch < 1:
            raise ValueError(f"job {self.id}: current_batch must be >= 1")
        if self.current_nodes is not None and not 1 <= self.current_nodes <= max(
            self.current_gpus, 1
        ):
            raise ValueError(f"job {self.id}: current_nodes must be between 1 and current_gpus")
        if self.age_s is not None and self.age_s < 0:
            raise ValueError(f"job {self.id}: age_s must be >= 0")
        if self.restarts < 0:
            raise ValueError(f"job {self.id}: restarts must be >= 0")
        if not 0 < self.share_weight < math.inf:
            raise ValueError(f"job {self.id}: share_weight must be a finite number > 0")

    @property
    def running(self) -> bool:
        return self.current_gpus > 0

    @property
    def effective_current_batch(self) -> int:
        return self.current_batch if self.current_batch is not None else self.base_batch

    def accumulation_steps(self, gpus: int, batch: int) -> int:
        """Micro-batches per step each of ``gpus`` GPUs runs for ``batch``."""
        local_max = self.local_batch_range[1] if self.local_batch_range else None
        return layout(batch, gpus, local_max, accumulate=self.accumulate).steps


@dataclass(frozen=True, slots=True)
class Allocation:
    """The plan for one job: GPUs (0: not running), batch size, useful samples per second."""

    job_id: str
    gpus: int
    batch_size: int | None
    progress: float


@dataclass(frozen=True, slots=True)
class Plan:
    """Allocations in the order of the input jobs; ``changed``: running jobs rescaled;
    ``yielded``: running jobs stopped so that jobs that waited too long can start (fairness
    rule 2), as opposed to stops forced by the cluster's size."""

    allocations: tuple[Allocation, ...]
    objective: float
    changed: tuple[str, ...]
    yielded: tuple[str, ...] = ()


def nodes_for(gpus: int, gpus_per_node: int) -> int:
    """Machines a packed gang of ``gpus`` GPUs spans (at least one)."""
    return max(1, -(-gpus // gpus_per_node))


def useful_progress(
    job: ElasticJob,
    gpus: int,
    batch: int,
    *,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    nodes: int | None = None,
) -> float:
    """Useful samples per second ``T(g, b) * E(b)`` of ``job`` at ``gpus`` and ``batch``, on
    ``nodes`` machines (None: the fewest that hold them)."""
    if gpus == 0:
        return 0.0
    steps = job.accumulation_steps(gpus, batch)
    machines = nodes if nodes is not None else nodes_for(gpus, gpus_per_node)
    if job.goodput is not None:
        return goodput_at(job.goodput, gpus, machines, batch, steps)
    throughput = job.model.throughput(gpus, batch, machines, steps)
    return throughput * efficiency(batch, job.base_batch, job.grad_stats)


def optimize(
    jobs: Sequence[ElasticJob],
    total_gpus: int,
    *,
    restart_penalty: float = 0.1,
    batch_choices: int = 8,
    fairness_after_s: float = 600.0,
    fixed_batch: bool = False,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    restart_cost_s: float | None = None,
    admit_after_s: float | None = None,
    objective: Objective = "throughput",
    turn_s: float | None = None,
) -> Plan:
    """Best GPUs and batch size for every job; see the module docstring for the objective.

    ``gpus_per_node`` tells the throughput model how many machines an allocation spans
    (learners are assumed packed).
    """
    if total_gpus < 0:
        raise ValueError("total_gpus must be >= 0")
    if restart_penalty < 0:
        raise ValueError("restart_penalty must be >= 0")
    if restart_cost_s is not None and restart_cost_s < 0:
        raise ValueError("restart_cost_s must be >= 0")
    if admit_after_s is not None and admit_after_s < 0:
        raise ValueError("admit_after_s must be >= 0")
    if turn_s is not None and turn_s < 0:
        raise ValueError("turn_s must be >= 0")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}")
    if batch_choices < 1:
        raise ValueError("batch_choices must be >= 1")
    if gpus_per_node < 1:
        raise ValueError("gpus_per_node must be >= 1")
    ids = [job.id for job in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("job ids must be unique")
    if not jobs:
        return Plan(allocations=(), objective=0.0, changed=())

    grid = progress_grid(
        jobs,
        total_gpus,
        batch_choices=batch_choices,
        fixed_batch=fixed_batch,
        gpus_per_node=gpus_per_node,
    )
    options = evaluate(
        grid,
        restart_penalty=restart_penalty,
        restart_cost_s=restart_cost_s,
        proportional=objective == "proportional",
    )
    preemptible = _add_fairness_terms(
        jobs,
        options,
        fairness_after_s,
        fairness_after_s if admit_after_s is None else admit_after_s,
        fairness_after_s if turn_s is None else turn_s,
    )
    unit = math.gcd(*(job.gpus_per_learner for job in jobs))
    chosen = _solve(options, total_gpus // unit, unit)

    rows = np.arange(len(jobs))
    gpus = options.gpus[rows, chosen].tolist()
    batches = options.batches[rows, chosen].tolist()
    progress = options.progress[rows, chosen].tolist()
    allocations = []
    changed = []
    for job, g, batch, samples_per_s in zip(jobs, gpus, batches, progress, strict=True):
        allocations.append(Allocation(job.id, g, batch if g else None, samples_per_s))
        if job.running and (g != job.current_gpus or (g and batch != job.effective_current_batch)):
            changed.append(job.id)
    achieved = float(options.utility[rows, chosen].sum())
    yielded = tuple(
        job.id for job, g, may in zip(jobs, gpus, preemptible, strict=True) if may and g == 0
    )
    return Plan(
        allocations=tuple(allocations),
        objective=achieved,
        changed=tuple(changed),
        yielded=yielded,
    )


def _add_fairness_terms(
    jobs: Sequence[ElasticJob],
    options: Options,
    fairness_after_s: float,
    admit_after_s: float,
    turn_s: float,
) -> list[bool]:
    """Turn the fairness rules into bonuses that dominate every objective difference; the
    running jobs that may be stopped for a starved one (those that have had a turn)."""
    utility = options.utility
    finite = np.where(np.isfinite(utility), utility, 0.0)
    spread = 1.0 + float((utility.max(axis=1) - finite.min(axis=1)).sum())
    running = np.array([job.running for job in jobs])
    waited = np.array([job.waited_s for job in jobs])
    starved = ~running & (waited > fairness_after_s)
    admitted = ~running & (waited > admit_after_s) & ~starved
    highest_starved = max(
        (job.priority for job, is_starved in zip(jobs, starved, strict=True) if is_starved),
        default=None,
    )
    preemptible = np.array(
        [
            job.running
            and highest_starved is not None
            and job.priority <= highest_starved
            and job.running_s >= turn_s
            for job in jobs
        ]
    )
    # With S the spread and n jobs past either bound: an admission of a starved job earns
    # A = (2n + 4) S and stopping a preemptible job costs A - 2S, so admitting m starved jobs
    # pays for m stops and never m + 1, even with the 2S that each of k jobs past
    # ``admit_after_s`` only earns (m A + 2k S - (m + 1)(A - 2S) < 0 for m + k <= n): those
    # are admitted by shrinking others, never by stopping one. Stopping any other running
    # job costs more than every admission together.
    count = int((starved | admitted).sum())
    admit_bonus = (2.0 * count + 4.0) * spread
    drop_cost = admit_bonus * (count + 2)
    options.value[starved, 1:] += admit_bonus
    options.value[admitted, 1:] += 2.0 * spread
    options.value[running & ~preemptible, 0] -= drop_cost
    options.value[preemptible, 0] -= admit_bonus - 2.0 * spread
    return [bool(may) for may in preemptible]


def _solve(options: Options, capacity: int, unit: int) -> list[int]:
    """Run the recurrence of the module docstring; return the chosen option per job.

    Row ``i`` is only computed up to ``reach[i]``, the most units the first ``i`` jobs can
    use; beyond it the row is flat, and the previous row is extended with its last value
    before it is read there.
    """
    sizes = (options.gpus // unit).tolist()
    values = options.value.tolist()
    count = len(values)
    table = np.empty((count + 1, capacity + 1), dtype=np.float64)
    table[0] = 0.0
    scratch = np.empty(capacity + 1, dtype=np.float64)
    reach = [0] * (count + 1)

    for i in range(count):
        previous, row = table[i], table[i + 1]
        own = [
            (size, value)
            for size, value in zip(sizes[i][1:], values[i][1:], strict=True)
            if value > -math.inf and size <= capacity
        ]
        reach[i + 1] = min(capacity, reach[i] + max((size for size, _ in own), default=0))
        limit = reach[i + 1] + 1
        previous[reach[i] + 1 : limit] = previous[reach[i]]
        np.add(previous[:limit], values[i][0], out=row[:limit])
        for shift, value in own:
            span = limit - shift
            np.add(previous[:span], value, out=scratch[:span])
            np.maximum(row[shift:limit], scratch[:span], out=row[shift:limit])

    chosen = [0] * count
    remaining = capacity
    for i in range(count - 1, -1, -1):
        remaining = min(remaining, reach[i + 1])
        target = float(table[i + 1, remaining])
        chosen[i] = reaching(sizes[i], values[i], options.preferred[i], table[i], remaining, target)
        remaining -= sizes[i][chosen[i]]
    return chosen


def reaching(
    sizes: Sequence[int],
    values: Sequence[float],
    preferred: int,
    before: FloatArray,
    remaining: int,
    target: float,
) -> int:
    """The option of one job that, added to the row ``before`` it with ``remaining`` units,
    reaches ``target``: its ``preferred`` one (the current allocation) on ties."""
    slack = _TIE_TOLERANCE * (1.0 + abs(target))
    for k in (preferred, *range(len(sizes))):
        size, value = sizes[k], values[k]
        if (
            value > -math.inf
            and size <= remaining
            and float(before[remaining - size]) + value >= target - slack
        ):
            return int(k)
    # The optimum is always reached by some option.
    raise AssertionError(
        "elastic DP walk-back found no option reaching the optimum"
    )  # pragma: no cover
