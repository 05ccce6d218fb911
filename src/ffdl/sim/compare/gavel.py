"""Gavel's measured throughputs and job mix, for the comparison on mixed GPU types.

Gavel (Narayanan et al., OSDI'20) measured, on K80, P100 and V100 GPUs, how fast each of its
26 training jobs runs alone (seven models, most at several batch sizes), on 1 GPU and, for
the data-parallel ones, on 2, 4 and 8. ``data/gavel-throughputs.csv`` holds those figures
(``data/README.md`` says where from and how they were reduced): steps per second, a step
being one iteration of one worker at the model's batch, so that a job's work is a number of
steps whatever its size.

``GavelTable`` reads a job's rate on any type and GPU count: between measured counts,
linearly; above the largest count measured on that type, not at all (ResNet-50 at batch
128 was measured on up to 8 V100s but only on one K80: it does not fit on more).
``derived_table`` makes a table for GPU types Gavel did not measure (H100, A100) by scaling
the V100 figures per model (``H100_A100_FACTORS``, explained there).

``gavel_jobs`` draws a trace as Gavel's ``generate_job`` does (``scheduler/utils.py``):
GPUs from the Philly distribution (1: 70 %, 2: 10 %, 4: 15 %, 8: 5 %), a run time of
``10^U(1.5, 3)`` minutes (80 %) or ``10^U(3, 4)`` minutes (20 %) on the reference type at
that size, a model drawn uniformly among those measured at that size on the reference type,
and Poisson arrivals.
Gavel has no tenants; each job is given one of ``TENANT_SHARES``' tenants, unevenly, so that
fairness between tenants has something to correct.
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Of every 10 jobs: 4 from the first tenant, 3, 2 and 1 from the others.
TENANT_SHARES: tuple[tuple[str, float], ...] = (
    ("team-a", 0.4),
    ("team-b", 0.3),
    ("team-c", 0.2),
    ("team-d", 0.1),
)

# How much faster than a V100 an A100 and an H100 run each model, for a mix Gavel did not
# measure. Not measurements: round figures within the range that vendors' and MLPerf's
# published per-GPU training results give for such models (convolutional nets about 2x a
# V100 on an A100, transformers 2.5x, and an H100 adding 1.7x to 2.7x; a reinforcement-
# learning job bound by its simulators gains little, 1.1x). What matters to a scheduler is
# that the gain differs by model, from 1.3x to 6.8x against a V100, so that which job runs
# on the H100s changes the cluster's throughput.
H100_A100_FACTORS: Mapping[str, Mapping[str, float]] = {
    "ResNet-18": {"a100": 1.6, "h100": 2.7},
    "ResNet-50": {"a100": 2.1, "h100": 3.6},
    "Transformer": {"a100": 2.5, "h100": 6.8},
    "LM": {"a100": 2.2, "h100": 5.0},
    "Recommendation": {"a100": 1.7, "h100": 3.1},
    "A3C": {"a100": 1.2, "h100": 1.3},
    "CycleGAN": {"a100": 1.9, "h100": 3.8},
}


def default_gavel_path() -> Path:
    """``data/gavel-throughputs.csv`` of the source checkout this module lives in."""
    return Path(__file__).resolve().parents[4] / "data" / "gavel-throughputs.csv"


def model_family(model: str) -> str:
    """``ResNet-18`` of ``ResNet-18 (batch size 64)``."""
    return model.split(" (", 1)[0]


@dataclass(frozen=True)
class GavelTable:
    """Measured rates: ``points[(model, gpu_type)]`` is ``((gpus, steps/s), ...)`` by GPUs."""

    points: Mapping[tuple[str, str], tuple[tuple[int, float], ...]]

    def __post_init__(self) -> None:
        for (model, gpu_type), points in self.points.items():
            if not points or any(g < 1 or not rate > 0 for g, rate in points):
                raise ValueError(f"{model} on {gpu_type}: needs points with gpus >= 1, rate > 0")
            if [g for g, _ in points] != sorted({g for g, _ in points}):
                raise ValueError(f"{model} on {gpu_type}: GPU counts must increase")
            if points[0][0] != 1:
                raise ValueError(f"{model} on {gpu_type}: needs a rate on one GPU")

    @functools.cached_property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({t for _, t in self.points}))

    @functools.cached_property
    def models(self) -> tuple[str, ...]:
        """The models measured on every type."""
        by_model: dict[str, set[str]] = defaultdict(set)
        for model, gpu_type in self.points:
            by_model[model].add(gpu_type)
        return tuple(
            sorted(m for m, types in by_model.items() if len(types) == len(self.gpu_types))
        )

    def max_gpus(self, model: str, gpu_type: str) -> int:
        """The most GPUs of ``gpu_type`` ``model`` was measured on (it may not fit on more)."""
        return self.points[model, gpu_type][-1][0]

    def sizes(self, model: str, gpu_type: str) -> tuple[int, ...]:
        """The GPU counts ``model`` was measured on, on ``gpu_type``."""
        return tuple(g for g, _ in self.points[model, gpu_type])

    def rate(self, model: str, gpu_type: str, gpus: int) -> float:
        """Steps per second of ``model`` on ``gpus`` GPUs of ``gpu_type`` (0 beyond what was
        measured)."""
        points = self.points[model, gpu_type]
        if gpus < 1 or gpus > points[-1][0]:
            return 0.0
        counts = [g for g, _ in points]
        at = bisect.bisect_left(counts, gpus)
        if counts[at] == gpus:
            return points[at][1]
        (g0, r0), (g1, r1) = points[at - 1], points[at]
        return r0 + (r1 - r0) * (gpus - g0) / (g1 - g0)

    def rates(self, model: str, gpu_type: str, up_to: int) -> list[float]:
        """``rate`` at 0, 1, ..., ``up_to`` GPUs."""
        return [self.rate(model, gpu_type, g) for g in range(up_to + 1)]


def read_gavel_table(path: Path | None = None) -> GavelTable:
    """The table in ``path`` (columns model, gpu_type, gpus, steps_per_s); a malformed row is
    refused with its line number."""
    path = path or default_gavel_path()
    points: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    with path.open(newline="") as source:
        for line, row in enumerate(csv.DictReader(source), start=2):
            try:
                key = (row["model"], row["gpu_type"])
                points[key].append((int(row["gpus"]), float(row["steps_per_s"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{line}: bad row {row!r}: {exc}") from exc
    return GavelTable({key: tuple(sorted(values)) for key, values in points.items()})


@functools.cache
def gavel_table() -> GavelTable:
    """The shipped table, read once."""
    return read_gavel_table()


def derived_table(
    base: GavelTable,
    factors: Mapping[str, Mapping[str, float]] = H100_A100_FACTORS,
    reference: str = "v100",
) -> GavelTable:
    """A table for the types of ``factors``: each model's ``reference`` rates, scaled by its
    family's factor on each type."""
    points: dict[tuple[str, str], tuple[tuple[int, float], ...]] = {}
    for model in base.models:
        for gpu_type, factor in factors[model_family(model)].items():
            measured = base.points[model, reference]
            points[model, gpu_type] = tuple((g, rate * factor) for g, rate in measured)
    return GavelTable(points)


