"""The six applications of Pollux's evaluation as its simulator knows them: measured step and
synchronisation times per placement and per-GPU batch, and per batch size the validation
curves (progress and iterations per epoch, gradient statistics) that give statistical
efficiency and when a job is done.

The data are the simulator's own traces, unchanged, in ``data/pollux-simulator/traces``
(see ``data/README.md``). Between measured points every quantity is interpolated linearly,
as that simulator does: along the per-GPU batch for a placement that was measured, else
over (nodes, GPUs, per-GPU batch) through a Delaunay triangulation of every measured point.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# What the simulator sets per application: epochs a job runs, and yolov3's memory cap.
MAX_EPOCHS = {
    "bert": 2,
    "cifar10": 100,
    "ncf": 10,
    "imagenet": 90,
    "deepspeech2": 80,
    "yolov3": 50,
}
MAX_LOCAL_BATCH = {"yolov3": 8}
# Its interpolation over placements caps the node count at the largest one profiled.
MAX_INTERPOLATED_NODES = 16


def default_data_dir() -> Path:
    """``data/pollux-simulator`` of the source checkout this module lives in."""
    return Path(__file__).resolve().parents[4] / "data" / "pollux-simulator"


@dataclass(frozen=True)
class Curve:
    """One validation run at a fixed batch size, one entry per epoch."""

    progress: FloatArray
    iteration: FloatArray
    grad_sqr: FloatArray
    grad_var: FloatArray


def _read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


def _column(rows: list[dict[str, str]], name: str) -> FloatArray:
    return np.array([float(row[name]) for row in rows])


class Application:
    """One application's traces and the simulator's rules for reading them."""

    def __init__(self, trace_dir: Path) -> None:
        self.name = trace_dir.name
        curves = {}
        for path in trace_dir.glob("validation-*.csv"):
            rows = _read_rows(path)
            batch = int(path.stem.split("-")[-1])
            curves[batch] = Curve(*(_column(rows, c) for c in Curve.__dataclass_fields__))
        if not curves:
            raise FileNotFoundError(f"no validation-*.csv in {trace_dir}")
        self.curves = dict(sorted(curves.items()))
        placements = _read_rows(trace_dir / "placements.csv")
        self._placement_ids = np.array([int(row["placement"]) for row in placements])
        self._placement_bsz = _column(placements, "local_bsz")
        self._placement_times = np.column_stack(
            [_column(placements, "step_time"), _column(placements, "sync_time")]
        )
        self._placement_shape = np.array(
            [[len(row["placement"]), sum(int(c) for c in row["placement"])] for row in placements],
            dtype=np.float64,
        )
        self._scalability = _read_rows(trace_dir / "scalability.csv")
        self.init_batch_size = min(self.curves)
        self.max_batch_size = max(self.curves)
        self.min_local_bsz = int(self._placement_bsz.min())
        self.max_local_bsz = MAX_LOCAL_BATCH.get(self.name, int(self._placement_bsz.max()))
        self.max_epochs = MAX_EPOCHS.get(
            self.name, min(len(c.progress) for c in self.curves.values())
        )

    # -- progress and efficiency ------------------------------------------------------------

    def _bounds(self, batch_size: float) -> tuple[int, int]:
        lower = upper = None
        for size in self.curves:
            if size <= batch_size:
                lower = size
            if size >= batch_size:
                upper = size
                break
        if lower is None or upper is None:
            raise ValueError(f"{self.name}: batch {batch_size} outside {list(self.curves)}")
        return lower, upper

    def _between(self, batch_size: float, lower: float, upper: float, lo: int, hi: int) -> float:
        if lo == hi:
            return lower
        return ((batch_size - lo) * upper + (hi - batch_size) * lower) / (hi - lo)

    def completion_epoch(self, batch_size: float) -> int:
        """The last epoch a job runs: none of the applications has a target metric."""
        del batch_size
        return self.max_epochs - 1

    @functools.cache  # noqa: B019 - applications live as long as the process
    def progress_at(self, epoch: int) -> float:
        """Statistical progress (samples at the initial batch) to reach ``epoch``."""
        if epoch == 0:
            return 0.0
        return float(min(c.progress[epoch - 1] for c in self.curves.values()))

    @functools.cache  # noqa: B019
    def iteration(self, batch_size: float, epoch: int) -> float:
        """Iterations done after ``epoch`` at ``batch_size``."""
        lo, hi = self._bounds(batch_size)
        return self._between(
            batch_size, self.curves[lo].iteration[epoch], self.curves[hi].iteration[epoch], lo, hi
        )

    @functools.cache  # noqa: B019
    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """The gradient's squared norm and variance during ``epoch`` at ``batch_size``."""
        lo, hi = self._bounds(batch_size)
        low, high = self.curves[lo], self.curves[hi]
        sqr = self._between(batch_size, low.grad_sqr[epoch], high.grad_sqr[epoch], lo, hi)
        var = self._between(batch_size, low.grad_var[epoch], high.grad_var[epoch], lo, hi)
        return float(sqr), float(var)

    # -- speed ------------------------------------------------------------------------------

    @functools.cache  # noqa: B019
    def throughput(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """Step and synchronisation seconds of ``placement`` (GPUs per node) at a per-GPU
        batch of ``local_bsz``."""
        from scipy.interpolate import interp1d

        placement = tuple(p for p in placement if p)
        placement = min(placement[i:] + placement[:i] for i in range(len(placement)))
        placement_id = int("".join(map(str, placement)))
        rows = self._placement_ids == placement_id
        if rows.any():
            along = interp1d(self._placement_bsz[rows], self._placement_times[rows], axis=0)
            step, sync = along(local_bsz)
        else:
            nodes = min(len(placement), MAX_INTERPOLATED_NODES)
            step, sync = self._across()([nodes, sum(placement), local_bsz])[0]
        if not (np.isfinite(step) and np.isfinite(sync)):
            raise ValueError(f"{self.name}: no throughput for {placement} at {local_bsz}")
        return float(step), float(sync)

    @functools.cache  # noqa: B019
    def _across(self) -> Any:
        """Linear interpolation over every measured (nodes, GPUs, per-GPU batch) point,
        repeated placements averaged, followed by the scalability measurements."""
        from scipy.interpolate import LinearNDInterpolator

        keys = np.column_stack([self._placement_shape, self._placement_bsz])
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        sums = np.zeros((len(unique), 2))
        np.add.at(sums, inverse, self._placement_times)
        means = sums / np.bincount(inverse)[:, None]
        extra = self._scalability
        extra_keys = np.array(
            [
                [float(r["num_nodes"]), float(r["num_replicas"]), float(r["local_bsz"])]
                for r in extra
            ]
        )
        extra_values = np.array([[float(r["step_time"]), float(r["sync_time"])] for r in extra])
        points = np.vstack([unique, extra_keys])
        return LinearNDInterpolator(points, np.vstack([means, extra_values]))


@functools.cache
def applications(data_dir: Path | None = None) -> dict[str, Application]:
    """Every application under ``data_dir/traces`` (default: the shipped copy)."""
    root = (data_dir or default_data_dir()) / "traces"
    if not root.is_dir():
        raise FileNotFoundError(f"no Pollux simulator traces at {root}")
    return {path.name: Application(path) for path in sorted(root.iterdir()) if path.is_dir()}
