"""Measured speed: a family's step time read from profiled points, with no formula behind it.

Pollux's published simulator carries, for each of its six training jobs, step times measured
at (nodes, GPUs, local batch) points: every placement of up to 16 GPUs on up to 4 nodes, and
spreads of 6 to 64 GPUs on 6, 8, 12 and 16 nodes. ``data/pollux-profiles.csv`` holds them,
one row per point (see ``data/README.md`` for the source and how it was reduced). The curves
are what real jobs did, noise included: yolov3's step on one GPU is faster at a local batch
of 8 than at 6, cifar10's 64-GPU step is faster at 129 per GPU than at 91. No four-parameter
model reproduces them, which is the point of using them.

``MeasuredSpeed`` reads a step time anywhere on a cluster of up to ``max_nodes`` nodes of
``gpus_per_node`` GPUs (16 of 4 by default, what was measured; larger queries read the
largest size), in three linear steps, all precomputed on a grid once:

1. **Local batch**: along the batches measured for one (nodes, GPUs), linearly, extended past
   the ends by the end segments' slope (a step's compute grows about linearly with its
   batch), and never below ``MIN_STEP_S``.
2. **GPUs**, at a measured node count: between the nearest measured GPU counts, linearly;
   beyond them, the nearest one.
3. **Nodes** that were not measured (5, 7, 9 ...): between the nearest measured node counts,
   at the same GPUs per node, weighted by distance.

Throughput is ``global batch / step time``, as for ``ffdl.elastic.throughput.ThroughputModel``,
whose vectorised interface this shares.
"""

from __future__ import annotations

import bisect
import csv
import functools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ffdl.elastic.throughput import FloatArray

MIN_STEP_S = 1e-4
# The largest cluster the profiles describe; beyond it a query reads the largest measured size.
MEASURED_NODES, MEASURED_GPUS_PER_NODE = 16, 4


@dataclass(frozen=True, slots=True)
class ProfilePoint:
    """One measured step time."""

    nodes: int
    gpus: int
    local_batch: int
    step_time_s: float

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= self.gpus:
            raise ValueError(f"a profile point needs 1 <= nodes <= gpus, got {self}")
        if self.local_batch < 1 or not self.step_time_s > 0:
            raise ValueError(f"a profile point needs a local batch >= 1 and a time > 0: {self}")


