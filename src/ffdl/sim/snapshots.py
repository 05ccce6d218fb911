"""Building the scheduler's ``Snapshot`` from the engine's state, with exact reductions.

The snapshot holds what the live scheduler loop would put in it: queued jobs (priority,
submission time, shape, expected duration) and running jobs (placement, start, expected
duration). A scheduling pass costs time in proportion to the queue and to the running jobs,
and the simulator makes hundreds of thousands of passes, so by default (``reductions``) it
leaves out what provably cannot change a start or a preemption. The waiting reasons and ETAs
the scheduler also computes are not used by the simulator, so they may differ.

Queue window (every policy). Free capacity only shrinks during a pass (preempted resources
are not reused in the same pass), so a queued job whose total GPUs, CPUs or memory exceed
what is free can neither start nor let a later job start in its place. Such jobs are left
out, except the ones that can still change the pass:

- with backfill off and preemption off (FIFO), the pass starts the longest prefix of the
  queue that fits, so the window is the prefix before the first job whose cumulative
  demand exceeds what is free;
- otherwise, every job that fits what is free is kept; of the others, the leading run that
  could still be the head (each one up to and including the first that has no
  lower-priority job to preempt), and the first that has waited past the aging threshold
  of every shape, since its fence keeps backfill off the nodes it could use (a second of
  the same shape would fence the same nodes).

Node subset (FIFO on a cluster of identical, unlabelled nodes, every queued job using GPUs).
Nodes without a free GPU cannot take a learner, and the placement rules take nodes with
equal free GPUs in cluster order; so the snapshot keeps the nodes with some free GPUs, all of
the partly used ones, the first ``k`` entirely free ones (``k`` = learners in the window + 1,
enough for every learner to get its own), and the running jobs on those nodes. The subset
is used only when no job in the window would be judged unplaceable on it.

Optimistic subset (every other policy). With backfill or preemption a job that does not fit
makes the scheduler look at every running job (the head's reservation, victims), so the
subset is exact only for passes in which every job of the window starts: each start is then
the same placement on the subset as on the whole cluster, by the argument above. When the
window's total demand fits what is free, the pass is first made on the subset; if any job
of the window does not start, it is made again on the whole cluster and only that one counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ffdl.core.resources import Node
from ffdl.scheduler.free import slots_for
from ffdl.scheduler.queue import DEFAULT_AGING_THRESHOLD_S, has_aged
from ffdl.scheduler.snapshot import RunningJob, Snapshot

if TYPE_CHECKING:
    from ffdl.sim.jobs import JobRecord
    from ffdl.sim.state import SimState

_CPU_EPSILON = 1e-9


def running_views(sim: SimState) -> tuple[RunningJob, ...]:
    return tuple(r.running_view for r in sim.running.values() if r.running_view is not None)


@dataclass(frozen=True, slots=True)
class PassInput:
    """A snapshot for one pass. ``optimistic``: built on a node subset whose decisions hold
    only if every job in it starts; otherwise the pass must be redone on ``full()``."""

    snapshot: Snapshot
    window: list[JobRecord]
    optimistic: bool = False

    def full(self, sim: SimState) -> Snapshot:
        return Snapshot(
            now=self.snapshot.now,
            nodes=sim.nodes,
            queued=self.snapshot.queued,
            running=running_views(sim),
            default_placement=self.snapshot.default_placement,
        )


def build_snapshot(
    sim: SimState,
    records: Sequence[JobRecord],
    *,
    backfill: bool,
    preemption: bool,
    placement: str,
) -> PassInput | None:
    """The snapshot for a pass over ``records`` (queue order); None when no job in it could
    start or preempt."""
    if not records:
        return None
    nodes: tuple[Node, ...] = sim.nodes
    running: tuple[RunningJob, ...] | None = None
    optimistic = False
    if not sim.config.reductions:
        window = list(records)
    elif not backfill and not preemption:
        window = _prefix_window(sim, records)
        subset = _node_subset(sim, window)
        if subset is not None:
            nodes, running = subset
    else:
        window = _general_window(sim, records, backfill=backfill, preemption=preemption)
        # When every job in the window fits what is free, the pass is most likely to start
        # them all; that outcome is the same on the node subset (see the module docstring).
        if window and _fit_totals(sim, window):
            subset = _node_subset(sim, window)
            if subset is not None:
                nodes, running = subset
                optimistic = True
    if not window:
        return None
    snapshot = Snapshot(
        now=sim.now,
        nodes=nodes,
        queued=tuple(sim.queued_view(r) for r in window),
        running=running_views(sim) if running is None else running,
        default_placement=placement,
    )
    return PassInput(snapshot, window, optimistic)


def _fit_totals(sim: SimState, window: Sequence[JobRecord]) -> bool:
    gpus, cpus, memory = sim.free_totals
    for record in window:
        total = sim.queued_view(record).total
        gpus -= total.gpus
        cpus -= total.cpus
        memory -= total.memory_mb
    return gpus >= 0 and cpus >= -_CPU_EPSILON and memory >= 0


def _prefix_window(sim: SimState, records: Sequence[JobRecord]) -> list[JobRecord]:
    gpus, cpus, memory = sim.free_totals
    window = []
    for record in records:
        total = sim.queued_view(record).total
        gpus -= total.gpus
        cpus -= total.cpus
        memory -= total.memory_mb
        if gpus < 0 or cpus < -_CPU_EPSILON or memory < 0:
            break
        window.append(record)
    return window


def _general_window(
    sim: SimState, records: Sequence[JobRecord], *, backfill: bool, preemption: bool
) -> list[JobRecord]:
    gpus, cpus, memory = sim.free_totals
    lowest_running = min(
        (
            r.running_view.priority
            for r in sim.running.values()
            if r.running_view is not None and r.running_view.preemptible
        ),
        default=None,
    )
    window = []
    may_be_head = True
    aged_shapes: set[tuple[object, ...]] = set()
    for record in records:
        view = sim.queued_view(record)
        total = view.total
        if total.gpus <= gpus and total.cpus <= cpus + _CPU_EPSILON and total.memory_mb <= memory:
            window.append(record)
            continue
        if may_be_head:
            window.append(record)
            can_preempt = (
                preemption and lowest_running is not None and view.priority > lowest_running
            )
            may_be_head = can_preempt
            continue
        if backfill and has_aged(view, sim.now, DEFAULT_AGING_THRESHOLD_S):
            shape = (
                view.per_learner,
                view.learners,
                view.gpu_types,
                view.mix_gpu_types,
                view.same_label,
            )
            if shape not in aged_shapes:
                aged_shapes.add(shape)
                window.append(record)
    return window


def _uniform(sim: SimState) -> bool:
    cached = sim.cache.get("uniform")
    if cached is None:
        first = sim.nodes[0]
        cached = all(
            n.schedulable
            and not n.labels
            and (n.gpus, n.cpus, n.memory_mb, n.gpu_type)
            == (first.gpus, first.cpus, first.memory_mb, first.gpu_type)
            for n in sim.nodes
        )
        sim.cache["uniform"] = cached
    return bool(cached)


def _node_subset(
    sim: SimState, window: Sequence[JobRecord]
) -> tuple[tuple[Node, ...], tuple[RunningJob, ...]] | None:
    if not window or not _uniform(sim):
        return None
    views = [sim.queued_view(r) for r in window]
    if any(v.per_learner.gpus == 0 or v.gpu_types or v.same_label for v in views):
        return None
    # A pass places fewer learners than this, so it never gets past the first this many
    # proportional nodes of a level: they all offer the same learner slots.
    kept = sim.free_index.subset(sum(v.learners for v in views) + 1)
    if len(kept) == len(sim.nodes):
        return None
    # On identical nodes a job is unplaceable on the subset only if its learners outnumber
    # the subset's learner slots when empty; the full scheduler would not say so.
    first = sim.nodes[0]
    for view in views:
        per = view.per_learner
        if slots_for(first.gpus, first.cpus, first.memory_mb, per) * len(kept) < view.learners:
            return None
    job_ids: dict[str, None] = {}
    for node in kept:
        job_ids.update(sim.node_jobs[node.name])
    running = tuple(
        view
        for view in (sim.records[job_id].running_view for job_id in job_ids)
        if view is not None
    )
    return tuple(kept), running
