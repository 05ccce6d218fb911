"""Every elastic job's options as arrays: what each (job, GPU count) is worth to the optimizer.

``ffdl.elastic.optimizer`` explains the objective; this module computes its terms for all
jobs at once. ``progress_grid`` evaluates each job's useful progress over its candidate GPU
counts and batches (``ffdl.elastic.choices``), with its reference (one GPU at ``b0``) and its
progress now; ``evaluate`` turns that into ``Options``: per option the GPUs, the best batch,
the progress and the utility (weighted, normalised, restart penalty subtracted). Rows may
differ in the cluster they are valued on (``total_gpus`` and ``gpus_per_node`` per row), so
``ffdl.elastic.by_type`` values a job on every GPU type in one pass.

Python touches each job once, to read its fields and its candidates (cached by their
inputs: the variants of one job on several types, and the same job from one autoscaler pass
to the next, share them); everything else is numpy over the padded grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ffdl.elastic.accumulation import accumulation_steps
from ffdl.elastic.choices import batch_candidates, gpu_candidates
from ffdl.elastic.efficiency import efficiencies_for, noise_scale
from ffdl.elastic.goodput import goodput_at
from ffdl.elastic.throughput import FloatArray, step_times

if TYPE_CHECKING:
    from ffdl.elastic.optimizer import ElasticJob

# What a batch-only change of a job that rebatches in place costs, as a share of a restart's.
REBATCH_IN_PLACE_SHARE = 0.1
# Below this speed-up the logarithm of the proportional objective goes on as its tangent.
_LOG_FLOOR = 0.05

IntArray = npt.NDArray[np.int64]


def priority_weight(priority: int) -> float:
    """Objective weight of a job: 1 + priority / 50, priority clamped to 0..100."""
    return 1.0 + min(max(priority, 0), 100) / 50.0


def restart_share(job: ElasticJob, restart_penalty: float, restart_cost_s: float | None) -> float:
    """The share of its current progress a rescale costs ``job``: ``restart_penalty``, or,
    with ``restart_cost_s`` and the job's age, ``restart_cost_s * (restarts + 1) / (age_s +
    restart_cost_s)`` (at most 1)."""
    if restart_cost_s is None or job.age_s is None:
        return restart_penalty
    return min(1.0, restart_cost_s * (job.restarts + 1) / (job.age_s + restart_cost_s))


@dataclass(slots=True)
class Options:
    """Every job's options as (job, option) arrays; option 0 is always "no GPUs".

    Options a job does not have (padding, or GPU counts its batches cannot feed) have a
    utility and value of ``-inf``.
    """

    gpus: IntArray
    batches: IntArray  # 0 where the option runs no GPUs
    progress: FloatArray  # useful samples per second
    utility: FloatArray  # weighted, normalised, restart penalty subtracted
    value: FloatArray  # utility plus the fairness terms: what the DP maximises
    preferred: list[int]  # option to keep on ties: the current allocation, else 0


@dataclass(slots=True)
class ProgressGrid:
    """Useful progress of every (job, GPU option, batch option), and what it is measured
    against. GPU options are ``gpu_grid``'s columns (0: padding); the real ones, row by row,
    are the *pairs* the batch arrays are kept for (``pair_of``), since most jobs have far
    fewer options than the widest."""

    jobs: Sequence[ElasticJob]
    gpu_grid: IntArray  # (jobs, GPU options)
    batch_grid: IntArray  # (jobs, batch candidates), 0: padding
    pair_of: IntArray  # (jobs, GPU options): the pair's row below, -1 for padding
    batches: FloatArray  # (pairs, batches tried): candidates, then filling ones
    progress: FloatArray  # same shape; -inf where the option does not exist
    exists: npt.NDArray[np.bool_]
    reference: FloatArray  # per job: one GPU at b0
    current: FloatArray  # per job: its allocation now (one GPU at its batch while queued)
    fields: dict[str, FloatArray]  # per-job columns (``_FIELDS``)


# The per-job numbers the grid is evaluated from, in the order ``_fields_of`` reads them.
_FIELDS = (
    "alpha", "beta", "gamma", "delta", "base", "noise", "weight", "current_gpus",
    "current_batch", "local_low", "local_high", "accumulate", "current_nodes", "age",
    "restarts", "batch_low", "batch_high", "rebatch",
)  # fmt: skip


def _fields_of(job: ElasticJob, fixed_batch: bool) -> tuple[float, ...]:
    model, local = job.model, job.local_batch_range
    low, high = (
        (job.base_batch, job.base_batch)
        if job.batch_range is None or fixed_batch
        else job.batch_range
    )
    return (
        model.alpha,
        model.beta,
        model.gamma,
        model.delta,
        job.base_batch,
        noise_scale(job.grad_stats) if job.grad_stats is not None else math.inf,
        priority_weight(job.priority) * job.share_weight,
        job.current_gpus,
        job.current_batch if job.current_batch is not None else job.base_batch,
        local[0] if local else 1,
        local[1] if local else math.inf,
        1.0 if job.accumulate else 0.0,
        job.current_nodes if job.current_nodes is not None else 0,
        job.age_s if job.age_s is not None else math.nan,
        job.restarts,
        low,
        high,
        1.0 if job.rebatch_in_place else 0.0,
    )


def progress_grid(
    jobs: Sequence[ElasticJob],
    total_gpus: int | Sequence[int],
    *,
    batch_choices: int,
    fixed_batch: bool,
    gpus_per_node: int | Sequence[int],
) -> ProgressGrid:
    """Every job's useful progress over its candidates; ``total_gpus`` and
    ``gpus_per_node`` for all jobs or one per job."""
    count = len(jobs)
    totals = [total_gpus] * count if isinstance(total_gpus, int) else list(total_gpus)
    per_node_list = (
        [gpus_per_node] * count if isinstance(gpus_per_node, int) else list(gpus_per_node)
    )
    gpu_grid = _padded(
        [
            gpu_candidates(job, total, fixed_batch=fixed_batch, gpus_per_node=per_node)
            for job, total, per_node in zip(jobs, totals, per_node_list, strict=True)
        ]
    )
    batch_grid = _padded(
        [
            batch_candidates(job, batch_choices=batch_choices, fixed_batch=fixed_batch)
            for job in jobs
        ]
    )
    fields = dict(
        zip(
            _FIELDS,
            np.array([_fields_of(job, fixed_batch) for job in jobs], dtype=np.float64).T,
            strict=True,
        )
    )
    per_node = np.array(per_node_list, dtype=np.float64)
    running = fields["current_gpus"] > 0
    kept_nodes = running & (fields["current_nodes"] > 0)
    # A running gang keeps its machines while its count stays; other counts are packed.
    nodes_now = np.where(
        kept_nodes,
        fields["current_nodes"],
        np.maximum(1.0, np.ceil(fields["current_gpus"] / per_node)),
    )
    real = gpu_grid > 0
    pair_of = np.full(gpu_grid.shape, -1, dtype=np.int64)
    pair_of[real] = np.arange(int(real.sum()))
    job_of = np.nonzero(real)[0]

    def each(name: str) -> FloatArray:
        """A per-job column, one value per pair."""
        column: FloatArray = fields[name][job_of]
        return column

    g = gpu_grid[real].astype(np.float64)
    current_gpus = each("current_gpus")
    nodes = np.where(
        kept_nodes[job_of] & (g == current_gpus),
        each("current_nodes"),
        np.maximum(1.0, np.ceil(g / per_node[job_of])),
    )
    pair_low, pair_high = each("local_low"), each("local_high")
    b = _with_filling_batches(
        g, batch_grid[job_of], (each("batch_low"), each("batch_high")), (pair_low, pair_high)
    )
    # Every GPU gets a share of the batch inside its local limits (at least one sample), or
    # above the maximum in several micro-batches when the job accumulates.
    share = b / g[:, None]
    high, accumulates = pair_high[:, None], each("accumulate")[:, None]
    exists = (share >= pair_low[:, None]) & ((share <= high) | (accumulates > 0))
    steps = accumulation_steps(share, high, accumulates)
    # The exchange's cost depends on the GPUs and machines only: once per pair.
    sync = np.where(g > 1, each("gamma") * np.log2(g) + each("delta") * (nodes - 1.0), 0.0)
    seconds = each("alpha")[:, None] * steps + each("beta")[:, None] * share + sync[:, None]
    b_safe = np.maximum(b, 1.0)
    efficiency = efficiencies_for(b_safe, each("base")[:, None], each("noise")[:, None])
    progress = np.where(exists, b_safe / seconds * efficiency, -np.inf)

    local_high, accumulate = fields["local_high"], fields["accumulate"]
    per_job = tuple(fields[name] for name in ("alpha", "beta", "gamma", "delta", "base", "noise"))
    ones = np.ones(count)
    reference_steps = accumulation_steps(fields["base"], local_high, accumulate)
    reference = _progress_of(ones, fields["base"], ones, reference_steps, per_job)
    now_gpus = np.maximum(fields["current_gpus"], 1.0)
    now_batch = fields["current_batch"]
    now_steps = accumulation_steps(now_batch / now_gpus, local_high, accumulate)
    current = _progress_of(now_gpus, now_batch, nodes_now, now_steps, per_job)
    for j, job in enumerate(jobs):
        if job.goodput is not None:
            pairs = pair_of[j][real[j]]
            progress[pairs], reference[j], current[j] = _use_own_goodput(
                job, g[pairs], nodes[pairs], b[pairs], steps[pairs], exists[pairs],
                float(nodes_now[j]),
            )  # fmt: skip
    return ProgressGrid(
        jobs=jobs,
        gpu_grid=gpu_grid,
        batch_grid=batch_grid,
        pair_of=pair_of,
        batches=b,
        progress=progress,
        exists=exists,
        reference=reference,
        current=current,
        fields=fields,
    )


def evaluate(
    grid: ProgressGrid,
    *,
    restart_penalty: float,
    restart_cost_s: float | None,
    proportional: bool,
    anchors: tuple[FloatArray, FloatArray] | None = None,
    moving: npt.NDArray[np.bool_] | None = None,
) -> Options:
    """The value of every (job, GPU count) option of ``grid``.

    ``anchors`` (references, current progress), when given, replace each job's own progress
    on one GPU at ``b0`` and at its current allocation (``ffdl.elastic.by_type``: a job's
    speed-ups on every GPU type are counted against one reference, and a job that would
    move to another type pays for leaving the progress it makes on its own). ``moving``
    marks jobs whose current allocation is elsewhere: every option of theirs is a restart.
    """
    fields, gpu_grid, batch_grid = grid.fields, grid.gpu_grid, grid.batch_grid
    reference, current = anchors if anchors is not None else (grid.reference, grid.current)
    weight = fields["weight"]
    real = grid.pair_of >= 0
    best_index = np.argmax(grid.progress, axis=1)[:, None]
    best_progress = np.full(gpu_grid.shape, -np.inf)
    best_progress[real] = np.take_along_axis(grid.progress, best_index, axis=1)[:, 0]
    best_batch = np.zeros(gpu_grid.shape, dtype=np.int64)
    best_batch[real] = np.take_along_axis(grid.batches, best_index, axis=1)[:, 0]
    feasible = np.zeros(gpu_grid.shape, dtype=bool)
    feasible[real] = grid.exists.any(axis=1)

    running = fields["current_gpus"] > 0
    if restart_cost_s is None:
        shares = np.full(len(weight), restart_penalty)
    else:
        age = fields["age"]
        charged = restart_cost_s * (fields["restarts"] + 1.0) / (age + restart_cost_s)
        shares = np.where(np.isnan(age), restart_penalty, np.minimum(1.0, charged))
    penalty = np.where(running, shares * current / reference, 0.0)
    utility = weight[:, None] * (best_progress / reference[:, None] - penalty[:, None])

    # Keeping a running job's exact allocation costs no restart.
    current_gpus = fields["current_gpus"].astype(np.int64)
    at_current = gpu_grid == current_gpus[:, None]
    stays = running & at_current.any(axis=1)
    if moving is not None:
        stays &= ~moving
    column = np.argmax(at_current, axis=1)
    preferred = np.where(stays, column + 1, 0)
    in_place = np.flatnonzero(stays & (fields["rebatch"] > 0))
    utility[in_place, column[in_place]] += (
        weight[in_place] * penalty[in_place] * (1.0 - REBATCH_IN_PLACE_SHARE)
    )
    at_batch = batch_grid == fields["current_batch"].astype(np.int64)[:, None]
    stay_jobs = np.flatnonzero(stays & at_batch.any(axis=1))
    if stay_jobs.size:
        stay_gpus = column[stay_jobs]
        stay_batches = np.argmax(at_batch[stay_jobs], axis=1)
        stay_progress = grid.progress[grid.pair_of[stay_jobs, stay_gpus], stay_batches]
        stay_utility = weight[stay_jobs] * stay_progress / reference[stay_jobs]
        better = np.isfinite(stay_progress) & (stay_utility >= utility[stay_jobs, stay_gpus])
        rows, cols = stay_jobs[better], stay_gpus[better]
        utility[rows, cols] = stay_utility[better]
        best_progress[rows, cols] = stay_progress[better]
        best_batch[rows, cols] = batch_grid[rows, stay_batches[better]]

    none = np.zeros((len(weight), 1))
    utility = np.hstack([none, utility])
    if proportional:
        utility = weight[:, None] * _log_speedup(utility / weight[:, None])
    return Options(
        gpus=np.hstack([none.astype(np.int64), gpu_grid]),
        batches=np.hstack([none.astype(np.int64), np.where(feasible, best_batch, 0)]),
        progress=np.hstack([none, np.where(np.isfinite(best_progress), best_progress, 0.0)]),
        utility=utility,
        value=utility.copy(),
        preferred=preferred.tolist(),
    )


def _padded(lists: Sequence[Sequence[int]]) -> IntArray:
    """Ragged lists of positive integers as one array, padded with 0."""
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    grid = np.zeros((len(lists), int(lengths.max(initial=1))), dtype=np.int64)
    grid[np.arange(grid.shape[1]) < lengths[:, None]] = np.fromiter(
        chain.from_iterable(lists), dtype=np.int64, count=int(lengths.sum())
    )
    return grid


def _progress_of(
    g: FloatArray,
    b: FloatArray,
    nodes: FloatArray,
    steps: FloatArray,
    params: tuple[FloatArray, ...],
) -> FloatArray:
    a, be, ga, de, b0, ns = params
    seconds = step_times(a, be, ga, de, g, b, nodes, steps)
    result: FloatArray = b / seconds * efficiencies_for(b, b0, ns)
    return result


def _log_speedup(speedup: FloatArray) -> FloatArray:
    """log of a speed-up, continued below ``_LOG_FLOOR`` by its tangent so that no GPUs (0)
    and a net loss after a restart's cost stay finite and keep their order."""
    low = np.log(_LOG_FLOOR) + (speedup - _LOG_FLOOR) / _LOG_FLOOR
    with np.errstate(divide="ignore", invalid="ignore"):
        logged = np.log(np.maximum(speedup, _LOG_FLOOR))
    return np.where(np.isfinite(speedup), np.where(speedup >= _LOG_FLOOR, logged, low), speedup)


