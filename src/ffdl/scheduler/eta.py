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
from typing import NamedTuple

from ffdl.core.resources import Resources
from ffdl.scheduler.free import CPU_EPSILON, CapacityView, FreeState, NodeFree
from ffdl.scheduler.placement import Choice, find_nodes, may_fit
from ffdl.scheduler.snapshot import QueuedJob


class Release(NamedTuple):
    """Resources a job gives back per node when it ends (``at`` None: end unknown).

    A tuple, since a pass makes one per running job."""

    job_id: str
    at: float | None
    usage: tuple[tuple[str, Resources], ...]

    @staticmethod
    def of(job_id: str, per: Resources, at: float | None, nodes: list[str]) -> Release:
        """The release of learners needing ``per`` each, one per entry of ``nodes``."""
        counts: dict[str, int] = {}
        for name in nodes:
            counts[name] = counts.get(name, 0) + 1
        usage = tuple((name, per if n == 1 else per.scaled(n)) for name, n in counts.items())
        return Release(job_id, at, usage)


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
    timed = sorted(
        ((max(r.at, now), r.job_id, i, r) for i, r in enumerate(releases) if r.at is not None),
        key=lambda entry: entry[:3],
    )
    view = _copy_view(state)
    index = 0
    while index < len(timed):
        at = timed[index][0]
        ended: list[str] = []
        while index < len(timed) and timed[index][0] == at:
            release = timed[index][3]
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


class BackfillLimits:
    """What jobs behind a blocked head may use, as views that placement reads directly.

    ``short`` is what is free now; ``long`` (once a reservation time is known) is, per node,
    the lesser of what is free now and what the shadow leaves, for jobs that would still run
    at the reserved time. Fenced nodes (those a blocker with no known time, or an aged job,
    could use) read as empty in both, so pool totals reject jobs without scanning nodes.
    """

    def __init__(self, state: FreeState) -> None:
        self.state = state
        self.fenced: set[str] = set()
        self.shadow: dict[str, Resources] = {}
        self._short: CapacityView | None = None  # the state itself until a node is fenced
        self.long: CapacityView | None = None

    def set_shadow(self, shadow: dict[str, Resources]) -> None:
        self.shadow = shadow
        self.long = CapacityView(
            {name: self._long_free(name, item) for name, item in self.state.free.items()}
        )

    def _long_free(self, name: str, item: NodeFree) -> NodeFree:
        if name in self.fenced:
            return NodeFree(item.node, 0, 0.0, 0)
        limit = self.shadow.get(name)
        if limit is None:
            return NodeFree(item.node, item.gpus, item.cpus, item.memory_mb)
        return NodeFree(
            item.node,
            min(item.gpus, limit.gpus),
            min(item.cpus, limit.cpus),
            min(item.memory_mb, limit.memory_mb),
        )

    def view_for(self, short: bool) -> CapacityView:
        if short or self.long is None:
            return self.state if self._short is None else self._short
        return self.long

    def fence(self, names: set[str]) -> int:
        """Fence more nodes; returns how many nodes are fenced now."""
        new = names - self.fenced
        self.fenced |= new
        if new and self._short is None:
            self._short = _copy_view(self.state)
        for name in new:
            self._refresh(name)
        return len(self.fenced)

    def started(self, job: QueuedJob, choice: Choice, *, past_reservation: bool) -> None:
        """Follow a start on the state: it takes from the shadow if it runs past the time."""
        for name, count in choice:
            if past_reservation and name in self.shadow:
                self.shadow[name] = self.shadow[name] - job.per_learner.scaled(count)
            self._refresh(name)

    def _refresh(self, name: str) -> None:
        item = self.state.free[name]
        if self._short is not None:
            if name in self.fenced:
                self._short.set_free(name, 0, 0.0, 0)
            else:
                self._short.set_free(name, item.gpus, item.cpus, item.memory_mb)
        if self.long is not None:
            limited = self._long_free(name, item)
            self.long.set_free(name, limited.gpus, limited.cpus, limited.memory_mb)


def choice_usage(job: QueuedJob, choice: Choice) -> tuple[tuple[str, Resources], ...]:
    return tuple((name, job.per_learner.scaled(count)) for name, count in choice)