class MeasuredSpeed:
    """Throughput read from measured step times (see the module docstring)."""

    def __init__(
        self,
        points: Iterable[ProfilePoint],
        *,
        max_nodes: int = MEASURED_NODES,
        gpus_per_node: int = MEASURED_GPUS_PER_NODE,
    ) -> None:
        by_shape: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
        for p in points:
            by_shape[(p.nodes, p.gpus)][p.local_batch] = p.step_time_s
        if (1, 1) not in by_shape:
            raise ValueError("a measured profile needs points on one GPU")
        self.local_batches = np.array(
            sorted({b for times in by_shape.values() for b in times}), dtype=np.float64
        )
        if len(self.local_batches) < 2:
            raise ValueError("a measured profile needs at least two local batch sizes")
        self.max_nodes, self.max_gpus = max_nodes, max_nodes * gpus_per_node
        rows = {shape: self._along_batch(times) for shape, times in by_shape.items()}
        self._grid = self._fill(rows)

    def step_times(self, gpus: FloatArray, batches: FloatArray, nodes: FloatArray) -> FloatArray:
        """Seconds per step, element-wise over broadcastable arrays."""
        g, b, n = np.broadcast_arrays(
            np.asarray(gpus, dtype=np.float64),
            np.asarray(batches, dtype=np.float64),
            np.asarray(nodes, dtype=np.float64),
        )
        gi = np.clip(g, 1, self.max_gpus).astype(np.int64) - 1
        ni = np.minimum(np.clip(n, 1, self.max_nodes).astype(np.int64) - 1, gi)
        local = b / np.maximum(g, 1.0)
        xs = self.local_batches
        right = np.clip(np.searchsorted(xs, local, side="right"), 1, len(xs) - 1)
        left = right - 1
        weight = (local - xs[left]) / (xs[right] - xs[left])
        low, high = self._grid[gi, ni, left], self._grid[gi, ni, right]
        result: FloatArray = np.maximum(low + weight * (high - low), MIN_STEP_S)
        return result

    def throughputs(self, gpus: FloatArray, batches: FloatArray, nodes: FloatArray) -> FloatArray:
        """Samples per second, element-wise over broadcastable arrays."""
        result: FloatArray = np.asarray(batches, dtype=np.float64) / self.step_times(
            gpus, batches, nodes
        )
        return result

    def throughput(self, g: int, b: float, nodes: int = 1) -> float:
        one = np.ones(1)
        return float(self.throughputs(one * g, one * b, one * nodes)[0])

    def _along_batch(self, times: dict[int, float]) -> FloatArray:
        xs = sorted(times)
        ys = [times[x] for x in xs]
        if len(xs) == 1:
            return np.full(len(self.local_batches), ys[0])
        row = np.interp(self.local_batches, xs, ys)
        below, above = self.local_batches < xs[0], self.local_batches > xs[-1]
        first_slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        last_slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        row[below] = ys[0] + first_slope * (self.local_batches[below] - xs[0])
        row[above] = ys[-1] + last_slope * (self.local_batches[above] - xs[-1])
        result: FloatArray = np.maximum(row, MIN_STEP_S)
        return result

    def _fill(self, rows: dict[tuple[int, int], FloatArray]) -> FloatArray:
        measured: dict[int, list[int]] = defaultdict(list)
        for n, g in sorted(rows):
            measured[n].append(g)
        node_counts = sorted(measured)

        def at_measured(n: int, g: float) -> FloatArray:
            counts = measured[n]
            k = bisect.bisect_left(counts, g)
            if k == 0:
                return rows[(n, counts[0])]
            if k == len(counts):
                return rows[(n, counts[-1])]
            g0, g1 = counts[k - 1], counts[k]
            w = (g - g0) / (g1 - g0)
            blended: FloatArray = (1 - w) * rows[(n, g0)] + w * rows[(n, g1)]
            return blended

        grid = np.empty((self.max_gpus, self.max_nodes, len(self.local_batches)))
        for g in range(1, self.max_gpus + 1):
            for n in range(1, self.max_nodes + 1):
                spread = min(n, g)
                per_node = g / spread
                k = bisect.bisect_left(node_counts, spread)
                if k < len(node_counts) and node_counts[k] == spread:
                    grid[g - 1, n - 1] = at_measured(spread, g)
                elif k == len(node_counts):
                    top = node_counts[-1]
                    grid[g - 1, n - 1] = at_measured(top, per_node * top)
                else:
                    n0, n1 = node_counts[k - 1], node_counts[k]
                    w = (spread - n0) / (n1 - n0)
                    grid[g - 1, n - 1] = (1 - w) * at_measured(n0, per_node * n0) + (
                        w * at_measured(n1, per_node * n1)
                    )
        return grid


def default_profiles_path() -> Path:
    """``data/pollux-profiles.csv`` of the source checkout this module lives in."""
    return Path(__file__).resolve().parents[4] / "data" / "pollux-profiles.csv"


def read_profiles(path: Path) -> dict[str, list[ProfilePoint]]:
    """The points of ``path`` by family (columns family, nodes, gpus, local_batch,
    step_time_s); a malformed row is refused with its line number."""
    points: dict[str, list[ProfilePoint]] = defaultdict(list)
    with path.open(newline="") as stream:
        for line, row in enumerate(csv.DictReader(stream), start=2):
            try:
                point = ProfilePoint(
                    int(row["nodes"]),
                    int(row["gpus"]),
                    int(row["local_batch"]),
                    float(row["step_time_s"]),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{line}: {exc}") from None
            points[row["family"]].append(point)
    return dict(points)


def measured_speeds(path: Path | None = None) -> dict[str, MeasuredSpeed]:
    """Every family's ``MeasuredSpeed`` from ``path`` (default: the shipped profiles), read
    once per file."""
    return _speeds_in(path or default_profiles_path())


@functools.cache
def _speeds_in(path: Path) -> dict[str, MeasuredSpeed]:
    return {name: MeasuredSpeed(points) for name, points in read_profiles(path).items()}