def _with_filling_batches(
    gpus: FloatArray,
    batch_grid: IntArray,
    batch_limits: tuple[FloatArray, FloatArray],
    local_limits: tuple[FloatArray, FloatArray],
) -> FloatArray:
    """The batches tried for every pair (a job at one GPU count; ``batch_grid`` is its job's
    candidates), shape (pairs, batches): the candidates, then the largest and the smallest
    batch of its range whose share per GPU fits that GPU count (see
    ``ffdl.elastic.optimizer``)."""
    low, high = batch_limits
    local_low, local_high = local_limits
    fullest = np.clip(local_high * gpus, low, high)
    emptiest = np.clip(local_low * gpus, low, high)
    result: FloatArray = np.concatenate(
        [batch_grid.astype(np.float64), fullest[:, None], emptiest[:, None]], axis=1
    )
    return result


def _use_own_goodput(
    job: ElasticJob,
    gpus: FloatArray,
    nodes: FloatArray,
    batches: FloatArray,
    steps: FloatArray,
    exists: npt.NDArray[np.bool_],
    nodes_now: float,
) -> tuple[FloatArray, float, float]:
    """``job``'s pairs (GPU options x batches tried), its reference (one GPU at ``b0``) and
    its current progress, from its own goodput model."""
    assert job.goodput is not None
    g = np.broadcast_to(gpus[:, None], exists.shape)
    b = np.maximum(batches, 1.0)
    machines = np.broadcast_to(nodes[:, None], exists.shape)
    row = np.where(exists, job.goodput.goodput(g, machines, b, steps), -np.inf)
    reference = goodput_at(
        job.goodput, 1, 1, job.base_batch, job.accumulation_steps(1, job.base_batch)
    )
    if reference <= 0:
        raise ValueError(f"job {job.id}: its goodput on one GPU at its own batch must be > 0")
    current_gpus = max(job.current_gpus, 1)
    current_batch = job.effective_current_batch
    current = goodput_at(
        job.goodput,
        current_gpus,
        nodes_now,
        current_batch,
        job.accumulation_steps(current_gpus, current_batch),
    )
    return row, reference, current
