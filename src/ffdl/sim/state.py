"""What a simulation policy sees of the engine, and what the engine asks of a policy.

``SimState`` is the simulator as policies (``ffdl.sim.policies``) and the snapshot
reductions (``ffdl.sim.snapshots``) read and drive it; ``ffdl.sim.engine.Simulator`` is
one. ``Policy`` is the interface the engine calls. Neither side imports the other: both
depend on this module only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from ffdl.core.resources import LearnerPlacement, Node, Placement
from ffdl.scheduler.snapshot import QueuedJob
from ffdl.sim.free_index import FreeIndex
from ffdl.sim.jobs import JobRecord, SimConfig
from ffdl.sim.workload import SimJob


@dataclass(slots=True)
class FreeSlots:
    """What is free on one node: GPUs (and which), CPUs, memory."""

    gpus: int
    cpus: float
    memory_mb: int
    gpu_ids: list[int]


class SimState(Protocol):
    """The running simulation, as a policy reads it and acts on it."""

    nodes: tuple[Node, ...]
    config: SimConfig
    now: float
    total_gpus: int
    gpus_per_node: int
    free: dict[str, FreeSlots]
    free_totals: list[float]
    free_index: FreeIndex
    node_jobs: dict[str, dict[str, None]]
    records: dict[str, JobRecord]
    queue: dict[str, JobRecord]
    running: dict[str, JobRecord]
    cache: dict[str, object]
    scheduler_calls: int
    autoscale_calls: int

    def queued_in_order(self) -> Iterator[JobRecord]: ...

    def queued_view(self, record: JobRecord) -> QueuedJob: ...

    def start(self, record: JobRecord, placement: Placement, batch: int | None = None) -> None: ...

    def hold(self, record: JobRecord, learner: LearnerPlacement) -> None: ...

    def preempt(self, record: JobRecord) -> None: ...

    def rescale(self, record: JobRecord, gpus: int, batch: int | None) -> None: ...

    def resize(self, record: JobRecord, gpus: int, batch: int | None = None) -> None: ...

    def settle(self) -> None: ...


class Policy(Protocol):
    """A scheduling policy the engine runs: it admits arrivals and makes passes."""

    name: str
    placement: str  # the cluster's default placement: "pack" or "spread"
    time_dependent: bool  # whether a pass may decide differently later with nothing changed

    def priority_of(self, job: SimJob) -> int: ...

    def queue_key(self, job: SimJob) -> tuple[int, float, str]: ...

    def admit(self, sim: SimState, job: SimJob) -> JobRecord: ...

    def wants_pass(self, sim: SimState) -> bool: ...

    def decide(self, sim: SimState) -> None: ...
