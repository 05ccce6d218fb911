"""Workloads derived from the Philly trace by the rules of Pollux's published workloads.

- **Pool**: trace rows that ran at least 60 s and used under 1,000 GPU-hours.
- **Window**: the first eight hours of a day (timestamps moved two hours back, hour < 8), over
  every day of the trace: a job's submission is its time of day in seconds, 0 .. 28,800.
- **Jobs**: 160 drawn at random (a seeded ``random.Random``) for load 1.0; a load of ``x``
  draws ``round(160 * x)`` into the same eight hours (80 at 0.5, 320 at 2.0).
- **Family by the job's GPU-time in the trace**: under 1 GPU-hour cifar10 or ncf (half each),
  1-10 deepspeech2 or bert (half each), 10-100 yolov3, from 100 on imagenet.
- **What its user asks for**: among 1, 2, 4, 6, 8, 12, 16, 24, 32 and 48 GPUs (packed on nodes
  of ``gpus_per_node``), each with the batch that trains fastest there, a count qualifies when
  the whole training takes under 12 hours and its scaling efficiency (one GPU's time over
  ``g`` times its time) is between 0.5 and 0.8; one qualifying count is drawn, else the
  smallest count that trains in under 12 hours (else 1 GPU at the family's own batch).
  Policies that do not adapt run the job at exactly that.
- **Work**: the family's whole training.
- **Speed** (``WorkloadSpec.speed``): the families' step times from their model (``"model"``)
  or from measured profiles (``"measured"``); requests are worked out on the same speeds the
  jobs then run at, as Pollux's workloads were on its measured profiles.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from ffdl.sim.compare.families import FAMILIES, SPEEDS, Family, families
from ffdl.sim.compare.jobs import CompareJob
from ffdl.sim.philly import TraceRow, read_rows

WINDOW_S = 8 * 3600.0
JOBS_AT_LOAD_1 = 160
GPU_COUNTS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)
MAX_TRAINING_S = 12 * 3600.0
SCALING_EFFICIENCY = (0.5, 0.8)
_SHIFT = timedelta(hours=2)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    load: float = 1.0
    seed: int = 0
    gpus_per_node: int = 4
    speed: str = "model"

    def __post_init__(self) -> None:
        if not self.load > 0:
            raise ValueError("load must be > 0")
        if self.speed not in SPEEDS:
            raise ValueError(f"unknown speed {self.speed!r}; choose from {', '.join(SPEEDS)}")


def eligible(rows: list[TraceRow]) -> list[TraceRow]:
    """The pool: rows of at least 60 s, under 1,000 GPU-hours, in the first eight hours."""
    return [r for r in rows if _sized(r) and (r.submitted - _SHIFT).hour < 8]


def _sized(row: TraceRow) -> bool:
    """At least 60 s and under 1,000 GPU-hours."""
    return row.duration_s >= 60 and row.duration_s * row.gpus < 1000 * 3600


def family_for(
    gpu_hours: float, draw: random.Random, among: Mapping[str, Family] = FAMILIES
) -> Family:
    if gpu_hours < 1:
        return among["cifar10" if draw.random() < 0.5 else "ncf"]
    if gpu_hours < 10:
        return among["deepspeech2" if draw.random() < 0.5 else "bert"]
    if gpu_hours < 100:
        return among["yolov3"]
    return among["imagenet"]


def request_for(family: Family, draw: random.Random, gpus_per_node: int) -> tuple[int, int]:
    """The GPUs and batch a user asks for (see the module docstring)."""
    qualifying, fallback = _configurations(family, gpus_per_node)
    return draw.choice(qualifying) if qualifying else fallback


@functools.lru_cache(maxsize=64)
def _configurations(
    family: Family, gpus_per_node: int
) -> tuple[tuple[tuple[int, int], ...], tuple[int, int]]:
    """The (GPUs, batch) pairs that qualify, and what to ask for when none does; the same
    for every job of a family, so worked out once."""
    one = family.training_time_s(1, family.base_batch, gpus_per_node)
    qualifying, in_time = [], []
    for gpus in GPU_COUNTS:
        batch = family.best_batch(gpus, -(-gpus // gpus_per_node), 0.5)
        if batch == 0:
            continue
        seconds = family.training_time_s(gpus, batch, gpus_per_node)
        scaling = one / (gpus * seconds)
        if seconds < MAX_TRAINING_S:
            in_time.append((gpus, batch))
            if SCALING_EFFICIENCY[0] <= scaling <= SCALING_EFFICIENCY[1]:
                qualifying.append((gpus, batch))
    return tuple(qualifying), in_time[0] if in_time else (1, family.base_batch)


def build(spec: WorkloadSpec, trace: Path) -> list[CompareJob]:
    """The workload of ``spec`` from the trace at ``trace``."""
    pool = eligible(list(read_rows(trace)))
    count = round(JOBS_AT_LOAD_1 * spec.load)
    if count > len(pool):
        raise ValueError(f"load {spec.load} needs {count} jobs; the trace window has {len(pool)}")
    draw = random.Random(spec.seed)
    among = families(spec.speed)
    chosen = sorted(draw.sample(pool, count), key=lambda r: (_time_of_day(r), r.index))
    jobs = []
    for n, row in enumerate(chosen):
        family = family_for(row.duration_s * row.gpus / 3600, draw, among)
        gpus, batch = request_for(family, draw, spec.gpus_per_node)
        jobs.append(
            CompareJob(
                id=f"job-{n:03d}",
                submit_s=_time_of_day(row),
                family=family,
                requested_gpus=gpus,
                requested_batch=batch,
                work=family.work,
            )
        )
    return jobs


def whole_trace(
    trace: Path, *, gpus_per_node: int = 4, seed: int = 0, speed: str = "model"
) -> list[CompareJob]:
    """Every row of the pool's size and length rules as a job, submitted at its own time
    (seconds since the trace's first submission): no time-of-day window, no draw of rows.
    Families and requests follow the rules above, drawn with ``seed``."""
    spec = WorkloadSpec(seed=seed, gpus_per_node=gpus_per_node, speed=speed)
    rows = [r for r in read_rows(trace) if _sized(r)]
    if not rows:
        raise ValueError(f"{trace} holds no row of at least 60 s and under 1,000 GPU-hours")
    first = min(r.submitted for r in rows)
    draw = random.Random(spec.seed)
    among = families(spec.speed)
    jobs = []
    for n, row in enumerate(sorted(rows, key=lambda r: (r.submitted, r.index))):
        family = family_for(row.duration_s * row.gpus / 3600, draw, among)
        gpus, batch = request_for(family, draw, spec.gpus_per_node)
        submit_s = (row.submitted - first).total_seconds()
        jobs.append(CompareJob(f"job-{n:05d}", submit_s, family, gpus, batch, family.work))
    return jobs


def _time_of_day(row: TraceRow) -> float:
    shifted = row.submitted - _SHIFT
    return float(shifted.hour * 3600 + shifted.minute * 60 + shifted.second)
