"""How a global batch is laid out on a job's GPUs: each GPU's micro-batch and the number of
micro-batches it accumulates gradients over before one exchange and one optimizer step.

A job whose manifest allows it (``elastic.accumulate_gradients``) may run a batch larger
than its GPUs hold at once: a GPU whose share ``ceil(b / g)`` exceeds the per-GPU maximum
``m`` runs ``s = ceil(share / m)`` forward/backward passes of ``ceil(share / s)`` samples,
summing their gradients, and exchanges them once. Without accumulation (or without a per-GPU
maximum) ``s`` is 1 and the micro-batch is the whole share. The optimizer values layouts
with ``accumulation_steps``; the lifecycle manager tells learners theirs, and the autoscaler
reads their step times, with ``running_batch`` and ``job_layout``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ffdl.core.manifest import ElasticSpec
from ffdl.elastic.throughput import FloatArray

# Shares that land a hair above a multiple of the maximum through float division still
# take the smaller number of steps.
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """``batch`` samples per optimizer step on ``gpus`` GPUs, each running ``steps``
    micro-batches of at most ``micro_batch`` samples."""

    batch: int
    gpus: int
    micro_batch: int
    steps: int


def layout(batch: int, gpus: int, local_max: int | None, *, accumulate: bool) -> BatchLayout:
    """The layout of ``batch`` on ``gpus`` GPUs holding at most ``local_max`` samples each."""
    if batch < 1 or gpus < 1:
        raise ValueError(f"need batch >= 1 and gpus >= 1, got batch {batch} on {gpus} GPU(s)")
    share = -(-batch // gpus)
    steps = -(-share // local_max) if accumulate and local_max else 1
    return BatchLayout(batch=batch, gpus=gpus, micro_batch=-(-share // steps), steps=steps)


def running_batch(elastic: ElasticSpec | None, chosen: int | None) -> int | None:
    """The global batch a job's learners run: the one the autoscaler ``chosen``, else the
    bottom of an elastic batch range (the batch the optimizer values the job against)."""
    if chosen is None and elastic is not None and elastic.batch_size is not None:
        return elastic.batch_size.min
    return chosen


def job_layout(
    elastic: ElasticSpec | None, batch: int, gpus: int, gpu_type: str | None = None
) -> BatchLayout | None:
    """``batch`` on ``gpus`` GPUs (of ``gpu_type``) as a job with per-GPU batch limits runs
    it; None for a job without limits there."""
    local = elastic.local_batch_for(gpu_type) if elastic is not None else None
    if elastic is None or local is None or gpus < 1:
        return None
    return layout(batch, gpus, local.max, accumulate=elastic.accumulate_gradients)


def accumulation_steps(
    shares: FloatArray, local_max: FloatArray, accumulate: FloatArray
) -> FloatArray:
    """``layout``'s steps element-wise: ``shares`` per GPU (``b / g``), the per-GPU maxima
    (``inf`` for none) and 1.0 where the job accumulates, 0.0 where it does not."""
    needed = np.ceil(shares / local_max - _EPS)
    result: FloatArray = np.where(
        (accumulate > 0) & np.isfinite(needed), np.maximum(needed, 1.0), 1.0
    )
    return result
