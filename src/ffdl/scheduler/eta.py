"""Looking ahead in time: the head job's reservation and every queued job's ETA.

Owns two projections from expected end times (a running job ends when its reported progress
says, ``estimated_end_at``; else at ``started_at + expected_duration_s``, else
``+ typical_duration_s``, else at an unknown time):

- ``reserve``: the earliest time the blocked head of the queue fits, found by releasing
  running jobs node by node in order of expected end and, at each end time, placing the
  head exactly (same placement rules as a start); plus, per node, what is left at that
  time once the head has its share (the *shadow*), which backfill must not eat into.
- ``QueueSimulation``: ETAs for the whole queue in O(n log n). The cluster is one pool of
  GPUs, CPUs and memory; expected ends release into it and queued jobs take from it in queue
  order, each no earlier than the one ahead, holding it for their expected duration.
  Fragmentation, locality and GPU types are ignored, so an ETA is an estimate.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

from ffdl.core.resources import Resources
from ffdl.scheduler.free import CPU_EPSILON, CapacityView, FreeState, NodeFree
from ffdl.scheduler.placement import Choice, find_nodes, may_fit
from ffdl.scheduler.snapshot import QueuedJob

# What holds resources and when it gives them back: (job id, per learner, expected end or
# None when unknown, the node of each learner).
Holding = tuple[str, Resources, float | None, Sequence[str]]


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
    pool = view.pool_for(job.gpu_types)
    return pool is not None and may_fit(pool, job)


def reserve(
    job: QueuedJob,
    policy: str,
    state: FreeState,
    holding: Iterable[Holding],
    now: float,
) -> tuple[Reservation, dict[str, NodeFree]]:
    """The head's reservation and the shadow: per node, what is free at the reserved time
    after the head's share (empty when the time is unknown)."""
    timed = sorted(
        (
            (end if end > now else now, job_id, index, per, nodes)
            for index, (job_id, per, end, nodes) in enumerate(holding)
            if end is not None
        ),
        key=itemgetter(0, 1, 2),
    )
    free = {
        name: NodeFree(item.node, item.gpus, item.cpus, item.memory_mb)
        for name, item in state.free.items()
    }
    usable = {
        name
        for name, item in free.items()
        if item.node.schedulable and job.accepts(item.node.gpu_type)
    }
    # Until the head could fit by totals alone, releases only update counts; the indexed
    # view is built once they could (most releases of a long list are then never indexed).
    need = job.per_learner.scaled(job.learners)
    totals = [0, 0.0, 0]
    for name in usable:
        item = free[name]
        totals[0] += max(item.gpus, 0)
        totals[1] += max(item.cpus, 0.0)
        totals[2] += max(item.memory_mb, 0)
    view: CapacityView | None = None
    ended: list[tuple[str, Sequence[str]]] = []  # released so far, in order of end
    index = 0
    while index < len(timed):
        at = timed[index][0]
        while index < len(timed) and timed[index][0] == at:
            _at, job_id, _order, per, nodes = timed[index]
            for name in nodes:
                if name not in free:
                    continue
                if view is not None:
                    view.add(name, per)
                    continue
                item = free[name]
                item.gpus += per.gpus
                item.cpus += per.cpus
                item.memory_mb += per.memory_mb
                if name in usable:
                    totals[0] += per.gpus
                    totals[1] += per.cpus
                    totals[2] += per.memory_mb
            ended.append((job_id, nodes))
            index += 1
        if view is None:
            if not need.fits_in(Resources(int(totals[0]), totals[1], int(totals[2]))):
                continue
            view = CapacityView(free)
        if not _could_fit(view, job):
            continue
        choice = find_nodes(view, job, policy)
        if choice is None:
            continue
        for name, count in choice:
            view.subtract(name, job.per_learner.scaled(count))
        shadow = {name: item for name, item in free.items() if item.node.schedulable}
        # What the head waits for: the jobs ending on its nodes, the last to end first.
        nodes_used = {name for name, _count in choice}
        waiting_for = tuple(
            job_id for job_id, nodes in reversed(ended) if not nodes_used.isdisjoint(nodes)
        )
        return Reservation(job.id, at, tuple(choice), waiting_for), shadow
    return Reservation(job.id, None), {}


