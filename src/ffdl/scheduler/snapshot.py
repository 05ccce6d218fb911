"""The scheduler's input and output: an immutable snapshot of the cluster and the decisions.

The live scheduler loop builds a ``Snapshot`` from the store and the backend's nodes; the
simulator builds one from its virtual cluster. Both hand it to the same pure ``schedule``
function and apply the ``Decisions`` it returns. Times are seconds on whatever clock the
caller uses (wall clock live, virtual clock in the simulator).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ffdl.core.resources import Node, Placement, Resources


@dataclass(frozen=True, slots=True)
class QueuedJob:
    id: str
    tenant: str
    priority: int  # 0..100, higher first
    submitted_at: float
    learners: int
    per_learner: Resources
    # The one GPU type it accepts (shorthand for ``gpu_types`` of one), or None.
    gpu_type: str | None = None
    placement_policy: str | None = None  # "pack" | "spread" | None (cluster default)
    same_label: str | None = None  # locality: all learners share one value of this label
    expected_duration_s: float | None = None
    # The GPU types it accepts, in order of preference (empty: any), and whether one gang may
    # span several of them (by default a gang runs on GPUs of one type).
    gpu_types: tuple[str, ...] = ()
    mix_gpu_types: bool = False
    # The type the elastic optimizer planned a waiting elastic job on: tried first.
    preferred_type: str | None = None

    def __post_init__(self) -> None:
        if self.gpu_type is not None and not self.gpu_types:
            object.__setattr__(self, "gpu_types", (self.gpu_type,))
        elif self.gpu_type is None and len(self.gpu_types) == 1:
            object.__setattr__(self, "gpu_type", self.gpu_types[0])

    @property
    def total(self) -> Resources:
        return self.per_learner.scaled(self.learners)

    def accepts(self, gpu_type: str) -> bool:
        """Whether a node of ``gpu_type`` may hold its learners."""
        return not self.gpu_types or gpu_type in self.gpu_types

    @property
    def spans_types(self) -> bool:
        """Whether one gang may take GPUs of several types: when it asks for it, and always
        for learners without GPUs."""
        return self.mix_gpu_types or self.per_learner.gpus == 0

    def of_one_type(self, present: Iterable[str]) -> list[QueuedJob]:
        """The job as it may be placed: one version restricted to each GPU type it accepts
        among ``present`` (its preferred type first, then its own order, then by name), or
        itself when its gang may span types or only one type is there."""
        if self.spans_types:
            return [self]
        there = set(present)
        kinds = [t for t in self.gpu_types if t in there] if self.gpu_types else sorted(there)
        if len(kinds) <= 1:
            return [self]
        if self.preferred_type in kinds:
            kinds.remove(self.preferred_type)
            kinds.insert(0, self.preferred_type)
        return [replace(self, gpu_type=kind, gpu_types=(kind,)) for kind in kinds]


@dataclass(frozen=True, slots=True)
class RunningJob:
    id: str
    tenant: str
    priority: int
    started_at: float
    learners: int
    per_learner: Resources
    placement: Placement
    expected_duration_s: float | None = None
    preemptible: bool = True
    # The end its own progress points to (``ffdl.core.progress``), when it reports any.
    estimated_end_at: float | None = None

    @property
    def total(self) -> Resources:
        return self.per_learner.scaled(self.learners)

    def expected_end(self, typical_duration_s: float | None) -> float | None:
        """When it should end: from its progress, else its declared or a typical duration."""
        if self.estimated_end_at is not None:
            return self.estimated_end_at
        duration = self.expected_duration_s or typical_duration_s
        return None if duration is None else self.started_at + duration


@dataclass(frozen=True, slots=True)
class TenantQuota:
    tenant: str
    max_gpus: int | None = None
    max_running_jobs: int | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[Node, ...]
    queued: tuple[QueuedJob, ...]
    running: tuple[RunningJob, ...] = ()
    quotas: dict[str, TenantQuota] = field(default_factory=dict)
    default_placement: str = "pack"
    # Historical median run time (seconds) used for ETAs when a job gives no hint.
    typical_duration_s: float | None = None


@dataclass(frozen=True, slots=True)
class Start:
    job_id: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: str
    by: str  # the job that needs the resources
    reason: str


@dataclass(frozen=True, slots=True)
class Waiting:
    job_id: str
    position: int  # 1-based position in the queue
    reason: str  # in words a user understands
    eta_s: float | None = None  # estimated seconds until start, None when unknown
    eta_reason: str = ""  # why the ETA is what it is (or why it is unknown)


@dataclass(frozen=True, slots=True)
class Decisions:
    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preempt, ...] = ()
    waiting: tuple[Waiting, ...] = ()
