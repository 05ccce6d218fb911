"""The Philly trace as a workload: loading, filtering and turning rows into ``SimJob`` s.

The trace (``data/philly-jobs.csv``, columns ``timestamp,duration,num_gpus,gpu_time,cluster``)
gives a real arrival process and job sizes but no models. The rules that fill the gap:

- **Filters**, in this order: time window (``start`` inclusive, ``end`` exclusive, on the
  submission timestamp), virtual cluster (``vc``), then sampling: a row is kept when a hash
  of its line and the seed falls below ``sample``, so the same rows are kept on every run
  and a smaller sample is a subset of a larger one.
- **Arrival**: seconds since the earliest kept submission.
- **Shape**: one learner per GPU (data-parallel), ``cpus_per_gpu`` CPUs and
  ``memory_per_gpu_mb`` memory per learner.
- **Family**: chosen from the synthetic families by a hash of the row, so a row always gets
  the same one.
- **Work**: the trace duration times the family's throughput at the requested GPUs and base
  batch on the fewest nodes of ``gpus_per_node`` GPUs. A job therefore runs exactly its trace
  duration when it gets its requested GPUs on that many nodes (FIFO on a packed cluster);
  elsewhere its speed follows the model.
- **Elastic range**: 1 .. 2 x requested GPUs, capped at ``max_gpus``.
- **Expected duration**: the trace duration (what a user would declare), used by backfill.
- **Priority**: the trace has none; every job gets 50.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ffdl.core.resources import Resources
from ffdl.sim.workload import FAMILIES, SYNTHETIC_FAMILIES, SimJob, work_for

COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"


class TraceError(ValueError):
    """The trace file is missing, malformed, or a filter is invalid."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    index: int  # 0-based data row number in the file
    submitted: datetime
    duration_s: float
    gpus: int
    cluster: str
    line: str  # the row as read, for stable hashing


@dataclass(frozen=True, slots=True)
class TraceFilter:
    start: datetime | None = None
    end: datetime | None = None
    vc: str | None = None
    sample: float = 1.0
    seed: int = 1

    def __post_init__(self) -> None:
        if not 0.0 < self.sample <= 1.0:
            raise TraceError("sample must be in (0, 1]")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise TraceError("end must be after start")


def default_trace_path() -> Path:
    """``data/philly-jobs.csv`` of the source checkout this module lives in."""
    return Path(__file__).resolve().parents[3] / "data" / "philly-jobs.csv"


def parse_time(text: str) -> datetime:
    """A trace timestamp or an ISO date/date-time (``2017-10-01`` or ``2017-10-01T12:00``)."""
    try:
        return datetime.strptime(text, TIMESTAMP_FORMAT)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).replace(tzinfo=None)
    except ValueError as exc:
        raise TraceError(f"not a date or date-time: {text!r}") from exc


def read_rows(path: Path) -> Iterator[TraceRow]:
    """Every row of the trace, validated."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from exc
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != COLUMNS:
            raise TraceError(f"{path}: expected header {','.join(COLUMNS)}, got {header}")
        for index, fields in enumerate(reader):
            if not fields:
                continue
            try:
                timestamp, duration, gpus, _gpu_time, cluster = fields
                yield TraceRow(
                    index,
                    datetime.strptime(timestamp, TIMESTAMP_FORMAT),
                    max(float(duration), 0.0),
                    int(gpus),
                    cluster,
                    ",".join(fields),
                )
            except ValueError as exc:
                raise TraceError(f"{path}: bad row {index + 2}: {fields}: {exc}") from exc


def _unit_hash(*parts: object) -> float:
    digest = hashlib.blake2b("|".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def select(rows: Iterator[TraceRow], where: TraceFilter) -> list[TraceRow]:
    """The rows the filter keeps, in file order."""
    kept = []
    for row in rows:
        if where.start is not None and row.submitted < where.start:
            continue
        if where.end is not None and row.submitted >= where.end:
            continue
        if where.vc is not None and row.cluster != where.vc:
            continue
        if (
            where.sample < 1.0
            and _unit_hash("sample", where.seed, row.index, row.line) >= where.sample
        ):
            continue
        kept.append(row)
    return kept


def family_of(row: TraceRow) -> str:
    return SYNTHETIC_FAMILIES[
        int(_unit_hash("family", row.index, row.line) * len(SYNTHETIC_FAMILIES))
    ]


def to_jobs(
    rows: list[TraceRow],
    *,
    gpus_per_node: int,
    max_gpus: int,
    cpus_per_gpu: float = 4.0,
    memory_per_gpu_mb: int = 16_384,
) -> list[SimJob]:
    """``SimJob`` s for the rows, by the rules of the module docstring, in arrival order."""
    if not rows:
        return []
    ordered = sorted(rows, key=lambda r: (r.submitted, r.index))
    origin = ordered[0].submitted
    jobs = []
    for row in ordered:
        gpus = max(row.gpus, 1)
        family = FAMILIES[family_of(row)]
        jobs.append(
            SimJob(
                id=f"philly-{row.index + 1:06d}",
                submit_s=(row.submitted - origin).total_seconds(),
                learners=gpus,
                per_learner=Resources(1, cpus_per_gpu, memory_per_gpu_mb),
                work=work_for(family, gpus, row.duration_s, gpus_per_node),
                family=family.name,
                expected_duration_s=max(row.duration_s, 1.0),
                elastic_gpus=(1, max(1, min(2 * gpus, max_gpus))),
                tenant=row.cluster,
            )
        )
    return jobs


def load_philly(
    path: Path | None = None,
    where: TraceFilter | None = None,
    *,
    gpus_per_node: int = 8,
    max_gpus: int = 1 << 30,
    cpus_per_gpu: float = 4.0,
    memory_per_gpu_mb: int = 16_384,
) -> list[SimJob]:
    """The trace at ``path`` (default: the checked-in copy), filtered and turned into jobs."""
    rows = select(read_rows(path or default_trace_path()), where or TraceFilter())
    return to_jobs(
        rows,
        gpus_per_node=gpus_per_node,
        max_gpus=max_gpus,
        cpus_per_gpu=cpus_per_gpu,
        memory_per_gpu_mb=memory_per_gpu_mb,
    )