@dataclass(frozen=True, slots=True)
class GavelJob:
    """One job of a trace: when it arrives, its model, the GPUs it asks for, its tenant and
    its work in steps."""

    id: str
    submit_s: float
    model: str
    gpus: int
    tenant: str
    steps: float

    def __post_init__(self) -> None:
        if self.gpus < 1 or not self.steps > 0 or self.submit_s < 0:
            raise ValueError(f"job {self.id}: needs gpus >= 1, steps > 0 and submit_s >= 0")


def gavel_scale_factor(rng: random.Random) -> int:
    r = rng.uniform(0, 1)
    if r >= 0.95:
        return 8
    if r >= 0.8:
        return 4
    if r >= 0.7:
        return 2
    return 1


def gavel_run_time_s(rng: random.Random) -> float:
    if rng.random() >= 0.8:
        return 60 * 10 ** rng.uniform(3, 4)
    return 60 * 10 ** rng.uniform(1.5, 3)


def gavel_jobs(
    table: GavelTable,
    count: int,
    jobs_per_hour: float,
    seed: int,
    *,
    reference: str = "v100",
    tenants: Sequence[tuple[str, float]] = TENANT_SHARES,
) -> list[GavelJob]:
    """``count`` jobs arriving at ``jobs_per_hour`` on average (see the module docstring);
    the same seed gives the same trace."""
    if count < 0 or not jobs_per_hour > 0:
        raise ValueError("count must be >= 0 and jobs_per_hour > 0")
    if reference not in table.gpu_types:
        raise ValueError(f"reference type {reference!r} is not in the table")
    rng = random.Random(seed)
    names = [name for name, _ in tenants]
    shares = [share for _, share in tenants]
    jobs: list[GavelJob] = []
    now = 0.0
    for index in range(count):
        gpus = gavel_scale_factor(rng)
        run_time = gavel_run_time_s(rng)
        model = rng.choice([m for m in table.models if gpus in table.sizes(m, reference)])
        tenant = rng.choices(names, weights=shares)[0]
        steps = run_time * table.rate(model, reference, gpus)
        jobs.append(GavelJob(f"job-{index:04d}", now, model, gpus, tenant, steps))
        now += -math.log(1.0 - rng.random()) * 3600.0 / jobs_per_hour
    return jobs
