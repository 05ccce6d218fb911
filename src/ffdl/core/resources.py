"""Resources, nodes and placements: the vocabulary shared by backends and the scheduler.

Memory is always in MiB here; the manifest converts FfDL's units on the way in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The ``gpu_type`` of a node without GPUs, which offers CPU slots in their place: a job's
# ``gpus`` there are slots, and everything users read calls them CPU slots.
CPU_SLOTS = "cpu"


def slot_noun(gpu_type: str | None, count: float = 1) -> str:
    """What a node of ``gpu_type`` calls its ``gpus``: GPU(s), or CPU slot(s)."""
    noun = "CPU slot" if gpu_type == CPU_SLOTS else "GPU"
    return noun if count == 1 else noun + "s"


@dataclass(frozen=True, slots=True)
class Resources:
    gpus: int = 0
    cpus: float = 0.0
    memory_mb: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.gpus + other.gpus, self.cpus + other.cpus, self.memory_mb + other.memory_mb
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.gpus - other.gpus, self.cpus - other.cpus, self.memory_mb - other.memory_mb
        )

    def scaled(self, n: int) -> Resources:
        return Resources(self.gpus * n, self.cpus * n, self.memory_mb * n)

    def fits_in(self, capacity: Resources) -> bool:
        return (
            self.gpus <= capacity.gpus
            and self.cpus <= capacity.cpus + 1e-9
            and self.memory_mb <= capacity.memory_mb
        )


@dataclass(frozen=True, slots=True)
class Node:
    """A machine (or a declared virtual node) with its capacity and labels."""

    name: str
    gpus: int
    cpus: float
    memory_mb: int
    gpu_type: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    schedulable: bool = True

    @property
    def capacity(self) -> Resources:
        return Resources(self.gpus, self.cpus, self.memory_mb)


@dataclass(frozen=True, slots=True)
class LearnerPlacement:
    """Where one learner runs: its node, the GPU ids it holds there and their type."""

    learner: int  # 1-based, as LEARNER_ID
    node: str
    gpu_ids: tuple[int, ...] = ()
    # The node's GPU type when it was placed ("" where not known); not part of identity.
    gpu_type: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Placement:
    """A whole gang's placement: one entry per learner."""

    learners: tuple[LearnerPlacement, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({lp.node for lp in self.learners}))

    @property
    def gpu_type(self) -> str | None:
        """The GPU type its first learner runs on (a gang's are one type unless it mixes
        them); None when not known."""
        return (self.learners[0].gpu_type or None) if self.learners else None

    def to_json(self) -> list[dict[str, object]]:
        return [
            {"learner": lp.learner, "node": lp.node, "gpu_ids": list(lp.gpu_ids)}
            | ({"gpu_type": lp.gpu_type} if lp.gpu_type else {})
            for lp in self.learners
        ]

    @staticmethod
    def from_json(data: list[dict[str, object]]) -> Placement:
        out = []
        for item in data:
            gpu_ids = item.get("gpu_ids") or []
            assert isinstance(gpu_ids, list)
            out.append(
                LearnerPlacement(
                    learner=int(str(item["learner"])),
                    node=str(item["node"]),
                    gpu_ids=tuple(int(g) for g in gpu_ids),
                    gpu_type=str(item.get("gpu_type") or ""),
                )
            )
        return Placement(tuple(out))
