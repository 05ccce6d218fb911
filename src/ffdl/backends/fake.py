"""The fake backend: learners with scripted behaviour on a virtual clock.

Ships in the package (as httpx ships ``MockTransport``) so that tests of the scheduler loops
and the cluster simulator can drive a backend that keeps every rule of the ``Backend``
protocol without starting a process:

- ``launch`` is idempotent per (training id, learner, attempt): launching again returns the
  existing handle while that learner lives or has left a result; a learner that was killed
  (gone without a trace) may be launched again.
- ``signal_halt`` asks a learner to checkpoint and exit: it exits ``HALTED`` after its
  script's ``halt_s`` unless the script ignores halts. It never blocks.
- ``kill`` is idempotent and silent when the learner is already gone; a killed learner polls
  as ``MISSING``.
- ``poll`` reports ``RUNNING`` until the learner's scripted end, then ``EXITED`` with the
  result a controller would leave (``COMPLETED``, ``FAILED`` with C201 and the exit code, or
  ``HALTED``).

What a learner does is a ``LearnerScript`` (run N virtual seconds then exit with code X, run
until halted, ignore halts), set per job or per learner with ``script`` before the launch.
Time moves only when the owner calls ``advance``/``advance_to``, which return the learner
exits that happened, in time order; ``next_exit_at`` says when the next one is due so an
event loop can jump straight to it. ``fake_request`` builds the launch request of a learner
that runs nothing, which is all this backend reads of it.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any

from ffdl.backends.base import Handle, LaunchRequest, LearnerState, PollResult
from ffdl.core.resources import Node
from ffdl.core.status import ErrorCode, LearnerStatus
from ffdl.learner.spec import LearnerSpec

_Key = tuple[str, int, int]  # (training id, learner, attempt)


def fake_request(
    node: str,
    gpu_ids: tuple[int, ...],
    training_id: str,
    learner: int,
    num_learners: int,
    attempt: int,
) -> LaunchRequest:
    """A launch request for a learner of this backend: identity and placement only."""
    spec = LearnerSpec(
        training_id=training_id,
        learner=learner,
        num_learners=num_learners,
        attempt=attempt,
        api_url="http://127.0.0.1/simulated",
        job_token="",
        command="",
        workdir="",
        env={},
        data=[],
        results_source=None,
        results_target=None,
        emetrics_file=None,
        metric_groups={},
        state_dir="",
    )
    return LaunchRequest(node, gpu_ids, spec)


@dataclass(frozen=True, slots=True)
class LearnerScript:
    """How a fake learner behaves once launched.

    ``run_s`` None: it runs until halted or killed. ``exit_code`` 0 ends ``COMPLETED``,
    anything else ``FAILED`` (error code C201, as a crashed user command).
    """

    run_s: float | None = None
    exit_code: int = 0
    ignore_halt: bool = False
    halt_s: float = 0.0

    def __post_init__(self) -> None:
        if self.run_s is not None and self.run_s < 0:
            raise ValueError("run_s must be >= 0")
        if self.halt_s < 0:
            raise ValueError("halt_s must be >= 0")


@dataclass(frozen=True, slots=True)
class LearnerExit:
    """A learner that left: its handle, when, and the result it left behind."""

    handle: Handle
    at: float
    result: dict[str, Any]


@dataclass(slots=True)
class _Learner:
    handle: Handle
    request: LaunchRequest
    script: LearnerScript
    launched_at: float
    scripted_end: float | None
    halt_at: float | None = None
    result: dict[str, Any] | None = None
    killed: bool = False
    version: int = 0

    @property
    def ends_at(self) -> float | None:
        if self.halt_at is None:
            return self.scripted_end
        if self.scripted_end is None:
            return self.halt_at
        return min(self.halt_at, self.scripted_end)

    @property
    def halted(self) -> bool:
        # A learner whose work ends exactly when its halt does has finished, not halted.
        return self.halt_at is not None and (
            self.scripted_end is None or self.halt_at < self.scripted_end
        )


class FakeBackend:
    """An in-memory ``Backend`` whose learners follow scripts on a virtual clock."""

    name = "fake"

    def __init__(
        self,
        nodes: list[Node] | tuple[Node, ...],
        *,
        default_script: LearnerScript | None = None,
        start_at: float = 0.0,
    ) -> None:
        self._nodes = list(nodes)
        self._default = default_script or LearnerScript()
        self._now = start_at
        self._learners: dict[_Key, _Learner] = {}
        self._job_scripts: dict[str, LearnerScript] = {}
        self._learner_scripts: dict[tuple[str, int], LearnerScript] = {}
        # (time, sequence, key, version): stale entries are skipped when popped.
        self._due: list[tuple[float, int, _Key, int]] = []
        self._sequence = itertools.count()
        self.launches = 0

    # -- the clock ---------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> list[LearnerExit]:
        """Move the clock forward; return the learners that exited meanwhile, in order."""
        if seconds < 0:
            raise ValueError("the virtual clock cannot go back")
        return self.advance_to(self._now + seconds)

    def advance_to(self, at: float) -> list[LearnerExit]:
        """Move the clock to ``at`` (never back); return the exits up to and including it."""
        if at < self._now:
            raise ValueError(f"the virtual clock is at {self._now}, cannot go back to {at}")
        exits: list[LearnerExit] = []
        while self._due and self._due[0][0] <= at:
            when, _seq, key, version = heapq.heappop(self._due)
            learner = self._learners.get(key)
            if learner is None or learner.version != version or learner.result is not None:
                continue
            self._now = max(self._now, when)
            learner.result = self._final_result(learner, when)
            exits.append(LearnerExit(learner.handle, when, learner.result))
        self._now = at
        return exits

    def next_exit_at(self) -> float | None:
        """When the next scripted exit is due, or None when no learner will exit by itself."""
        while self._due:
            when, _seq, key, version = self._due[0]
            learner = self._learners.get(key)
            if learner is not None and learner.version == version and learner.result is None:
                return when
            heapq.heappop(self._due)
        return None

    # -- scripts -----------------------------------------------------------------------

    def script(
        self, training_id: str, script: LearnerScript, *, learner: int | None = None
    ) -> None:
        """What the learners of ``training_id`` (or just one of them) do when next launched."""
        if learner is None:
            self._job_scripts[training_id] = script
        else:
            self._learner_scripts[(training_id, learner)] = script

    def _script_for(self, training_id: str, learner: int) -> LearnerScript:
        return self._learner_scripts.get(
            (training_id, learner), self._job_scripts.get(training_id, self._default)
        )

    # -- the Backend protocol ----------------------------------------------------------

    def nodes(self) -> list[Node]:
        return list(self._nodes)

    def launch(self, request: LaunchRequest) -> Handle:
        spec = request.spec
        key = (spec.training_id, spec.learner, spec.attempt)
        existing = self._learners.get(key)
        if existing is not None and not existing.killed:
            return existing.handle
        script = self._script_for(spec.training_id, spec.learner)
        handle: Handle = {
            "backend": self.name,
            "training_id": spec.training_id,
            "learner": spec.learner,
            "attempt": spec.attempt,
            "node": request.node,
        }
        ends_at = None if script.run_s is None else self._now + script.run_s
        learner = _Learner(handle, request, script, self._now, ends_at)
        if existing is not None:
            learner.version = existing.version + 1
        self._learners[key] = learner
        self.launches += 1
        if ends_at is not None:
            self._push(ends_at, key, learner.version)
        return handle

    def signal_halt(self, handle: Handle) -> None:
        learner = self._find(handle)
        if learner is None or learner.result is not None or learner.killed:
            return
        if learner.script.ignore_halt or learner.halt_at is not None:
            return
        learner.halt_at = self._now + learner.script.halt_s
        if learner.halted:
            learner.version += 1
            self._push(learner.halt_at, _key(handle), learner.version)

    def kill(self, handle: Handle) -> None:
        learner = self._find(handle)
        if learner is None or learner.result is not None or learner.killed:
            return
        learner.killed = True
        learner.version += 1

    def poll(self, handle: Handle) -> PollResult:
        learner = self._find(handle)
        if learner is None or learner.killed:
            return PollResult(LearnerState.MISSING)
        result = learner.result
        ends_at = learner.ends_at
        if result is None and ends_at is not None and ends_at <= self._now:
            # Due now but not yet collected by ``advance``, which will still report it.
            result = self._final_result(learner, ends_at)
        if result is None:
            return PollResult(LearnerState.RUNNING)
        return PollResult(LearnerState.EXITED, dict(result))

    def problem(self) -> str | None:
        return None  # an in-memory cluster is always reachable

    def learner_limits(self) -> dict[str, object]:
        return {"memory": "none", "detail": "the fake backend starts no processes"}

    def close(self) -> None:
        pass

    # -- inspection --------------------------------------------------------------------

    def running(self) -> list[Handle]:
        """Handles of the learners that are alive now, in launch order."""
        return [
            learner.handle
            for learner in self._learners.values()
            if learner.result is None and not learner.killed
        ]

    def request_of(self, handle: Handle) -> LaunchRequest | None:
        """What a learner was launched with (node, GPU ids, spec), or None if unknown."""
        learner = self._find(handle)
        return None if learner is None else learner.request

    # -- internals ---------------------------------------------------------------------

    def _find(self, handle: Handle) -> _Learner | None:
        try:
            return self._learners.get(_key(handle))
        except (KeyError, TypeError, ValueError):
            return None

    def _push(self, at: float, key: _Key, version: int) -> None:
        heapq.heappush(self._due, (at, next(self._sequence), key, version))

    @staticmethod
    def _final_result(learner: _Learner, at: float) -> dict[str, Any]:
        """The result a controller leaves: halted, completed, or failed with C201."""
        if learner.halted:
            return {"status": LearnerStatus.HALTED.value, "exit_code": None, "time": at}
        code = learner.script.exit_code
        if code == 0:
            return {"status": LearnerStatus.COMPLETED.value, "exit_code": 0, "time": at}
        return {
            "status": LearnerStatus.FAILED.value,
            "exit_code": code,
            "error_code": ErrorCode.LEARNER_CRASHED.value,
            "reason": f"user command exited with code {code}",
            "time": at,
        }


def _key(handle: Handle) -> _Key:
    return (str(handle["training_id"]), int(handle["learner"]), int(handle["attempt"]))
