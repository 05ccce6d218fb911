"""The throughput model ``T(g, b)`` of an elastic job and its online fit from step times.

One training step of a data-parallel job with ``g`` GPUs and global batch ``b``, its learners
spread over ``nodes`` machines, takes::

    step_time = alpha + beta * (b / g)                                   (compute)
              + (0 if g == 1 else gamma * log2(g) + delta * (nodes - 1))  (gradient sync)

A job that accumulates gradients over ``s`` micro-batches per step
(``ffdl.elastic.accumulation``) pays the fixed overhead once per micro-batch and the
exchange once: ``s * alpha + beta * (b / g) + sync``.

``alpha`` is the fixed per-step overhead (kernel launches, optimizer step, data loader
hand-off), ``beta`` the compute time per sample of the local batch ``b / g``, ``gamma`` the
cost of one ring all-reduce round (the number of rounds grows with ``log2(g)``) and ``delta``
the extra cost of every additional machine the all-reduce has to cross. Throughput is
``T(g, b) = b / step_time`` samples per second.

Before a job reports anything the optimizer uses ``prior()``; as learners report step times
``fit`` refines the four parameters by non-negative least squares on the relative error,
pulled toward the prior with a weight that fades as observations accumulate. All functions
here are pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Scale of each parameter used to make the fit unit-free: the prior's own value, but never
# below these floors (seconds, seconds per sample, seconds, seconds), so that a prior of zero
# can still be moved by data.
_SCALE_FLOORS = (1e-3, 1e-5, 1e-3, 1e-3)
# Keeps a fitted model from predicting zero-length steps on one GPU.
_MIN_STEP_OVERHEAD_S = 1e-9


@dataclass(frozen=True, slots=True)
class ThroughputModel:
    """Step-time parameters of one job; see the module docstring for the formula."""

    alpha: float  # seconds of fixed overhead per step
    beta: float  # seconds of compute per sample of the local batch
    gamma: float  # seconds per all-reduce round (rounds grow with log2 of the GPU count)
    delta: float  # seconds per extra node crossed by the all-reduce

    def __post_init__(self) -> None:
        params = (self.alpha, self.beta, self.gamma, self.delta)
        if not all(math.isfinite(p) and p >= 0.0 for p in params):
            raise ValueError(f"throughput parameters must be finite and >= 0, got {params}")
        if self.alpha + self.beta <= 0.0:
            raise ValueError("alpha + beta must be > 0: a step cannot take no time")

    @classmethod
    def prior(cls) -> ThroughputModel:
        """Defaults for a job that has reported nothing yet: a ResNet-50-like CNN.

        About 2 ms of compute per sample (ResNet-50 forward and backward on one GPU), 5 ms of
        fixed overhead per step, 20 ms per all-reduce round of ~100 MB of gradients, and 30 ms
        for every extra node the all-reduce crosses (network instead of NVLink).
        """
        return cls(alpha=0.005, beta=0.002, gamma=0.020, delta=0.030)

    def step_time(self, g: int, b: float, nodes: int = 1, steps: int = 1) -> float:
        """Seconds per training step with ``g`` GPUs, global batch ``b``, over ``nodes``,
        each GPU accumulating over ``steps`` micro-batches."""
        _check_shape(g, b, nodes)
        if steps < 1:
            raise ValueError(f"accumulation steps must be >= 1, got {steps}")
        compute = self.alpha * steps + self.beta * (b / g)
        sync = 0.0 if g == 1 else self.gamma * math.log2(g) + self.delta * (nodes - 1)
        return compute + sync

    def throughput(self, g: int, b: float, nodes: int = 1, steps: int = 1) -> float:
        """Samples per second with ``g`` GPUs, global batch ``b``, over ``nodes`` machines."""
        return b / self.step_time(g, b, nodes, steps)

    def step_times(
        self,
        gpus: FloatArray,
        batches: FloatArray,
        nodes: FloatArray,
        steps: FloatArray | float = 1.0,
    ) -> FloatArray:
        """``step_time`` element-wise over broadcastable arrays (inputs are not checked)."""
        return step_times(
            self.alpha, self.beta, self.gamma, self.delta, gpus, batches, nodes, steps
        )

    def throughputs(
        self,
        gpus: FloatArray,
        batches: FloatArray,
        nodes: FloatArray,
        steps: FloatArray | float = 1.0,
    ) -> FloatArray:
        """``throughput`` element-wise over broadcastable arrays (inputs are not checked)."""
        result: FloatArray = batches / self.step_times(gpus, batches, nodes, steps)
        return result


def step_times(
    alpha: FloatArray | float,
    beta: FloatArray | float,
    gamma: FloatArray | float,
    delta: FloatArray | float,
    gpus: FloatArray,
    batches: FloatArray,
    nodes: FloatArray,
    steps: FloatArray | float = 1.0,
) -> FloatArray:
    """The step-time formula over broadcastable arrays of parameters and shapes.

    Lets the optimizer evaluate many jobs' models at once; inputs are not checked.
    """
    sync = np.where(
        gpus > 1,
        gamma * np.log2(np.maximum(gpus, 1.0)) + delta * (nodes - 1.0),
        0.0,
    )
    result: FloatArray = alpha * steps + beta * (batches / gpus) + sync
    return result


def prior() -> ThroughputModel:
    """The model used before a job reports any step time (see ``ThroughputModel.prior``)."""
    return ThroughputModel.prior()


def on_faster_gpus(model: ThroughputModel, factor: float) -> ThroughputModel:
    """``model`` on GPUs ``factor`` times as fast: its compute (``alpha``, ``beta``) takes
    ``1 / factor`` as long; the gradient exchange, a matter of the network, does not change."""
    if not 0 < factor < math.inf:
        raise ValueError(f"a speed factor must be a finite number > 0, got {factor}")
    return ThroughputModel(
        alpha=model.alpha / factor, beta=model.beta / factor, gamma=model.gamma, delta=model.delta
    )


@dataclass(frozen=True, slots=True)
class StepObservation:
    """One measured step: ``step_time_s`` seconds with this many GPUs, batch and nodes, each
    GPU accumulating over ``steps`` micro-batches."""

    gpus: int
    batch_size: int
    nodes: int
    step_time_s: float
    steps: int = 1

    def __post_init__(self) -> None:
        _check_shape(self.gpus, self.batch_size, self.nodes)
        if self.steps < 1:
            raise ValueError(f"accumulation steps must be >= 1, got {self.steps}")
        if not (math.isfinite(self.step_time_s) and self.step_time_s > 0.0):
            raise ValueError(f"step_time_s must be finite and > 0, got {self.step_time_s}")


def fit(
    observations: Sequence[StepObservation],
    prior: ThroughputModel,
    *,
    prior_strength: float = 0.1,
) -> ThroughputModel:
    """Fit the four parameters to measured step times, regularised toward ``prior``.

    Minimises, over non-negative parameters ``theta``::

        sum_i ((x_i . theta - y_i) / y_i)^2
          + (prior_strength / n) * sum_k ((theta_k - p_k) / s_k)^2

    where ``x_i`` are the features of observation ``i`` (s, b/g, log2 g, nodes - 1),
    ``y_i`` its step time, ``p`` the prior and ``s_k`` the prior's scale of parameter ``k``.
    Errors are relative so fast and slow configurations count alike. The ridge keeps the
    directions the data cannot see (e.g. the sync terms when every step ran on one GPU) at
    the prior, and its weight shrinks as ``1/n`` so that many observations speak for
    themselves.
    """
    if prior_strength < 0.0:
        raise ValueError("prior_strength must be >= 0")
    if not observations:
        return prior
    prior_params = np.array([prior.alpha, prior.beta, prior.gamma, prior.delta])
    scales = np.maximum(prior_params, np.array(_SCALE_FLOORS))

    features = np.array([_features(obs) for obs in observations])
    targets = np.array([obs.step_time_s for obs in observations])
    # Unknowns are theta / scales, so every column and the ridge are of order one.
    data_rows = features * scales / targets[:, None]
    data_target = np.ones(len(observations))

    ridge = math.sqrt(prior_strength / len(observations))
    design = np.vstack([data_rows, ridge * np.eye(4)])
    target = np.concatenate([data_target, ridge * prior_params / scales])

    alpha, beta, gamma, delta = (nnls(design, target) * scales).tolist()
    if alpha + beta <= 0.0:
        alpha = _MIN_STEP_OVERHEAD_S
    return ThroughputModel(alpha=alpha, beta=beta, gamma=gamma, delta=delta)


def nnls(
    design: FloatArray, target: FloatArray, *, max_iterations: int | None = None
) -> FloatArray:
    """Non-negative least squares (Lawson-Hanson active set): argmin |Ax - b| with x >= 0."""
    rows, cols = design.shape
    if target.shape != (rows,):
        raise ValueError("target must have one entry per row of the design matrix")
    x = np.zeros(cols)
    free = np.zeros(cols, dtype=bool)
    tolerance = (
        10.0 * np.finfo(float).eps * float(np.abs(design).sum(axis=0).max()) * max(rows, cols)
    )
    gradient = design.T @ (target - design @ x)
    for _ in range(max_iterations if max_iterations is not None else 3 * cols + 10):
        bound = ~free
        if not bound.any() or gradient[bound].max() <= tolerance:
            break
        entering = int(np.argmax(np.where(bound, gradient, -np.inf)))
        free[entering] = True
        while True:
            trial = np.zeros(cols)
            trial[free] = np.linalg.lstsq(design[:, free], target, rcond=None)[0]
            if (trial[free] > 0.0).all():
                break
            # Step from x toward the trial point until the first free variable hits zero,
            # then bind every variable that did.
            blocking = free & (trial <= 0.0)
            gap = x[blocking] - trial[blocking]
            step = float(np.min(np.divide(x[blocking], gap, out=np.zeros_like(gap), where=gap > 0)))
            x = x + step * (trial - x)
            free &= x > tolerance
            x[~free] = 0.0
            if not free.any():
                trial = np.zeros(cols)
                break
        x = trial
        gradient = design.T @ (target - design @ x)
    return x


def _features(obs: StepObservation) -> tuple[float, float, float, float]:
    if obs.gpus == 1:
        return (float(obs.steps), float(obs.batch_size), 0.0, 0.0)
    return (
        float(obs.steps),
        obs.batch_size / obs.gpus,
        math.log2(obs.gpus),
        float(obs.nodes - 1),
    )


def _check_shape(g: int, b: float, nodes: int) -> None:
    if g < 1:
        raise ValueError(f"gpus must be >= 1, got {g}")
    if not b > 0:
        raise ValueError(f"batch size must be > 0, got {b}")
    if nodes < 1 or nodes > g:
        raise ValueError(f"nodes must be between 1 and the GPU count {g}, got {nodes}")
