"""The model Pollux's agents fit and its scheduler plans with: step time from seven
parameters, statistical efficiency from the gradient's noise, and the goodput of a
placement at its best batch (with gradient accumulation past the per-GPU cap).

- Compute time of one micro-batch is ``alpha_c + beta_c * micro_batch``.
- Network time is ``alpha + beta * max(replicas - 2, 0)``, with one pair of parameters
  when the job spans nodes and another when it stays on one node.
- A step overlaps the two as a ``gamma``-norm; each accumulation step before it adds one
  micro-batch of compute and no exchange.
- Efficiency at batch ``B`` with initial batch ``B0`` is
  ``(var + sqr) / (var / (B / B0) + sqr) / (B / B0)``.

The fit minimises the RMS of log errors with the same priors and bounds as Pollux's
``fit_perf_params`` (L-BFGS-B; its gradient by finite differences rather than autograd).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
EPS = 1e-8
# Total batch sizes tried between the smallest and largest, spaced geometrically.
BATCH_CANDIDATES = 50


@dataclass(frozen=True)
class PerfParams:
    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float


def accum_time(params: PerfParams, micro_batch: npt.ArrayLike) -> FloatArray:
    return params.alpha_c + params.beta_c * np.asarray(micro_batch, dtype=np.float64)


def network_time(params: PerfParams, nodes: npt.ArrayLike, replicas: npt.ArrayLike) -> FloatArray:
    nodes, replicas = np.asarray(nodes), np.asarray(replicas)
    conditions = [nodes > 1, replicas > 1]
    bottleneck = np.select(conditions, [params.alpha_n, params.alpha_r], EPS)
    retrogress = np.select(conditions, [params.beta_n, params.beta_r], EPS)
    return np.asarray(bottleneck + retrogress * np.maximum(replicas - 2, EPS), dtype=np.float64)


def log_optim_time(params: PerfParams, accum: FloatArray, network: FloatArray) -> FloatArray:
    gamma = params.gamma
    return np.asarray(np.log(accum**gamma + network**gamma) / gamma, dtype=np.float64)


class GoodputFunction:
    """Goodput (useful samples per second) of a configuration, for one job's fitted speed
    and current gradient statistics."""

    def __init__(
        self, params: PerfParams, grad_sqr: float, grad_var: float, init_batch: int
    ) -> None:
        self.params = params
        self.grad_sqr, self.grad_var = grad_sqr, grad_var
        self.init_batch = init_batch

    def throughput(
        self, nodes: IntArray, replicas: IntArray, micro: IntArray, accum_steps: IntArray
    ) -> FloatArray:
        accum = accum_time(self.params, micro)
        optim = np.exp(
            log_optim_time(self.params, accum, network_time(self.params, nodes, replicas))
        )
        total = accum_steps * accum + optim
        return np.asarray(replicas * micro * (accum_steps + 1) / total, dtype=np.float64)

    def efficiency(self, batch: FloatArray) -> FloatArray:
        scale = batch / self.init_batch
        denominator = self.grad_var / scale + self.grad_sqr
        gain = np.where(
            denominator > 0,
            (self.grad_var + self.grad_sqr) / np.where(denominator > 0, denominator, 1),
            1.0,
        )
        return np.asarray(gain / scale, dtype=np.float64)

    def evaluate(
        self, nodes: IntArray, replicas: IntArray, micro: IntArray, accum_steps: IntArray
    ) -> FloatArray:
        batch = np.asarray(replicas * micro * (accum_steps + 1), dtype=np.float64)
        speed = self.throughput(nodes, replicas, micro, accum_steps)
        return np.asarray(speed * self.efficiency(batch), dtype=np.float64)

    def optimize(
        self,
        nodes: npt.ArrayLike,
        replicas: npt.ArrayLike,
        max_batch: int,
        micro_range: tuple[int, int],
        accumulation: bool = True,
    ) -> tuple[FloatArray, IntArray, IntArray]:
        """The best goodput of each (nodes, replicas), with its micro-batch and accumulation
        steps; configurations with no valid micro-batch have goodput 0."""
        shape = np.broadcast(nodes, replicas).shape
        nodes_flat = np.broadcast_to(nodes, shape).reshape(-1)
        replicas_flat = np.broadcast_to(replicas, shape).reshape(-1)
        min_micro, max_micro = micro_range
        smallest = np.maximum(self.init_batch, min_micro * replicas_flat)
        batch = np.geomspace(smallest, max_batch, BATCH_CANDIDATES)
        local = batch / replicas_flat
        if accumulation:
            steps = np.ceil(local / max_micro - EPS) - 1
            # One GPU past the initial batch accumulates at least once: its gradient
            # statistics need two micro-batches to be estimated.
            alone = (replicas_flat == 1) & (local > self.init_batch + EPS)
            accum_steps = np.where(alone, np.maximum(steps, 1), steps).astype(np.int64)
        else:
            accum_steps = np.zeros_like(local, dtype=np.int64)
        micro = np.ceil(local / (accum_steps + 1) - EPS).astype(np.int64)
        goodput = self.evaluate(nodes_flat, replicas_flat, micro, accum_steps)
        goodput = np.where((min_micro <= micro) & (micro <= max_micro), goodput, 0.0)
        best = np.argmax(goodput, axis=0), np.arange(goodput.shape[1])
        return (
            goodput[best].reshape(shape),
            micro[best].reshape(shape),
            accum_steps[best].reshape(shape),
        )


def fit_perf_params(
    nodes: FloatArray,
    replicas: FloatArray,
    micro: FloatArray,
    accum_step_time: FloatArray,
    optim_step_time: FloatArray,
) -> PerfParams:
    """Pollux's fit of the seven parameters to observed step times."""
    from scipy.optimize import Bounds, minimize

    params = [1e-1, 1e-2] * 3 + [1.0 + 1e-3]
    lower = [1e-8, 1e-8] * 3 + [1.0]
    upper = [np.inf, np.inf] * 3 + [10.0]
    if len(np.unique(micro)) == 1:
        # One micro-batch size seen: split its time evenly between the two terms.
        params[0] = upper[0] = lower[0] = float(np.mean(accum_step_time)) / 2
    if not np.any(nodes > 1):
        for i in (2, 3):
            params[i] = upper[i] = lower[i]
    if not np.any((nodes == 1) & (replicas > 1)):
        for i in (4, 5):
            params[i] = upper[i] = lower[i]
    if not np.any(replicas > 2):
        for i in (3, 5):
            params[i] = upper[i] = lower[i]
    fixed = [lo == hi for lo, hi in zip(lower, upper, strict=True)]
    free = [i for i, f in enumerate(fixed) if not f]

    def objective(values: FloatArray) -> tuple[float, FloatArray]:
        full = np.array(params, dtype=np.float64)
        full[free] = values
        value, gradient = fit_objective(
            full, nodes, replicas, micro, accum_step_time, optim_step_time
        )
        return value, gradient[free]

    result = minimize(
        objective,
        np.array([params[i] for i in free]),
        jac=True,
        method="L-BFGS-B",
        bounds=Bounds([lower[i] for i in free], [upper[i] for i in free], keep_feasible=True),
    )
    fitted = np.array(params, dtype=np.float64)
    fitted[free] = result.x
    if not np.any(nodes > 1):
        # Prior: crossing nodes costs at least what staying on one does.
        fitted[2] = max(fitted[2], fitted[4] * 1.1)
        fitted[3] = max(fitted[3], fitted[5] * 1.1)
    return PerfParams(*(float(v) for v in fitted))


