"""Simulated jobs, the model families behind their speed, and synthetic Poisson workloads.

A ``SimJob`` is what a user would submit (learners, resources per learner, priority,
arrival time) plus what the simulator needs to move it forward: its *work* in useful
samples and its model *family*, whose throughput model ``T(g, b)`` and statistical
efficiency ``E(b)`` say how fast that work goes at ``g`` GPUs and global batch ``b``.

Families (step-time parameters in seconds; see ``ffdl.elastic.throughput``):

==============  ======  =======  ======  ======  ====  ===========  ===========
family          alpha   beta     gamma   delta   b0    batch range  noise scale
==============  ======  =======  ======  ======  ====  ===========  ===========
resnet-like     0.005   0.002    0.020   0.030   256   64..4096     8192
bert-like       0.010   0.008    0.060   0.080   64    32..2048     none (E = 1)
small-cnn       0.002   0.0002   0.008   0.015   128   32..4096     2048
fixed           1.0     0        0       0       1     none         none
==============  ======  =======  ======  ======  ====  ===========  ===========

``resnet-like`` is the platform's prior (compute-heavy, scales well); ``bert-like`` has large
gradients, so at its base batch the all-reduce dominates and it scales only when the batch
grows with the GPUs; ``small-cnn`` is so cheap per sample that synchronisation dominates at
any size. ``fixed`` processes one sample per second whatever its GPUs or placement: its work
is simply its run time (used where a duration is given and must not change, e.g. the fidelity
test).

Synthetic workloads draw each job's shape from discrete distributions, its family by weight,
its run time at the requested size log-uniformly, and then its work as that run time times
its throughput at the requested GPUs and base batch on the fewest nodes. Arrivals are Poisson
with the rate that offers the requested GPU load: ``rate = load * cluster GPUs / mean(GPUs *
run time)``, the mean taken over the jobs drawn. Everything comes from one seeded
``random.Random``, so a seed always gives the same workload.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from ffdl.core.resources import Resources
from ffdl.elastic.efficiency import GradientStats, efficiency
from ffdl.elastic.optimizer import nodes_for
from ffdl.elastic.throughput import ThroughputModel


@dataclass(frozen=True, slots=True)
class ModelFamily:
    """A kind of model: how its step time scales, and which batch sizes keep its accuracy."""

    name: str
    model: ThroughputModel
    base_batch: int
    batch_range: tuple[int, int] | None
    noise_scale: float | None = None  # gradient noise scale in samples; None: E(b) = 1
    grad_stats: GradientStats | None = field(init=False, default=None, compare=False)

    def __post_init__(self) -> None:
        if self.noise_scale is not None:
            # The statistics whose noise scale is ``noise_scale`` (|G|^2 = 1).
            stats = GradientStats(sq_norm=1.0, variance=self.noise_scale)
            object.__setattr__(self, "grad_stats", stats)

    def rate(self, gpus: int, batch: int, nodes: int) -> float:
        """Useful samples per second at ``gpus`` GPUs, global batch ``batch``, on ``nodes``."""
        nodes = min(max(nodes, 1), gpus)
        throughput = self.model.throughput(gpus, batch, nodes)
        return throughput * efficiency(batch, self.base_batch, self.grad_stats)


FAMILIES: dict[str, ModelFamily] = {
    family.name: family
    for family in (
        ModelFamily(
            "resnet-like", ThroughputModel(0.005, 0.002, 0.020, 0.030), 256, (64, 4096), 8192.0
        ),
        ModelFamily("bert-like", ThroughputModel(0.010, 0.008, 0.060, 0.080), 64, (32, 2048), None),
        ModelFamily(
            "small-cnn", ThroughputModel(0.002, 0.0002, 0.008, 0.015), 128, (32, 4096), 2048.0
        ),
        ModelFamily("fixed", ThroughputModel(1.0, 0.0, 0.0, 0.0), 1, None, None),
    )
}
SYNTHETIC_FAMILIES = ("resnet-like", "bert-like", "small-cnn")


@dataclass(frozen=True, slots=True)
class SimJob:
    """One submitted job. ``work`` is in useful samples; ``elastic_gpus`` is the total-GPU range
    an elastic policy may give it (multiples of the GPUs per learner), None: not elastic."""

    id: str
    submit_s: float
    learners: int
    per_learner: Resources
    work: float
    family: str
    priority: int = 50
    tenant: str = "default"
    placement: str | None = None
    expected_duration_s: float | None = None
    elastic_gpus: tuple[int, int] | None = None

    @property
    def gpus(self) -> int:
        return self.learners * self.per_learner.gpus

    @property
    def model_family(self) -> ModelFamily:
        return FAMILIES[self.family]

    def run_time_s(self, gpus_per_node: int) -> float:
        """How long the job takes at its requested size and base batch on the fewest nodes."""
        family = self.model_family
        gpus = max(self.gpus, 1)
        return self.work / family.rate(gpus, family.base_batch, nodes_for(gpus, gpus_per_node))


def work_for(family: ModelFamily, gpus: int, duration_s: float, gpus_per_node: int) -> float:
    """Work (useful samples) that takes ``duration_s`` at ``gpus`` GPUs, base batch, packed."""
    gpus = max(gpus, 1)
    return duration_s * family.rate(gpus, family.base_batch, nodes_for(gpus, gpus_per_node))


@dataclass(frozen=True, slots=True)
class Discrete:
    """A discrete distribution: ``values`` drawn with ``weights`` (equal when empty)."""

    values: tuple[float, ...]
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("a distribution needs at least one value")
        if self.weights and len(self.weights) != len(self.values):
            raise ValueError("weights must match values")

    def draw(self, rng: random.Random) -> float:
        if not self.weights:
            return self.values[rng.randrange(len(self.values))]
        cumulative = list(itertools.accumulate(self.weights))
        return self.values[bisect.bisect_right(cumulative, rng.random() * cumulative[-1])]

    @property
    def mean(self) -> float:
        weights = self.weights or tuple(1.0 for _ in self.values)
        return sum(v * w for v, w in zip(self.values, weights, strict=True)) / sum(weights)


def talk_cpus_per_learner() -> Discrete:
    """4 CPUs plus a geometric excess of mean 1, capped at 16: the talk's "4-16, avg 5"."""
    values = tuple(float(4 + k) for k in range(13))
    weights = (*(0.5 ** (k + 1) for k in range(12)), 0.5**12)
    return Discrete(values, weights)


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """What a synthetic workload looks like; the defaults are a small mixed cluster."""

    jobs: int = 200
    load: float = 0.8
    seed: int = 1
    learners: Discrete = Discrete((1, 1, 2, 4))
    gpus_per_learner: Discrete = Discrete((1, 2, 4))
    cpus_per_learner: Discrete = Discrete((4,))
    memory_per_learner_mb: Discrete = Discrete((16_384,))
    duration_s: tuple[float, float] = (600.0, 4 * 3600.0)  # log-uniform at the requested size
    families: Discrete = Discrete((0, 1, 2))  # indexes into SYNTHETIC_FAMILIES
    priorities: Discrete = Discrete((50,))
    elastic: bool = False
    elastic_max_factor: int = 2  # elastic range: one learner .. this times the request
    tenants: int = 1
    family_names: tuple[str, ...] = field(default=SYNTHETIC_FAMILIES)

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError("jobs must be >= 1")
        if not self.load > 0:
            raise ValueError("load must be > 0")
        low, high = self.duration_s
        if not 0 < low <= high:
            raise ValueError("duration range must satisfy 0 < min <= max")


