"""The execution backend interface: where and how learners run.

A backend knows the nodes it offers and starts, signals, kills and polls learner
controllers. Rules every implementation keeps:

- ``launch`` is idempotent per (training id, learner, attempt): launching again while that
  controller lives returns its existing handle instead of starting a second one.
- ``kill`` is idempotent and silent when the learner is already gone.
- ``signal_halt`` asks the learner to checkpoint and exit; it never blocks on the learner.
- ``poll`` is the fallback when a controller stops reporting; it must work from a fresh
  process (after a server restart) given only the stored handle.
- Handles are JSON-able dicts, stored with the learner row.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from ffdl.core.resources import Node
from ffdl.learner.spec import LearnerSpec

Handle = dict[str, Any]


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    node: str
    gpu_ids: tuple[int, ...]
    spec: LearnerSpec


class LearnerState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"  # gone, with a final result recorded by the controller
    MISSING = "missing"  # gone without a trace


@dataclass(frozen=True, slots=True)
class PollResult:
    state: LearnerState
    result: dict[str, Any] | None = None  # the controller's result.json when it left one


class Backend(Protocol):
    name: str

    def nodes(self) -> list[Node]: ...

    def launch(self, request: LaunchRequest) -> Handle: ...

    def signal_halt(self, handle: Handle) -> None: ...

    def kill(self, handle: Handle) -> None: ...

    def poll(self, handle: Handle) -> PollResult: ...
