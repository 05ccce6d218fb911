"""A backend double for the loops' tests: the fake backend, with troubles a test turns on.

``TroubledBackend`` keeps every rule of the ``Backend`` protocol (it delegates to a real
``FakeBackend``) and adds what a remote backend such as Ray can do to the loops: report a
problem that keeps any learner from starting, be unreachable for a while
(``BackendUnavailable`` from some or all calls), bind other GPU ids than the placement's,
lose a learner with a reason (its node died), and take long to launch (each launch waits
until a given number are under way at once).
"""

from __future__ import annotations

import threading
from collections import Counter

from ffdl.backends.base import (
    BackendUnavailable,
    Handle,
    LaunchRequest,
    LearnerState,
    PollResult,
)
from ffdl.backends.fake import FakeBackend
from ffdl.core.resources import Node

_Key = tuple[str, int]  # (training id, learner)


class TroubledBackend:
    name = "troubled"

    def __init__(self, nodes: list[Node]) -> None:
        self.inner = FakeBackend(nodes)
        # What ``problem`` answers; None: all is well.
        self.trouble: str | None = None
        # Set: every call raises BackendUnavailable with this message.
        self.unreachable: str | None = None
        # The next this-many launches raise BackendUnavailable (after the ones that succeed).
        self.failing_launches = 0
        # Launches that succeed from this many on fail (None: never), to cut a gang in two.
        self.launches_before_failing: int | None = None
        # (training id, learner) -> GPU ids the backend "bound", put in the handle.
        self.bound: dict[_Key, list[int]] = {}
        # (training id, learner) -> why it is gone: poll answers MISSING with that reason.
        self.lost: dict[_Key, str] = {}
        self.launched: Counter[_Key] = Counter()
        self.requests: list[LaunchRequest] = []
        self.closed = False
        # Set: each launch waits here until the barrier's number of launches are under way.
        self.launch_barrier: threading.Barrier | None = None
        self._lock = threading.Lock()

    def _reachable(self) -> None:
        if self.unreachable is not None:
            raise BackendUnavailable(self.unreachable)

    def nodes(self) -> list[Node]:
        self._reachable()
        return self.inner.nodes()

    def launch(self, request: LaunchRequest) -> Handle:
        self._reachable()
        if self.launch_barrier is not None:
            self.launch_barrier.wait()
        with self._lock:
            return self._launch(request)

    def _launch(self, request: LaunchRequest) -> Handle:
        if self.launches_before_failing is not None and (
            sum(self.launched.values()) >= self.launches_before_failing
        ):
            self.launches_before_failing = None
            self.failing_launches = max(self.failing_launches, 1)
        if self.failing_launches > 0:
            self.failing_launches -= 1
            raise BackendUnavailable("Ray cluster unreachable at 127.0.0.1:1")
        key = (request.spec.training_id, request.spec.learner)
        before = self.inner.launches
        handle = dict(self.inner.launch(request))
        if self.inner.launches > before:
            self.launched[key] += 1
        self.requests.append(request)
        if key in self.bound:
            handle["gpu_ids"] = list(self.bound[key])
        return handle

    def signal_halt(self, handle: Handle) -> None:
        self._reachable()
        self.inner.signal_halt(handle)

    def kill(self, handle: Handle) -> None:
        self._reachable()
        self.inner.kill(handle)

    def poll(self, handle: Handle) -> PollResult:
        self._reachable()
        reason = self.lost.get((str(handle["training_id"]), int(handle["learner"])))
        if reason is not None:
            return PollResult(LearnerState.MISSING, reason=reason)
        return self.inner.poll(handle)

    def problem(self) -> str | None:
        return self.trouble

    def learner_limits(self) -> dict[str, object]:
        return self.inner.learner_limits()

    def close(self) -> None:
        self.closed = True