def fit_objective(
    values: FloatArray,
    nodes: FloatArray,
    replicas: FloatArray,
    micro: FloatArray,
    accum_observed: FloatArray,
    optim_observed: FloatArray,
) -> tuple[float, FloatArray]:
    """The fit's loss and its gradient over the seven parameters: RMS log error of the
    micro-batch and step times, a pull of ``gamma`` toward 1 and of the retrogression terms
    toward 0 (an optimistic model)."""
    _, _, alpha_n, beta_n, alpha_r, beta_r, gamma = values
    p = PerfParams(*(float(v) for v in values))
    accum = accum_time(p, micro)
    across, within = nodes > 1, (nodes <= 1) & (replicas > 1)
    rounds = np.maximum(replicas - 2, EPS)
    network = network_time(p, nodes, replicas)
    total = accum**gamma + network**gamma
    log_optim = np.log(total) / gamma
    e1 = np.log(accum) - np.log(accum_observed)
    e2 = log_optim - np.log(optim_observed)
    err1, err2 = np.sqrt((e1**2).mean()), np.sqrt((e2**2).mean())
    value = err1 + err2 + 1e-3 * (gamma - 1) ** 2
    value += 1e-2 * ((beta_n / alpha_n) ** 2 + (beta_r / alpha_r) ** 2)
    # d log_optim / d accum, d network, d gamma.
    by_accum = accum ** (gamma - 1) / total
    by_network = network ** (gamma - 1) / total
    by_gamma = (accum**gamma * np.log(accum) + network**gamma * np.log(network)) / (
        total * gamma
    ) - np.log(total) / gamma**2
    d_network = [across, across * rounds, within, within * rounds]

    def rms_slope(errors: FloatArray, rms: float, slope: FloatArray) -> float:
        return float((errors * slope).mean() / rms) if rms > 0 else 0.0

    gradient = np.zeros(7)
    for i, d_accum in enumerate((np.ones_like(micro), micro)):
        gradient[i] = rms_slope(e1, err1, d_accum / accum) + rms_slope(e2, err2, by_accum * d_accum)
    for i, slope in enumerate(d_network, start=2):
        gradient[i] = rms_slope(e2, err2, by_network * slope)
    gradient[6] = rms_slope(e2, err2, by_gamma) + 2e-3 * (gamma - 1)
    gradient[2] -= 2e-2 * beta_n**2 / alpha_n**3
    gradient[3] += 2e-2 * beta_n / alpha_n**2
    gradient[4] -= 2e-2 * beta_r**2 / alpha_r**3
    gradient[5] += 2e-2 * beta_r / alpha_r**2
    return float(value), gradient