def duration_words(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 1:
        return "under 1 min"
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def reservation_words(reservation: Reservation, now: float) -> str:
    if reservation.at is None:
        return "no running job it waits for has an expected end"
    names = reservation.waiting_for
    who = names[0]
    if len(names) > 1:
        who += f" and {len(names) - 1} other job" + ("" if len(names) == 2 else "s")
    when = duration_words(reservation.at - now)
    return f"reserved: waiting for {who} to finish (expected in {when})"


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

    __slots__ = (
        "_cpus",
        "_estimate",
        "_events",
        "_forever_ahead",
        "_forever_running",
        "_gpus",
        "_later_cpus",
        "_later_gpus",
        "_later_memory",
        "_memory",
        "_sequence",
        "clock",
        "now",
    )

    def __init__(self, now: float, free: Resources, typical_used: bool) -> None:
        self.now = now
        self.clock = now
        self._gpus, self._cpus, self._memory = free.gpus, free.cpus, free.memory_mb
        # Released later (by known end times): the pool can grow at most by this much.
        self._later_gpus, self._later_cpus, self._later_memory = 0, 0.0, 0
        self._events: list[tuple[float, int, int, float, int]] = []
        self._forever_running = False
        self._forever_ahead = False
        self._estimate = ETA_WITH_TYPICAL if typical_used else ETA_FROM_EXPECTED
        self._sequence = 0

    def hold_learners(self, per: Resources, learners: int, until: float | None) -> None:
        """Learners already holding resources, released at ``until`` (None: end unknown)."""
        self._hold(per.gpus * learners, per.cpus * learners, per.memory_mb * learners, until, True)

    def _hold(
        self, gpus: int, cpus: float, memory: int, until: float | None, running: bool
    ) -> None:
        if until is None:
            if running:
                self._forever_running = True
            else:
                self._forever_ahead = True
            return
        self._sequence += 1
        heapq.heappush(self._events, (max(until, self.now), self._sequence, gpus, cpus, memory))
        self._later_gpus += gpus
        self._later_cpus += cpus
        self._later_memory += memory

    def release_now(self, amount: Resources) -> None:
        self._gpus += amount.gpus
        self._cpus += amount.cpus
        self._memory += amount.memory_mb

    def _never_reason(self) -> str:
        if self._forever_running and self._forever_ahead:
            return UNKNOWN_BOTH
        if self._forever_running:
            return UNKNOWN_RUNNING
        if self._forever_ahead:
            return UNKNOWN_AHEAD
        return TOO_SMALL

    def admit(
        self, job: QueuedJob, duration: float | None, not_before: float | None = None
    ) -> tuple[float | None, str]:
        """Seconds from now until ``job`` could start, or None with the reason."""
        # Called once per waiting job: state is read into locals and written back once.
        per, learners = job.per_learner, job.learners
        gpus, cpus, memory = per.gpus * learners, per.cpus * learners, per.memory_mb * learners
        free_gpus, free_cpus, free_memory = self._gpus, self._cpus, self._memory
        later_gpus, later_cpus, later_memory = (
            self._later_gpus,
            self._later_cpus,
            self._later_memory,
        )
        if (
            gpus > free_gpus + later_gpus
            or cpus > free_cpus + later_cpus + CPU_EPSILON
            or memory > free_memory + later_memory
        ):
            return None, self._never_reason()
        at = self.clock if not_before is None or not_before < self.clock else not_before
        events = self._events
        # Take every release due by then, and further releases until the job fits.
        while events and (
            events[0][0] <= at
            or gpus > free_gpus
            or cpus > free_cpus + CPU_EPSILON
            or memory > free_memory
        ):
            when, _seq, more_gpus, more_cpus, more_memory = heapq.heappop(events)
            free_gpus += more_gpus
            free_cpus += more_cpus
            free_memory += more_memory
            later_gpus -= more_gpus
            later_cpus -= more_cpus
            later_memory -= more_memory
            if when > at:
                at = when
        self.clock = at
        if duration is None:
            self._forever_ahead = True
        else:
            self._sequence += 1
            heapq.heappush(events, (at + duration, self._sequence, gpus, cpus, memory))
            later_gpus += gpus
            later_cpus += cpus
            later_memory += memory
        self._gpus, self._cpus, self._memory = (
            free_gpus - gpus,
            free_cpus - cpus,
            free_memory - memory,
        )
        self._later_gpus, self._later_cpus, self._later_memory = (
            later_gpus,
            later_cpus,
            later_memory,
        )
        return at - self.now, self._estimate


class PooledEstimates:
    """One ``QueueSimulation`` per GPU type asked for (None: the whole cluster), built on
    first use from what holds resources: (per learner, expected end, the learners' nodes)."""

    def __init__(
        self,
        now: float,
        view: CapacityView,
        holding: list[tuple[Resources, float | None, list[str]]],
        handed_back: list[tuple[str, Resources]],
        typical_used: bool,
    ) -> None:
        self.now = now
        self.view = view
        self.node_type = {name: view.free[name].node.gpu_type for name in view.all.names}
        self.holding: list[tuple[Resources, float | None, dict[str, int]]] = []
        for per, end, nodes in holding:
            by_type: dict[str, int] = {}
            for name in nodes:
                kind = self.node_type.get(name)
                if kind is not None:
                    by_type[kind] = by_type.get(kind, 0) + 1
            if by_type:
                self.holding.append((per, end, by_type))
        self.handed_back = [(n, r) for n, r in handed_back if n in self.node_type]
        self.typical_used = typical_used
        self._sims: dict[str | None, QueueSimulation] = {}

    def for_type(self, gpu_type: str | None) -> QueueSimulation:
        sim = self._sims.get(gpu_type)
        if sim is None:
            sim = self._sims[gpu_type] = self._build(gpu_type)
        return sim

    def _build(self, gpu_type: str | None) -> QueueSimulation:
        gpus, cpus, memory = 0, 0.0, 0
        for name, kind in self.node_type.items():
            if gpu_type is None or kind == gpu_type:
                item = self.view.free[name]
                gpus += max(item.gpus, 0)
                cpus += max(item.cpus, 0.0)
                memory += max(item.memory_mb, 0)
        sim = QueueSimulation(self.now, Resources(gpus, cpus, memory), self.typical_used)
        for per, end, by_type in self.holding:
            count = sum(by_type.values()) if gpu_type is None else by_type.get(gpu_type, 0)
            if count:
                sim.hold_learners(per, count, end)
        for name, left in self.handed_back:
            if gpu_type is None or self.node_type[name] == gpu_type:
                sim.release_now(left)
        return sim
