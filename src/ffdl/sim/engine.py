"""The discrete-event engine: virtual clock, event loop, jobs' progress, and the cluster state.

Owns time and bookkeeping; decisions belong to a policy (any ``ffdl.sim.state.Policy``; the
engine never imports the policies), which reads the state through the ``SimState`` this
engine is and acts through ``start``, ``preempt``, ``rescale``, ``resize`` and ``hold``, as
the live loops act through the store.

Events are job arrivals, learner exits reported by the fake backend (completions, halts),
timer ticks and metric samples. All events at the same virtual time are handled together,
then the policy runs a pass; passes repeat at the same instant while they change something
(e.g. preempted jobs halted at once). A pass is skipped when it cannot decide anything:
nothing changed since the last one and the policy does not depend on time, or nothing waits.
Ticks (every ``tick_s``, on a fixed grid) only happen while something waits and the policy
depends on time.

Progress: a job started with ``g`` GPUs at batch ``b`` on ``n`` nodes works at
``T(g, b, n) * E(b)`` useful samples per second after a start overhead (plus the restart cost
after a preemption or rescale), and finishes when its work is done; its learners are launched
on the fake backend scripted to exit at exactly that time. A preempted job keeps the progress
of its last periodic checkpoint (every ``checkpoint_s`` of productive time); a rescale is a
coordinated checkpoint, so it keeps everything. The run is deterministic: no wall clock, no
unseeded randomness, and every collection is walked in insertion order.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ffdl.backends.fake import FakeBackend, LearnerExit, LearnerScript, fake_request
from ffdl.core.resources import LearnerPlacement, Node, Placement
from ffdl.core.status import LearnerStatus
from ffdl.scheduler.free import NodeFree
from ffdl.scheduler.snapshot import QueuedJob, RunningJob
from ffdl.sim.free_index import FreeIndex
from ffdl.sim.jobs import JobRecord, JobState, SimConfig, SimulationError
from ffdl.sim.metrics import JobOutcome, Series, SimResult, fragmented_gpus
from ffdl.sim.state import FreeSlots, Policy
from ffdl.sim.workload import SimJob

__all__ = ["JobRecord", "JobState", "SimConfig", "SimulationError", "Simulator"]

# Sample count aimed for when the sampling interval is chosen automatically.
_TARGET_SAMPLES = 1500


class Simulator:
    """Runs ``jobs`` on ``nodes`` under ``policy``; ``run()`` returns the measurements."""

    def __init__(
        self,
        nodes: Sequence[Node],
        jobs: Sequence[SimJob],
        policy: Policy,
        config: SimConfig | None = None,
        *,
        label: str = "",
        on_progress: Callable[[float], None] | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("the cluster needs at least one node")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        ids = [j.id for j in jobs]
        if len(set(ids)) != len(ids):
            raise ValueError("job ids must be unique")
        self.nodes = tuple(nodes)
        self.policy = policy
        self.config = config or SimConfig()
        self.label = label or policy.name
        self.backend = FakeBackend(self.nodes)
        self.gpus_per_node = max(n.gpus for n in self.nodes) or 1
        self.total_gpus = sum(n.gpus for n in self.nodes if n.schedulable)
        self.now = 0.0
        self.free = {
            n.name: FreeSlots(n.gpus, n.cpus, n.memory_mb, list(range(n.gpus))) for n in self.nodes
        }
        self._node_of = {n.name: n for n in self.nodes}
        self.free_totals = [
            sum(n.gpus for n in self.nodes if n.schedulable),
            sum(n.cpus for n in self.nodes if n.schedulable),
            sum(n.memory_mb for n in self.nodes if n.schedulable),
        ]
        self.node_jobs: dict[str, dict[str, None]] = {n.name: {} for n in self.nodes}
        gpu_jobs = [j for j in jobs if j.per_learner.gpus > 0]
        self.free_index = FreeIndex(
            self.nodes,
            max((j.per_learner.cpus / j.per_learner.gpus for j in gpu_jobs), default=0.0),
            max((j.per_learner.memory_mb / j.per_learner.gpus for j in gpu_jobs), default=0.0),
        )
        for node in self.nodes:
            self.free_index.update(node.name, node.gpus, node.cpus, node.memory_mb)
        self.records: dict[str, JobRecord] = {}
        self.queue: dict[str, JobRecord] = {}
        self.running: dict[str, JobRecord] = {}  # RUNNING, HALTING and partial gangs
        self._order: list[tuple[Any, str]] = []
        self._arrivals = sorted(jobs, key=lambda j: (j.submit_s, j.id))
        self._origin = self._arrivals[0].submit_s if self._arrivals else 0.0
        self._on_progress = on_progress
        self._dirty = False
        self._last_account = 0.0
        self._held_gpus = 0
        self._running_gpus = 0
        self.held_gpu_seconds = 0.0
        self.running_gpu_seconds = 0.0
        self.series = Series()
        self.cache: dict[str, object] = {}  # per-run memo for policies (cluster facts)
        self.passes = 0
        self.scheduler_calls = 0
        self.autoscale_calls = 0

    # -- reading the state (for policies) ----------------------------------------------

    def queued_in_order(self) -> Iterator[JobRecord]:
        """Queued jobs in the policy's queue order."""
        for _key, job_id in self._order:
            yield self.queue[job_id]

    def node_free(self) -> dict[str, NodeFree]:
        """Free capacity per node, as the scheduler's ``NodeFree`` (a fresh copy)."""
        return {
            name: NodeFree(self._node_of[name], f.gpus, f.cpus, f.memory_mb, list(f.gpu_ids))
            for name, f in self.free.items()
        }

    def queued_view(self, record: JobRecord) -> QueuedJob:
        if record.queued_view is None:
            job = record.job
            record.queued_view = QueuedJob(
                id=job.id,
                tenant=job.tenant,
                priority=self.policy.priority_of(job),
                submitted_at=record.submitted,
                learners=record.learners,
                per_learner=job.per_learner,
                placement_policy=job.placement,
                expected_duration_s=job.expected_duration_s,
            )
        return record.queued_view

    # -- acting (for policies) ---------------------------------------------------------

    def start(self, record: JobRecord, placement: Placement, batch: int | None = None) -> None:
        """Place the whole gang and launch its learners."""
        if record.state != JobState.QUEUED:
            raise SimulationError(f"{record.id} is {record.state}, not queued")
        if len(placement.learners) != record.learners:
            raise SimulationError(
                f"{record.id}: placement has {len(placement.learners)} learners, "
                f"job has {record.learners}"
            )
        for learner in placement.learners:
            self._take(record, learner)
        self._launch(record, placement, batch)

    def hold(self, record: JobRecord, learner: LearnerPlacement) -> None:
        """Place one learner of a gang that is not whole yet; it holds its resources idle."""
        if record.state != JobState.QUEUED:
            raise SimulationError(f"{record.id} is {record.state}, not queued")
        self._take(record, learner)
        record.held.append(learner)
        self.running[record.id] = record
        self._change_held(record.job.per_learner.gpus)
        if len(record.held) == record.learners:
            self._launch(record, Placement(tuple(record.held)), None)

    def preempt(self, record: JobRecord) -> None:
        """Halt a running job for another; it keeps only its last periodic checkpoint."""
        if record.state != JobState.RUNNING:
            return
        productive = max(0.0, self.now - record.productive_from)
        interval = self.config.checkpoint_s
        kept = productive if interval <= 0 else math.floor(productive / interval) * interval
        record.done = min(record.job.work, record.done + record.rate * kept)
        record.preemptions += 1
        self._halt(record, "preempt")

    def rescale(self, record: JobRecord, gpus: int, batch: int | None) -> None:
        """Checkpoint a running job now; it is requeued at ``gpus`` GPUs and ``batch``."""
        if record.state != JobState.RUNNING or gpus <= 0:
            return
        record.done = record.progress(self.now)
        record.resize_to = (gpus, batch or record.batch)
        self._halt(record, "rescale")

    def resize(self, record: JobRecord, gpus: int, batch: int | None = None) -> None:
        """Change the size a queued job will be placed at (a gang of whole learners)."""
        if record.state != JobState.QUEUED or gpus <= 0:
            return
        learners = max(gpus // max(record.gpus_per_learner, 1), 1)
        if (learners, batch or record.batch) == (record.learners, record.batch):
            return
        record.learners = learners
        record.batch = batch or record.batch
        record.queued_view = None

    def settle(self) -> None:
        """Handle the learner exits already due (halts that take no time)."""
        self._handle_exits(self.backend.advance_to(self.now))

    # -- the run -----------------------------------------------------------------------

    def run(self) -> SimResult:
        began = time.perf_counter()
        arrivals, index = self._arrivals, 0
        horizon = self.config.horizon_s
        sample_s = self._sample_interval()
        next_sample = 0.0
        next_tick: float | None = None
        steps = 0
        while True:
            if next_tick is None and self._tick_wanted():
                next_tick = (math.floor(self.now / self.config.tick_s) + 1) * self.config.tick_s
            candidates = [
                t
                for t in (
                    arrivals[index].submit_s - self._origin if index < len(arrivals) else None,
                    self.backend.next_exit_at(),
                    next_tick,
                )
                if t is not None
            ]
            if not candidates:
                break
            at = min(min(candidates), next_sample)
            if horizon is not None and at > horizon:
                break
            self._move_to(at)
            while index < len(arrivals) and arrivals[index].submit_s - self._origin <= at:
                self._arrive(arrivals[index])
                index += 1
            ticked = next_tick is not None and next_tick <= at
            if ticked:
                next_tick = None
            self._run_passes(ticked)
            if next_sample <= at:
                self._sample()
                next_sample = at + sample_s
            steps += 1
            if self._on_progress is not None and steps % 2000 == 0:
                self._on_progress(self.now)
        # With a horizon the run lasts until it, so idle or deadlocked time is measured too.
        self._move_to(self.now if horizon is None else max(self.now, horizon))
        self._sample()
        if self._on_progress is not None:
            self._on_progress(self.now)
        return SimResult(
            label=self.label,
            policy=self.policy.name,
            cluster_gpus=self.total_gpus,
            nodes=len(self.nodes),
            outcomes=[self._outcome(r) for r in self.records.values()]
            + [
                JobOutcome(j.id, j.submit_s - self._origin, None, None, j.gpus, 0, 0)
                for j in arrivals[index:]
            ],
            series=self.series,
            start_s=0.0,
            end_s=self.now,
            held_gpu_seconds=self.held_gpu_seconds,
            running_gpu_seconds=self.running_gpu_seconds,
            wall_s=time.perf_counter() - began,
            passes=self.passes,
            scheduler_calls=self.scheduler_calls,
            autoscale_calls=self.autoscale_calls,
            horizon_s=horizon,
        )

    def _sample_interval(self) -> float:
        if self.config.sample_s is not None:
            return max(self.config.sample_s, 1e-6)
        if not self._arrivals:
            return self.config.tick_s
        span = self._arrivals[-1].submit_s - self._origin
        if self.config.horizon_s is not None:
            span = max(span, self.config.horizon_s)
        estimate = max(span, max((j.expected_duration_s or 0.0) for j in self._arrivals))
        return max(self.config.tick_s, (span + estimate) / _TARGET_SAMPLES)

    def _tick_wanted(self) -> bool:
        return bool(self.queue) and self.policy.time_dependent

    def _run_passes(self, ticked: bool) -> None:
        count = 0
        while (self._dirty or ticked) and count < self.config.max_passes_per_instant:
            self._dirty = False
            ticked = False
            count += 1
            if self.policy.wants_pass(self):
                self.passes += 1
                self.policy.decide(self)
            self.settle()

    def _move_to(self, at: float) -> None:
        at = max(at, self.now)
        self._account(at)
        self.now = at
        self._handle_exits(self.backend.advance_to(at))

    def _account(self, at: float) -> None:
        elapsed = at - self._last_account
        if elapsed > 0:
            self.held_gpu_seconds += self._held_gpus * elapsed
            self.running_gpu_seconds += self._running_gpus * elapsed
            self._last_account = at

    def _sample(self) -> None:
        fragmented = 0
        if self.queue:
            waiting = (self.queued_view(r) for r in self.queued_in_order())
            fragmented = fragmented_gpus(self.node_free(), waiting, self.policy.placement)
        self.series.add(self.now, self._held_gpus, self._running_gpus, len(self.queue), fragmented)

    # -- arrivals, exits ---------------------------------------------------------------

    def _arrive(self, job: SimJob) -> None:
        record = self.policy.admit(self, job)
        record.submitted = record.queued_since = self.now
        self.records[job.id] = record
        if record.state == JobState.REJECTED:
            return
        self._enqueue(record)
        self._dirty = True

    def _enqueue(self, record: JobRecord) -> None:
        record.state = JobState.QUEUED
        record.queued_view = None
        self.queue[record.id] = record
        bisect.insort(self._order, (self.policy.queue_key(record.job), record.id))

    def _dequeue(self, record: JobRecord) -> None:
        del self.queue[record.id]
        entry = (self.policy.queue_key(record.job), record.id)
        position = bisect.bisect_left(self._order, entry)
        if position >= len(self._order) or self._order[position] != entry:
            raise SimulationError(f"{record.id} missing from the queue order")
        del self._order[position]

    def _handle_exits(self, exits: list[LearnerExit]) -> None:
        for exit_ in exits:
            record = self.records.get(str(exit_.handle["training_id"]))
            if record is None or int(exit_.handle["attempt"]) != record.attempt:
                continue
            record.live_learners -= 1
            if record.live_learners > 0:
                continue
            status = exit_.result.get("status")
            self._release(record)
            if status == LearnerStatus.HALTED.value:
                record.queued_since = self.now
                self._enqueue(record)
                if record.resize_to is not None:
                    self.resize(record, *record.resize_to)
                    record.resize_to = None
                # A rescale is the policy's own step, placed in the same pass; a preemption
                # frees room for another job, so a pass must follow at once.
                self._dirty = self._dirty or record.halting_for == "preempt"
                continue
            if status == LearnerStatus.COMPLETED.value:
                record.done = record.job.work
            record.finish = self.now
            record.state = JobState.DONE
            self._dirty = True

    # -- resources ---------------------------------------------------------------------

    def _take(self, record: JobRecord, learner: LearnerPlacement) -> None:
        per = record.job.per_learner
        free = self.free.get(learner.node)
        if free is None or not self._node_of[learner.node].schedulable:
            raise SimulationError(f"{record.id}: placed on unknown or cordoned node {learner.node}")
        ids = list(learner.gpu_ids)
        if len(ids) != per.gpus or any(g not in free.gpu_ids for g in ids):
            raise SimulationError(f"{record.id}: GPUs {ids} on {learner.node} are not free")
        if per.cpus > free.cpus + 1e-9 or per.memory_mb > free.memory_mb:
            raise SimulationError(f"{record.id}: {learner.node} lacks CPUs or memory")
        for g in ids:
            free.gpu_ids.remove(g)
        free.gpus -= per.gpus
        free.cpus -= per.cpus
        free.memory_mb -= per.memory_mb
        self.free_totals[0] -= per.gpus
        self.free_totals[1] -= per.cpus
        self.free_totals[2] -= per.memory_mb
        self.node_jobs[learner.node][record.id] = None
        self.free_index.update(learner.node, free.gpus, free.cpus, free.memory_mb)

    def _release(self, record: JobRecord) -> None:
        per = record.job.per_learner
        learners = record.placement.learners if record.placement is not None else tuple(record.held)
        for learner in learners:
            free = self.free[learner.node]
            free.gpu_ids = sorted([*free.gpu_ids, *learner.gpu_ids])
            free.gpus += per.gpus
            free.cpus += per.cpus
            free.memory_mb += per.memory_mb
            self.free_totals[0] += per.gpus
            self.free_totals[1] += per.cpus
            self.free_totals[2] += per.memory_mb
            self.node_jobs[learner.node].pop(record.id, None)
            self.free_index.update(learner.node, free.gpus, free.cpus, free.memory_mb)
        self._change_held(-per.gpus * len(learners))
        if record.placement is not None:
            self._change_running(-record.gpus)
        self.running.pop(record.id, None)
        record.placement = None
        record.running_view = None
        record.held = []
        record.handles = []

    def _change_held(self, delta: int) -> None:
        self._account(self.now)
        self._held_gpus += delta

    def _change_running(self, delta: int) -> None:
        self._account(self.now)
        self._running_gpus += delta

    # -- launching and halting ---------------------------------------------------------

    def _launch(self, record: JobRecord, placement: Placement, batch: int | None) -> None:
        if record.id in self.queue:
            self._dequeue(record)
        family = record.job.model_family
        if batch is not None:
            record.batch = batch
        if not record.held:
            self._change_held(record.gpus)
        record.held = []
        record.placement = placement
        record.state = JobState.RUNNING
        record.attempt += 1
        record.started_at = self.now
        if record.first_start is None:
            record.first_start = self.now
        overhead = self.config.start_overhead_s
        if record.restart_cost_due:
            overhead += self.config.restart_s
            record.restart_cost_due = False
        record.productive_from = self.now + overhead
        gpus = max(record.gpus, 1)
        record.rate = family.rate(gpus, record.batch, len(placement.nodes))
        remaining = max(record.job.work - record.done, 0.0)
        run_s = overhead + (remaining / record.rate if record.rate > 0 else math.inf)
        self.running[record.id] = record
        self._change_running(record.gpus)
        expected = record.job.expected_duration_s
        record.running_view = RunningJob(
            id=record.id,
            tenant=record.job.tenant,
            priority=self.policy.priority_of(record.job),
            # As the live loop: the first start, and elastic jobs shrink instead of halting.
            started_at=self.now if record.first_start is None else record.first_start,
            learners=record.learners,
            per_learner=record.job.per_learner,
            placement=placement,
            expected_duration_s=expected,
            preemptible=not record.elastic,
        )
        self.backend.script(record.id, LearnerScript(run_s=run_s, halt_s=self.config.halt_s))
        record.handles = [self._launch_learner(record, lp) for lp in placement.learners]
        record.live_learners = len(record.handles)

    def _launch_learner(self, record: JobRecord, learner: LearnerPlacement) -> dict[str, Any]:
        request = fake_request(
            learner.node,
            learner.gpu_ids,
            record.id,
            learner.learner,
            record.learners,
            record.attempt,
        )
        return self.backend.launch(request)

    def _halt(self, record: JobRecord, why: str) -> None:
        record.restarts += 1
        record.restart_cost_due = True
        record.state = JobState.HALTING
        record.halting_for = why
        for handle in record.handles:
            self.backend.signal_halt(handle)

    # -- results -----------------------------------------------------------------------

    def _outcome(self, record: JobRecord) -> JobOutcome:
        return JobOutcome(
            id=record.id,
            submit_s=record.submitted,
            first_start_s=record.first_start,
            finish_s=record.finish,
            gpus=record.job.gpus,
            restarts=record.restarts,
            preemptions=record.preemptions,
            rejected=record.state == JobState.REJECTED,
        )
