"""Looking ahead in time: the head job's reservation and every queued job's ETA.

Owns two projections from expected end times (a running job ends at ``started_at +
expected_duration_s``, else ``+ typical_duration_s``, else at an unknown time):

- ``reserve``: the earliest time the blocked head of the queue fits, found by releasing
  running jobs node by node in order of expected end and placing the head exactly (same
  placement rules as a start) after each release; plus, per node, what is left at that
  time once the head has its share (the *shadow*), which backfill must not eat into.
- ``QueueSimulation``: ETAs for the whole queue in O(n log n). The cluster is one pool of
  GPUs, CPUs and memory; expected ends release into it and queued jobs take from it in queue
  order, each no earlier than the one ahead, holding it for their expected duration.
  Fragmentation, locality and GPU types are ignored, so an ETA is an estimate.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from ffdl.core.resources import Resources
from ffdl.scheduler.free import CPU_EPSILON, CapacityView, FreeState, NodeFree
from ffdl.scheduler.placement import Choice, find_nodes, may_fit
from ffdl.scheduler.snapshot import QueuedJob


@dataclass(frozen=True, slots=True)
class Release:
    """Resources a job gives back per node when it ends (``at`` None: end unknown)."""

    job_id: str
    at: float | None
    usage: tuple[tuple[str, Resources], ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    """When and where the blocked head of the queue is expected to start."""

    job_id: str
    at: float | None  # None: no known end time makes room
    choice: tuple[tuple[str, int], ...] = ()
    waiting_for: tuple[str, ...] = ()


def _copy_view(state: FreeState) -> CapacityView:
    return CapacityView(
        {
            name: NodeFree(item.node, item.gpus, item.cpus, item.memory_mb)
            for name, item in state.free.items()
        }
    )


def _could_fit(view: CapacityView, job: QueuedJob) -> bool:
    if job.same_label is not None:
        return any(may_fit(pool, job) for pool in view.label_groups(job.same_label).values())
    pool = view.pool_for(job.gpu_type)
    return pool is not None and may_fit(pool, job)


def reserve(
    job: QueuedJob,
    policy: str,
    state: FreeState,
    releases: Sequence[Release],
    now: float,
) -> tuple[Reservation, dict[str, Resources]]:
    """The head's reservation and the shadow: per node, what is free at the reserved time
    after the head's share (empty when the time is unknown)."""
    timed = sorted((max(r.at, now), r.job_id, r) for r in releases if r.at is not None and r.usage)
    view = _copy_view(state)
    index = 0
    while index < len(timed):
        at = timed[index][0]
        ended: list[str] = []
        while index < len(timed) and timed[index][0] == at:
            release = timed[index][2]
            for name, amount in release.usage:
                if name in view.free:
                    view.add(name, amount)
            ended.append(release.job_id)
            index += 1
        if not _could_fit(view, job):
            continue
        choice = find_nodes(view, job, policy)
        if choice is None:
            continue
        for name, count in choice:
            view.subtract(name, job.per_learner.scaled(count))
        shadow = {name: item.resources for name, item in view.free.items() if item.node.schedulable}
        return Reservation(job.id, at, tuple(choice), tuple(ended)), shadow
    return Reservation(job.id, None), {}


def backfill_view(state: FreeState, shadow: dict[str, Resources]) -> CapacityView:
    """What a job running past the reservation may use: per node, the lesser of what is
    free now and what the shadow leaves."""
    return CapacityView(
        {name: _lesser(item, shadow.get(name, item.resources)) for name, item in state.free.items()}
    )


def _lesser(item: NodeFree, limit: Resources) -> NodeFree:
    return NodeFree(
        item.node,
        min(item.gpus, limit.gpus),
        min(item.cpus, limit.cpus),
        min(item.memory_mb, limit.memory_mb),
    )


