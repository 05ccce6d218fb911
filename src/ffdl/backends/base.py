"""The execution backend interface: where and how learners run.

A backend knows the nodes it offers and starts, signals, kills and polls learner
controllers. Rules every implementation keeps:

- ``launch`` is idempotent per (training id, learner, attempt): launching again while that
  controller lives returns its existing handle instead of starting a second one.
  ``LaunchRequest.gang`` lists every learner of the attempt (node, GPU ids), so a backend
  that reserves resources (Ray's placement groups) can reserve the whole gang at once.
- ``kill`` is idempotent and silent when the learner is already gone.
- ``signal_halt`` asks the learner to checkpoint and exit; it never blocks on the learner.
- ``poll`` is the fallback when a controller stops reporting; it must work from a fresh
  process (after a server restart) given only the stored handle. For a ``MISSING`` learner
  it says in ``PollResult.reason`` why it is gone, when the backend knows.
- Handles are JSON-able dicts, stored with the learner row. A handle may carry
  ``"node": str`` (where the learner runs) and ``"gpu_ids": [int, ...]`` (the devices the
  backend actually bound); when those ids differ from the placement's, the platform
  records the bound ones so that its accounting matches the machine.
- ``BackendUnavailable`` from any call means the backend cannot be reached now (its
  cluster is down, say): callers leave things as they are and retry on a later pass. It is
  never a job's failure.
- ``problem`` says why no learner can start now (None when all is well); while it returns
  a reason the scheduler starts nothing and shows that reason on every queued job.
- ``learner_limits`` says how the manifest's memory and CPUs are held on the hosts where
  learners run (``memory``: "cgroup v2", "cgroup v1", "watchdog", "none" or "per node";
  ``detail``: one line for an operator), for ``/health`` and ``ffdl status``.
- ``close`` releases what the backend holds (connections); the platform calls it once
  when it shuts down. Learners keep running.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from ffdl.core.resources import LearnerPlacement, Node
from ffdl.learner.spec import LearnerSpec

Handle = dict[str, Any]


class BackendUnavailable(Exception):
    """The backend cannot be reached now (e.g. "Ray cluster unreachable at HOST:PORT").

    Callers retry on a later pass; it is never a job's failure.
    """


class BackendConfigError(Exception):
    """The backend cannot be opened as configured; the message says what to change."""


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    node: str
    gpu_ids: tuple[int, ...]
    spec: LearnerSpec
    # Every learner of this attempt, this one included: a backend may reserve them at once.
    gang: tuple[LearnerPlacement, ...] = ()


class LearnerState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"  # gone, with a final result recorded by the controller
    MISSING = "missing"  # gone without a trace


@dataclass(frozen=True, slots=True)
class PollResult:
    state: LearnerState
    result: dict[str, Any] | None = None  # the controller's result.json when it left one
    # For MISSING: why the learner is gone, when the backend knows ("node gpu-2 lost").
    reason: str | None = None


class Backend(Protocol):
    name: str

    def nodes(self) -> list[Node]: ...

    def launch(self, request: LaunchRequest) -> Handle: ...

    def signal_halt(self, handle: Handle) -> None: ...

    def kill(self, handle: Handle) -> None: ...

    def poll(self, handle: Handle) -> PollResult: ...

    def problem(self) -> str | None: ...

    def learner_limits(self) -> dict[str, object]: ...

    def close(self) -> None: ...