class SpeedupFunction:
    """A job's goodput at (nodes, replicas) over its goodput at a base configuration,
    memoised for small counts as Pollux's is."""

    MEMO = 32

    def __init__(
        self, goodput: GoodputFunction, max_batch: int, micro_range: tuple[int, int]
    ) -> None:
        self.goodput = goodput
        self.max_batch = max_batch
        self.micro_range = micro_range
        self.base = float(self.goodput.optimize(1, 1, max_batch, micro_range)[0])
        self._memo = -np.ones((self.MEMO, self.MEMO))
        self._memo[0, 0] = 0.0

    def rebase(self, nodes: int, replicas: int) -> None:
        """Measure speed-ups against (nodes, replicas) instead (before any is asked)."""
        self.base = float(
            self.goodput.optimize(nodes, replicas, self.max_batch, self.micro_range)[0]
        )

    def __call__(self, nodes: IntArray, replicas: IntArray) -> FloatArray:
        nodes = np.asarray(nodes, dtype=np.int64).reshape(-1)
        replicas = np.asarray(replicas, dtype=np.int64).reshape(-1)
        speedup = -np.ones(len(nodes))
        small = replicas < self.MEMO
        speedup[small] = self._memo[nodes[small], replicas[small]]
        missing = speedup < 0
        if missing.any():
            pairs, inverse = np.unique(
                np.stack([nodes[missing], replicas[missing]]), axis=1, return_inverse=True
            )
            goodput = self.goodput.optimize(pairs[0], pairs[1], self.max_batch, self.micro_range)[0]
            keep = pairs[1] < self.MEMO
            self._memo[pairs[0][keep], pairs[1][keep]] = goodput[keep] / self.base
            speedup[missing] = goodput[inverse.reshape(-1)] / self.base
        return speedup
