"""Model families of the policy comparison: speed, memory limits and statistical efficiency.

Six families stand for the six training jobs of Pollux's evaluation (Qiao et al., OSDI'21):
their batch sizes, per-GPU batch limits and training lengths are the ones its published
simulator uses (``simulator/applications.py`` and the profiles under ``simulator/traces/`` of
petuum/adaptdl, branch ``osdi21-artifact``); their step times are ours, of the form of
``ffdl.elastic.throughput`` (``alpha + beta * b / g + gamma * log2 g + delta * (nodes - 1)``),
chosen so that each trains on one GPU at its initial batch in about the time its Philly GPU-time
category implies. ``families("measured")`` gives the same six with their step times read from
the measured profiles instead (``ffdl.sim.compare.measured``), their work scaled so that one
GPU at the initial batch still takes the same time.

==============  ====  =====  ===========  ======  ============  ==========================
family          b0    max B  local batch  epochs  work          noise scale / b0 (start→end)
==============  ====  =====  ===========  ======  ============  ==========================
cifar10         128   4096   32..1024     100     5.0 M         0.57 → 302
ncf             256   32768  32..32768    10      49.7 M        1 → 100
deepspeech2     20    640    10..80       80      0.571 M       1 → 50
bert            12    384    4..12        2       0.177 M       1 → 30
yolov3          8     512    4..8         50      0.828 M       0.08 → 637
imagenet        200   12800  20..200      90      115.3 M       4.6 → 72
==============  ====  =====  ===========  ======  ============  ==========================

*Local batch* is the per-GPU batch ``B / g``: at most what fits in a GPU's memory, at least
what keeps the GPU busy. A job at global batch ``B`` can therefore only run on
``ceil(B / max) .. floor(B / min)`` GPUs; a policy that adapts ``B`` reaches further.

*Statistical efficiency* is the gradient-noise-scale model of ``ffdl.elastic.efficiency``,
``E(B) = (N + b0) / (N + B)``, with the noise scale ``N`` growing geometrically with the
job's progress from its start value to its end value, as the measured profiles do (cifar10,
yolov3 and imagenet's start and end ratios are those profiles' first and last epochs; the
other three are not published as such and are set in the same range). A large batch early in
training therefore buys little progress per sample, and late in training nearly as much as a
small one. Work is counted in samples at ``b0`` (``E(b0) = 1``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ffdl.elastic.throughput import FloatArray, ThroughputModel
from ffdl.sim.compare.measured import default_profiles_path, measured_speeds

IntArray = npt.NDArray[np.int64]
SPEEDS = ("model", "measured")


class SpeedModel(Protocol):
    """A family's throughput in samples per second (``ThroughputModel``, ``MeasuredSpeed``)."""

    def throughput(self, g: int, b: float, nodes: int = 1) -> float: ...

    def throughputs(
        self, gpus: FloatArray, batches: FloatArray, nodes: FloatArray
    ) -> FloatArray: ...


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    speed: SpeedModel
    base_batch: int  # b0: the batch the job was written for; work is counted at it
    max_batch: int
    local_batch: tuple[int, int]  # per-GPU batch limits (min, max)
    work: float  # samples of a whole training at b0
    noise_start: float  # gradient noise scale over b0, at the start of training
    noise_end: float  # ... and at its end

    def __post_init__(self) -> None:
        low, high = self.local_batch
        if not 1 <= low <= high:
            raise ValueError(f"{self.name}: local batch limits must satisfy 1 <= min <= max")
        if not self.base_batch <= self.max_batch:
            raise ValueError(f"{self.name}: the base batch must not exceed the maximum")
        if not (self.noise_start > 0 and self.noise_end > 0 and self.work > 0):
            raise ValueError(f"{self.name}: noise scales and work must be > 0")

    @property
    def batch_range(self) -> tuple[int, int]:
        """The global batches a batch-adaptive policy may choose."""
        return self.base_batch, self.max_batch

    def gpus_for_batch(self, batch: int) -> tuple[int, int]:
        """The GPU counts that can run global batch ``batch`` (min > max: none)."""
        low, high = self.local_batch
        return -(-batch // high), batch // low

    def adaptive_gpus(self) -> tuple[int, int]:
        """The GPU counts some batch in ``batch_range`` can run on."""
        return self.gpus_for_batch(self.base_batch)[0], self.gpus_for_batch(self.max_batch)[1]

    def batch_problem(self, gpus: int, batch: int) -> str | None:
        """Why ``batch`` cannot run on ``gpus`` GPUs, or None when it can."""
        low, high = self.local_batch
        if not self.base_batch <= batch <= self.max_batch:
            return f"{self.name}: batch {batch} outside {self.base_batch}..{self.max_batch}"
        if not low * gpus <= batch <= high * gpus:
            return (
                f"{self.name}: batch {batch} on {gpus} GPUs is {batch / gpus:g} per GPU, "
                f"outside {low}..{high}"
            )
        return None

    def noise_scale_at(self, progress: float) -> float:
        """The gradient noise scale (in samples) at ``progress`` (0..1) of the training."""
        p = min(max(progress, 0.0), 1.0)
        ratio: float = self.noise_start * (self.noise_end / self.noise_start) ** p
        return ratio * self.base_batch

    def efficiency(self, batch: int, progress: float) -> float:
        noise = self.noise_scale_at(progress)
        return (noise + self.base_batch) / (noise + batch)

    def goodput(self, gpus: int, nodes: int, batch: int, progress: float) -> float:
        """Useful samples (at ``b0``) per second."""
        nodes = min(max(nodes, 1), gpus)
        return self.speed.throughput(gpus, batch, nodes) * self.efficiency(batch, progress)

    def goodputs(
        self, gpus: FloatArray, nodes: FloatArray, batches: FloatArray, progress: float
    ) -> FloatArray:
        """``goodput`` element-wise over broadcastable arrays (inputs are not checked)."""
        noise = self.noise_scale_at(progress)
        efficiency = (noise + self.base_batch) / (noise + batches)
        result: FloatArray = self.speed.throughputs(gpus, batches, nodes) * efficiency
        return result

    def best_batch(self, gpus: int, nodes: int, progress: float, choices: int = 24) -> int:
        """The batch of highest goodput on ``gpus`` GPUs (0 when no batch can run there)."""
        low, high = self.local_batch
        first, last = max(self.base_batch, low * gpus), min(self.max_batch, high * gpus)
        if first > last:
            return 0
        candidates = {first, last}
        for k in range(1, choices - 1):
            candidates.add(round(first * (last / first) ** (k / (choices - 1))))
        return max(sorted(candidates), key=lambda b: self.goodput(gpus, nodes, b, progress))

    def best_goodputs(
        self, max_gpus: int, gpus_per_node: int, progress: float, choices: int = 24
    ) -> tuple[FloatArray, IntArray]:
        """For 0..``max_gpus`` GPUs (packed): the best goodput over a geometric grid of
        ``choices`` batches that fit, and that batch; 0 and 0 where no batch fits."""
        low, high = self.local_batch
        g = np.arange(1, max_gpus + 1, dtype=np.float64)[:, None]
        first = np.maximum(float(self.base_batch), low * g)
        last = np.minimum(float(self.max_batch), high * g)
        fits = first <= last
        steps = np.linspace(0.0, 1.0, choices)[None, :]
        batches = np.round(first * (np.maximum(last, first) / first) ** steps)
        nodes = np.ceil(g / gpus_per_node)
        noise = self.noise_scale_at(progress)
        rates = self.speed.throughputs(g, batches, nodes) * (noise + self.base_batch)
        rates = np.where(fits, rates / (noise + batches), 0.0)
        best = np.argmax(rates, axis=1)
        rows = np.arange(max_gpus)
        goodput = np.concatenate([[0.0], rates[rows, best]])
        batch = np.concatenate([[0], np.where(fits[:, 0], batches[rows, best], 0)]).astype(np.int64)
        return goodput, batch

    def best_goodput_on(
        self, gpus: int, nodes: int, progress: float, choices: int = 24
    ) -> tuple[float, int]:
        """``best_goodputs`` for ``gpus`` GPUs spread over ``nodes`` machines."""
        low, high = self.local_batch
        first = max(float(self.base_batch), low * gpus)
        last = min(float(self.max_batch), high * gpus)
        if first > last:
            return 0.0, 0
        batches = np.round(first * (last / first) ** np.linspace(0.0, 1.0, choices))
        g = np.full_like(batches, float(gpus))
        noise = self.noise_scale_at(progress)
        rates = self.speed.throughputs(g, batches, np.full_like(batches, float(nodes)))
        rates = rates * (noise + self.base_batch) / (noise + batches)
        best = int(np.argmax(rates))
        return float(rates[best]), int(batches[best])

    def training_time_s(self, gpus: int, batch: int, gpus_per_node: int, steps: int = 10) -> float:
        """Seconds to train the whole family's work on ``gpus`` GPUs at ``batch``, packed."""
        nodes = max(1, math.ceil(gpus / gpus_per_node))
        share = self.work / steps
        return sum(
            share / self.goodput(gpus, nodes, batch, (k + 0.5) / steps) for k in range(steps)
        )


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "cifar10",
            ThroughputModel(0.005, 0.0003, 0.010, 0.030),
            128,
            4096,
            (32, 1024),
            5.0e6,
            0.57,
            302.0,
        ),
        Family(
            "ncf",
            ThroughputModel(0.005, 0.00002, 0.010, 0.020),
            256,
            32768,
            (32, 32768),
            4.97e7,
            1.0,
            100.0,
        ),
        Family(
            "deepspeech2",
            ThroughputModel(0.05, 0.02, 0.060, 0.120),
            20,
            640,
            (10, 80),
            5.71e5,
            1.0,
            50.0,
        ),
        Family(
            "bert",
            ThroughputModel(0.05, 0.05, 0.100, 0.200),
            12,
            384,
            (4, 12),
            1.77e5,
            1.0,
            30.0,
        ),
        Family(
            "yolov3",
            ThroughputModel(0.02, 0.1, 0.050, 0.100),
            8,
            512,
            (4, 8),
            8.28e5,
            0.08,
            637.0,
        ),
        Family(
            "imagenet",
            ThroughputModel(0.02, 0.0015, 0.020, 0.020),
            200,
            12800,
            (20, 200),
            1.153e8,
            4.6,
            72.0,
        ),
    )
}


def families(speed: str = "model", profiles: Path | None = None) -> dict[str, Family]:
    """The six families with their step times from the model above (``"model"``) or from
    measured profiles (``"measured"``, ``ffdl.sim.compare.measured``)."""
    if speed == "model":
        return FAMILIES
    if speed == "measured":
        return _measured_families(profiles or default_profiles_path())
    raise ValueError(f"unknown speed {speed!r}; choose from {', '.join(SPEEDS)}")


@functools.cache
def _measured_families(profiles: Path) -> dict[str, Family]:
    """Each family with its measured step times; its work scaled so that one GPU at ``b0``
    trains it in the same time as with the model, which keeps every job in its Philly
    GPU-time category."""
    speeds = measured_speeds(profiles)
    missing = [name for name in FAMILIES if name not in speeds]
    if missing:
        raise ValueError(f"no measured profile for {', '.join(missing)}")
    result = {}
    for name, family in FAMILIES.items():
        speed = speeds[name]
        b0 = family.base_batch
        scale = speed.throughput(1, b0) / family.speed.throughput(1, b0)
        result[name] = dataclasses.replace(family, speed=speed, work=family.work * scale)
    return result