class BackfillLimits:
    """What jobs behind a blocked head may use, as views that placement reads directly.

    Jobs expected to end before the reserved time see what is free now (the state itself
    until a node is fenced); the others see ``long``: per node, the lesser of what is free
    now and what the shadow leaves. Fenced nodes (those a blocker with no known time, or an
    aged job, could use) read as empty in both, so pool totals reject jobs without scanning
    nodes.
    """

    def __init__(self, state: FreeState) -> None:
        self.state = state
        self.fenced: set[str] = set()
        self.shadow: dict[str, NodeFree] = {}
        self._short: CapacityView | None = None  # the state itself until a node is fenced
        self.long: CapacityView | None = None

    def set_shadow(self, shadow: dict[str, NodeFree]) -> None:
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

    def fence(self, names: set[str]) -> None:
        """Keep every later job off these nodes."""
        new = names - self.fenced
        self.fenced |= new
        if new and self._short is None:
            self._short = _copy_view(self.state)
        for name in new:
            self._refresh(name)

    def started(self, job: QueuedJob, choice: Choice, *, past_reservation: bool) -> None:
        """Follow a start on the state: it takes from the shadow if it runs past the time."""
        for name, count in choice:
            limit = self.shadow.get(name) if past_reservation else None
            if limit is not None:
                per = job.per_learner
                limit.gpus -= per.gpus * count
                limit.cpus -= per.cpus * count
                limit.memory_mb -= per.memory_mb * count
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
    if not names:
        return "reserved: its room frees up now"
    who = names[0]
    if len(names) > 1:
        who += f" and {len(names) - 1} other job" + ("" if len(names) == 2 else "s")
    if reservation.at <= now:
        past = "its" if len(names) == 1 else "their"
        return f"reserved: waiting for {who} to finish (already past {past} expected end)"
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

    def hold_all(self, holders: Iterable[tuple[Resources, int, float | None]]) -> None:
        """Learners already holding resources: (per learner, how many, expected end, None
        when unknown). Called once, before any ``admit``."""
        events = self._events
        for per, learners, until in holders:
            if until is None:
                self._forever_running = True
                continue
            gpus, cpus, memory = per.gpus * learners, per.cpus * learners, per.memory_mb * learners
            self._sequence += 1
            events.append(
                (until if until > self.now else self.now, self._sequence, gpus, cpus, memory)
            )
            self._later_gpus += gpus
            self._later_cpus += cpus
            self._later_memory += memory
        heapq.heapify(events)

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
        holding: Iterable[tuple[Resources, float | None, Iterable[str]]],
        handed_back: Iterable[tuple[str, Resources]],
        typical_used: bool,
    ) -> None:
        self.now = now
        self.view = view
        self.node_type = {name: view.free[name].node.gpu_type for name in view.all.names}
        # (per learner, learners on schedulable nodes, expected end): in all, and per type
        self.everywhere: list[tuple[Resources, int, float | None]] = []
        self.by_type: dict[str, list[tuple[Resources, int, float | None]]] = {}
        node_type = self.node_type
        for per, end, nodes in holding:
            counts: dict[str, int] = {}
            for name in nodes:
                kind = node_type.get(name)
                if kind is not None:
                    counts[kind] = counts.get(kind, 0) + 1
            if counts:
                self.everywhere.append((per, sum(counts.values()), end))
                for kind, learners in counts.items():
                    self.by_type.setdefault(kind, []).append((per, learners, end))
        self.handed_back = [(n, r) for n, r in handed_back if n in node_type]
        self.typical_used = typical_used
        self._sims: dict[tuple[str, ...], QueueSimulation] = {}

    def for_types(self, gpu_types: tuple[str, ...]) -> QueueSimulation:
        """The queue on the nodes of ``gpu_types`` (all nodes when none are named); a job of
        several types is estimated on all of them together, an optimistic bound for a gang
        that must run on one."""
        sim = self._sims.get(gpu_types)
        if sim is None:
            sim = self._sims[gpu_types] = self._build(gpu_types)
        return sim

    def _build(self, gpu_types: tuple[str, ...]) -> QueueSimulation:
        gpus, cpus, memory = 0, 0.0, 0
        for name, kind in self.node_type.items():
            if not gpu_types or kind in gpu_types:
                item = self.view.free[name]
                gpus += max(item.gpus, 0)
                cpus += max(item.cpus, 0.0)
                memory += max(item.memory_mb, 0)
        sim = QueueSimulation(self.now, Resources(gpus, cpus, memory), self.typical_used)
        sim.hold_all(
            self.everywhere
            if not gpu_types
            else [held for kind in gpu_types for held in self.by_type.get(kind, [])]
        )
        for name, left in self.handed_back:
            if not gpu_types or self.node_type[name] in gpu_types:
                sim.release_now(left)
        return sim
