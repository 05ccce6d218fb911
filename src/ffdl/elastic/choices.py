"""The choices the elastic optimizer weighs for one job: its candidate GPU counts and batch
sizes (``ffdl.elastic.optimizer`` explains why these and not others)."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ffdl.elastic.optimizer import ElasticJob

# At most this many geometrically spaced GPU counts per job (plus whole nodes and its own).
MAX_GPU_CHOICES = 16
DEFAULT_GPUS_PER_NODE = 8


def gpu_candidates(
    job: ElasticJob,
    total_gpus: int,
    *,
    fixed_batch: bool = False,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
) -> tuple[int, ...]:
    """The non-zero GPU counts the optimizer considers for ``job``, ascending.

    Multiples of ``gpus_per_learner`` in ``gpu_range`` (narrowed to the counts some
    candidate batch can feed within ``local_batch_range``), thinned to ``MAX_GPU_CHOICES``
    geometrically spaced values; every count that fills whole nodes (a multiple of
    ``gpus_per_node`` and of ``gpus_per_learner``) in the range, thinned the same way only
    when there are more than ``MAX_GPU_CHOICES`` of them; and the current count when it is
    allowed; capped at ``total_gpus``. The thinning ignores ``total_gpus`` so more GPUs
    never remove a choice.
    """
    batches = (
        (job.base_batch, job.base_batch)
        if fixed_batch or job.batch_range is None
        else job.batch_range
    )
    return _gpu_choices(
        job.gpu_range,
        job.gpus_per_learner,
        batches,
        job.local_batch_range,
        job.accumulate,
        job.current_gpus,
        total_gpus,
        gpus_per_node,
    )


# Cached by value: one job's variants on several GPU types, and the same job from one
# autoscaler pass to the next, ask the same question.
@lru_cache(maxsize=16384)
def _gpu_choices(
    gpu_range: tuple[int, int],
    step: int,
    batches: tuple[int, int],
    local_batch_range: tuple[int, int] | None,
    accumulate: bool,
    current: int,
    total_gpus: int,
    gpus_per_node: int,
) -> tuple[int, ...]:
    low, high = gpu_range
    if local_batch_range is not None:
        smallest, largest = batches
        local_low, local_high = local_batch_range
        if not accumulate:
            low = max(low, -(-smallest // local_high))
        high = min(high, largest // local_low)
    choices = set(_thinned_multiples(low, high, step, MAX_GPU_CHOICES))
    # A gang on whole nodes packs best and talks least across machines: the geometric
    # spacing alone would skip most of these (on 4-GPU nodes, 1..64 has no 8, 24, 32, 48).
    whole_nodes = math.lcm(step, gpus_per_node)
    choices.update(_thinned_multiples(max(low, whole_nodes), high, whole_nodes, MAX_GPU_CHOICES))
    if current > 0 and current % step == 0 and low <= current <= high:
        choices.add(current)
    return tuple(sorted(g for g in choices if g <= total_gpus))


def batch_candidates(
    job: ElasticJob, *, batch_choices: int = 8, fixed_batch: bool = False
) -> tuple[int, ...]:
    """The batch sizes the optimizer considers for ``job``, ascending.

    A geometric grid of ``batch_choices`` sizes from the range's minimum to its maximum, plus
    ``b0`` and the current batch when it lies in the range; only ``b0`` without a range or
    with ``fixed_batch``.
    """
    if job.batch_range is None or fixed_batch:
        return (job.base_batch,)
    low, high = job.batch_range
    current = job.current_batch
    extra = current if current is not None and low <= current <= high else job.base_batch
    return _batch_grid(low, high, job.base_batch, extra, batch_choices)


@lru_cache(maxsize=4096)
def _thinned_multiples(low: int, high: int, step: int, limit: int) -> tuple[int, ...]:
    first = -(-low // step) * step
    last = high // step * step
    if first > last:
        return ()
    if (last - first) // step + 1 <= limit:
        return tuple(range(first, last + 1, step))
    picks = {first, last}
    ratio = last / first
    for t in range(1, limit - 1):
        target = first * ratio ** (t / (limit - 1))
        picks.add(min(max(round(target / step) * step, first), last))
    return tuple(sorted(picks))


@lru_cache(maxsize=4096)
def _batch_grid(low: int, high: int, base: int, extra: int, size: int) -> tuple[int, ...]:
    picks = {low, high, base, extra}
    if size >= 2:
        ratio = high / low
        for t in range(1, size - 1):
            picks.add(min(max(round(low * ratio ** (t / (size - 1))), low), high))
    return tuple(sorted(picks))


def clear_caches() -> None:
    """Forget every cached answer, as a fresh process starts (for benchmarks)."""
    for cached in (_gpu_choices, _thinned_multiples, _batch_grid):
        cached.cache_clear()
