"""What the policy comparison knows of a job: its model family and what a policy sees of it.

``CompareJob`` is the submitted job (arrival, the GPUs its user asked for, its family, its
work in useful samples); ``JobView`` is what a policy is shown at a scheduling round: the job,
its progress, its current allocation and its history. Every policy sees the same views. All
but the two ``-fit`` policies use the true goodput model of every job (the oracle that
Pollux's and Optimus's fitted models approach once a job has run a while); those fit one to
the step times in ``observed``. None is told the work left except through
``remaining_samples``, which only policies that estimate it (Optimus, ffdl's) use.
"""

from __future__ import annotations

from dataclasses import dataclass

from ffdl.elastic.throughput import StepObservation
from ffdl.sim.compare.families import Family


@dataclass(frozen=True, slots=True)
class CompareJob:
    """One submitted job: the GPUs and global batch its user asked for (which a policy that
    does not adapt runs it at), and its work in samples at its family's ``b0``."""

    id: str
    submit_s: float
    family: Family
    requested_gpus: int
    requested_batch: int
    work: float

    def __post_init__(self) -> None:
        problem = self.family.batch_problem(self.requested_gpus, self.requested_batch)
        if problem is not None:
            raise ValueError(f"job {self.id}: {problem}")
        if self.work <= 0:
            raise ValueError(f"job {self.id}: work must be > 0")

    def fixed_batch_gpus(self) -> tuple[int, int]:
        """The GPU counts its requested batch can run on."""
        return self.family.gpus_for_batch(self.requested_batch)


@dataclass(frozen=True, slots=True)
class SeenSteps:
    """The step times a job was seen to take, one per round it ran, oldest first, as runs of
    the same observation (observation, rounds in a row): a job seldom changes shape, so this
    stays short and is shown to policies every round without copying."""

    runs: tuple[tuple[StepObservation, int], ...] = ()
    count: int = 0

    @property
    def latest(self) -> StepObservation | None:
        return self.runs[-1][0] if self.runs else None

    def added(self, seen: StepObservation, keep: int) -> SeenSteps:
        """These and ``seen``, the oldest dropped beyond ``keep``."""
        runs = list(self.runs)
        if runs and runs[-1][0] == seen:
            runs[-1] = (seen, runs[-1][1] + 1)
        else:
            runs.append((seen, 1))
        count = self.count + 1
        while count > keep:
            oldest, times = runs[0]
            drop = min(times, count - keep)
            runs[0:1] = [(oldest, times - drop)] if times > drop else []
            count -= drop
        return SeenSteps(tuple(runs), count)

    def each(self) -> list[StepObservation]:
        """Every observation, as many times as it was seen."""
        return [seen for seen, times in self.runs for _ in range(times)]


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as a policy sees it at one scheduling round."""

    job: CompareJob
    progress: float  # fraction of its work done, 0..1
    gpus: int  # 0: not running
    batch: int  # its current global batch (its requested batch before it first ran)
    nodes: int  # machines its GPUs span (0 when not running)
    attained_gpu_s: float  # GPU-seconds it has held (Tiresias's attained service)
    waited_s: float  # since it last held GPUs, or since it arrived
    age_s: float  # since it arrived
    last_run_s: float  # length of its last stretch with GPUs (Tiresias's starvation rule)
    running_s: float  # since it last started running (0 while it holds no GPUs)
    restarts: int
    # Step times it was seen to take: what a policy that learns a job's speed online, as the
    # live autoscaler does, may fit.
    observed: SeenSteps = SeenSteps()

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def family(self) -> Family:
        return self.job.family

    @property
    def remaining_samples(self) -> float:
        return self.job.work * (1.0 - self.progress)

    @property
    def noise_scale(self) -> float:
        return self.job.family.noise_scale_at(self.progress)


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's choice for one job: GPUs (0: none) and the global batch to run at."""

    gpus: int
    batch: int