def refresh_backfill_node(
    view: CapacityView, state: FreeState, shadow: dict[str, Resources], name: str
) -> None:
    lesser = _lesser(state.free[name], shadow.get(name, state.free[name].resources))
    view.set_free(name, lesser.gpus, lesser.cpus, lesser.memory_mb)


def choice_usage(job: QueuedJob, choice: Choice) -> tuple[tuple[str, Resources], ...]:
    return tuple((name, job.per_learner.scaled(count)) for name, count in choice)


# ---------------------------------------------------------------------------------------
# ETAs

ETA_FROM_EXPECTED = "estimated from the expected end of running jobs and of jobs ahead"
ETA_WITH_TYPICAL = ETA_FROM_EXPECTED + " (typical run time assumed where none is given)"
UNKNOWN_RUNNING = "running jobs have no expected duration"
UNKNOWN_AHEAD = "jobs ahead in the queue have no expected duration"
UNKNOWN_BOTH = "running jobs and jobs ahead in the queue have no expected duration"
TOO_SMALL = "the schedulable nodes are too small for it"


class QueueSimulation:
    """The pooled cluster over time, admitting queued jobs in queue order."""

    def __init__(self, now: float, free: Resources, typical_used: bool) -> None:
        self.now = now
        self.clock = now
        self._gpus, self._cpus, self._memory = free.gpus, free.cpus, free.memory_mb
        self._events: list[tuple[float, int, int, float, int]] = []
        self._pending = [0, 0.0, 0]
        self._forever_running = False
        self._forever_ahead = False
        self._typical_used = typical_used
        self._sequence = 0

    def hold(self, amount: Resources, until: float | None, *, running: bool) -> None:
        """Something already holding resources, released at ``until`` (None: never known)."""
        if until is None:
            if running:
                self._forever_running = True
            else:
                self._forever_ahead = True
            return
        self._sequence += 1
        event = (max(until, self.now), self._sequence, amount.gpus, amount.cpus, amount.memory_mb)
        heapq.heappush(self._events, event)
        self._pending[0] += amount.gpus
        self._pending[1] += amount.cpus
        self._pending[2] += amount.memory_mb

    def release_now(self, amount: Resources) -> None:
        self._gpus += amount.gpus
        self._cpus += amount.cpus
        self._memory += amount.memory_mb

    def _fits(self, need: Resources) -> bool:
        return (
            need.gpus <= self._gpus
            and need.cpus <= self._cpus + CPU_EPSILON
            and need.memory_mb <= self._memory
        )

    def _pop(self) -> float:
        at, _seq, gpus, cpus, memory = heapq.heappop(self._events)
        self._gpus += gpus
        self._cpus += cpus
        self._memory += memory
        self._pending[0] -= gpus
        self._pending[1] -= cpus
        self._pending[2] -= memory
        return at

    def admit(
        self, need: Resources, duration: float | None, not_before: float | None = None
    ) -> tuple[float | None, str]:
        """Seconds from now until ``need`` could start, or None with the reason."""
        if (
            need.gpus > self._gpus + self._pending[0]
            or need.cpus > self._cpus + self._pending[1] + CPU_EPSILON
            or need.memory_mb > self._memory + self._pending[2]
        ):
            if self._forever_running and self._forever_ahead:
                return None, UNKNOWN_BOTH
            if self._forever_running:
                return None, UNKNOWN_RUNNING
            if self._forever_ahead:
                return None, UNKNOWN_AHEAD
            return None, TOO_SMALL
        at = self.clock if not_before is None else max(self.clock, not_before)
        while self._events and self._events[0][0] <= at:
            self._pop()
        while not self._fits(need):
            at = self._pop()
        self.clock = at
        self._gpus -= need.gpus
        self._cpus -= need.cpus
        self._memory -= need.memory_mb
        self.hold(need, None if duration is None else at + duration, running=False)
        return at - self.now, ETA_WITH_TYPICAL if self._typical_used else ETA_FROM_EXPECTED