def synthetic(spec: SyntheticSpec, *, cluster_gpus: int, gpus_per_node: int) -> list[SimJob]:
    """Jobs with Poisson arrivals offering ``spec.load`` of ``cluster_gpus``."""
    if cluster_gpus < 1:
        raise ValueError("the cluster needs at least one GPU")
    rng = random.Random(spec.seed)
    shapes: list[tuple[int, Resources, ModelFamily, float, int, int]] = []
    low, high = spec.duration_s
    for index in range(spec.jobs):
        learners = int(spec.learners.draw(rng))
        per = Resources(
            int(spec.gpus_per_learner.draw(rng)),
            float(spec.cpus_per_learner.draw(rng)),
            int(spec.memory_per_learner_mb.draw(rng)),
        )
        family = FAMILIES[spec.family_names[int(spec.families.draw(rng))]]
        duration = math.exp(rng.uniform(math.log(low), math.log(high)))
        priority = int(spec.priorities.draw(rng))
        tenant = index % max(spec.tenants, 1)
        shapes.append((learners, per, family, duration, priority, tenant))
    gpu_seconds = sum(learners * per.gpus * d for learners, per, _f, d, _p, _t in shapes)
    rate = spec.load * cluster_gpus / (gpu_seconds / len(shapes))
    jobs: list[SimJob] = []
    clock = 0.0
    for index, (learners, per, family, duration, priority, tenant) in enumerate(shapes):
        if index:
            clock += rng.expovariate(rate)
        gpus = learners * per.gpus
        elastic = None
        if spec.elastic and per.gpus > 0:
            top = min(spec.elastic_max_factor * gpus, cluster_gpus)
            elastic = (per.gpus, max(per.gpus, top // per.gpus * per.gpus))
        jobs.append(
            SimJob(
                id=f"job-{index + 1:06d}",
                submit_s=clock,
                learners=learners,
                per_learner=per,
                work=work_for(family, gpus, duration, gpus_per_node),
                family=family.name,
                priority=priority,
                tenant=f"team-{tenant}",
                expected_duration_s=duration,
                elastic_gpus=elastic,
            )
        )
    return jobs


def fixed_duration_job(
    job_id: str,
    submit_s: float,
    duration_s: float,
    *,
    learners: int = 1,
    per_learner: Resources | None = None,
    priority: int = 50,
    expected_duration_s: float | None = None,
) -> SimJob:
    """A job that runs exactly ``duration_s`` once started, whatever its placement."""
    return SimJob(
        id=job_id,
        submit_s=submit_s,
        learners=learners,
        per_learner=per_learner or Resources(1, 1.0, 256),
        work=duration_s,
        family="fixed",
        priority=priority,
        expected_duration_s=expected_duration_s,
    )


def offered_load(jobs: Sequence[SimJob], cluster_gpus: int, gpus_per_node: int) -> float:
    """GPU-seconds asked for per second of arrivals, as a fraction of the cluster."""
    if len(jobs) < 2:
        return 0.0
    span = max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs)
    if span <= 0:
        return math.inf
    demand = sum(j.gpus * j.run_time_s(gpus_per_node) for j in jobs)
    return demand / span / cluster_gpus
