"""The simulator's vocabulary: its configuration, and the engine's state of each job.

``SimConfig`` holds the knobs of a run (tick, horizon, restart and checkpoint rules);
``JobRecord`` is what the engine knows of one job as it moves through the states of
``JobState``; policies read records and act on them through the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ffdl.core.errors import FfdlError
from ffdl.core.resources import LearnerPlacement, Placement
from ffdl.scheduler.snapshot import QueuedJob, RunningJob
from ffdl.sim.workload import SimJob


class SimulationError(FfdlError):
    """The simulation reached an impossible state (e.g. a placement on GPUs in use)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    tick_s: float = 60.0
    horizon_s: float | None = None  # stop at this virtual time (seconds since first arrival)
    restart_s: float = 30.0  # no progress for this long after a preemption or rescale
    checkpoint_s: float = 600.0  # periodic checkpoints; a preemption loses what came after
    start_overhead_s: float = 0.0  # no progress for this long after every start
    halt_s: float = 0.0  # a preempted job holds its GPUs this long while it checkpoints
    sample_s: float | None = None  # metric sampling interval; None: about 1,500 samples
    reductions: bool = True  # exact snapshot reductions (see ffdl.sim.snapshots)
    max_passes_per_instant: int = 20

    def __post_init__(self) -> None:
        if self.tick_s <= 0:
            raise ValueError("tick_s must be > 0")
        for name in ("restart_s", "checkpoint_s", "start_overhead_s", "halt_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"  # the whole gang holds its resources and works
    HALTING = "halting"  # still holds its resources while it checkpoints
    DONE = "done"
    REJECTED = "rejected"  # can never fit this cluster


@dataclass(slots=True, eq=False)
class JobRecord:
    """The engine's state of one job."""

    job: SimJob
    elastic: bool  # whether the policy sizes this job (GPUs and batch) itself
    gpus_per_learner: int
    learners: int  # of the current placement, or what the job asks for while queued
    batch: int
    state: JobState = JobState.QUEUED
    placement: Placement | None = None
    handles: list[dict[str, Any]] = field(default_factory=list)
    live_learners: int = 0
    done: float = 0.0  # useful samples at the start of the current segment
    rate: float = 0.0
    started_at: float = 0.0
    productive_from: float = 0.0
    submitted: float = 0.0  # virtual time of arrival
    first_start: float | None = None
    finish: float | None = None
    queued_since: float = 0.0
    attempt: int = 0
    restarts: int = 0
    preemptions: int = 0
    restart_cost_due: bool = False
    resize_to: tuple[int, int] | None = None  # (GPUs, batch) after the halt under way
    halting_for: str = ""  # "preempt" or "rescale" while HALTING
    held: list[LearnerPlacement] = field(default_factory=list)  # a partial gang
    queued_view: QueuedJob | None = None
    running_view: RunningJob | None = None
    memo: object = None  # a policy's cached view of this job
    memo_attempt: int = -1

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def gpus(self) -> int:
        return self.learners * self.gpus_per_learner

    def progress(self, now: float) -> float:
        productive = max(0.0, now - self.productive_from)
        return min(self.job.work, self.done + self.rate * productive)
