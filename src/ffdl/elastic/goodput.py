"""Goodput models: a job's useful samples per second as a function of its GPUs, the
machines they span and its global batch size.

The elastic optimizer values allocations through this one small interface. Today's model,
the fitted four-parameter step time of ``ffdl.elastic.throughput`` times the statistical
efficiency of ``ffdl.elastic.efficiency``, is ``ParametricGoodput``; a measured speed-up
table, a profile or any other curve can be given to the optimizer as it is
(``ElasticJob.goodput``), without being squeezed into that form first, so that a fit's error
never decides an allocation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ffdl.elastic.efficiency import GradientStats, efficiencies
from ffdl.elastic.throughput import FloatArray, ThroughputModel


class GoodputModel(Protocol):
    """Useful samples per second of one job (throughput times statistical efficiency)."""

    def goodput(
        self, gpus: FloatArray, nodes: FloatArray, batches: FloatArray, steps: FloatArray
    ) -> FloatArray:
        """Element-wise over arrays of one shape: ``gpus`` >= 1, ``1 <= nodes <= gpus``,
        ``batches`` >= 1 (global), ``steps`` >= 1: the micro-batches each GPU accumulates
        over per optimizer step (``ffdl.elastic.accumulation``; always 1 for a job that does
        not accumulate). Values must be finite and >= 0."""
        ...


@dataclass(frozen=True, slots=True)
class ParametricGoodput:
    """The fitted step-time model times the gradient-noise-scale efficiency at ``b0``."""

    model: ThroughputModel
    base_batch: int
    grad_stats: GradientStats | None = None

    def goodput(
        self, gpus: FloatArray, nodes: FloatArray, batches: FloatArray, steps: FloatArray
    ) -> FloatArray:
        throughput = self.model.throughputs(gpus, batches, nodes, steps)
        result: FloatArray = throughput * efficiencies(batches, self.base_batch, self.grad_stats)
        return result


def goodput_at(
    model: GoodputModel, gpus: float, nodes: float, batch: float, steps: float = 1.0
) -> float:
    """``model`` at one point."""
    one = np.array([1.0])
    return float(model.goodput(one * gpus, one * nodes, one * batch, one * steps)[0])
