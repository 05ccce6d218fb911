"""The autoscaler loop: resize elastic jobs, and move work off drained nodes.

Each pass snapshots the cluster and the elastic jobs, learns every job's throughput model
from the sample counts its learners report (and its gradient noise scale from the gradient
statistics it reports, when it does), and hands the pure ``autoscale`` (the same
function the simulator calls) the GPUs elastic jobs may share: the schedulable GPUs minus
those held by non-elastic jobs and by elastic jobs already in transition, minus the GPUs a
blocked higher-priority job is waiting for (so elastic jobs shrink to admit it). Decisions
for running jobs become rescales (PROCESSING → RESCALING, with the reason and expected
gain in the event), except a batch-only change of a job that takes it while it runs
(``elastic.rebatch_in_place``): its batch is changed and an event records it, and its
learners take it from the report answers at their next epoch. For queued elastic jobs, the
decision is the size the scheduler will place them at. A running job stopped so that a job
waiting longer than ``fairness_after_s`` can start (it has had its GPUs for
``fairness_turn_s``) is halted, requeued and held back for a turn as long (``not_before``).
A job just submitted is left to the scheduler for ``QUEUED_GRACE_INTERVALS`` scheduler
intervals: one that fits starts at its manifest's size, whichever loop happens to run first,
and is grown later by a rescale; one still queued after that is sized here.

Drained nodes: an elastic job with a learner there is restarted at a size that fits
elsewhere; any other job there is halted and requeued, so nothing is killed for
maintenance. Nothing is done while the backend has a problem (``Backend.problem``).
A job restarted less than ``min_rescale_interval_s`` ago keeps its size
(user and drain decisions excepted), so the cluster does not churn.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from ffdl.core.manifest import ElasticSpec, Manifest
from ffdl.core.resources import CPU_SLOTS, Node, Placement
from ffdl.core.status import HOLDING_JOB_STATES, JobStatus
from ffdl.elastic.accumulation import job_layout, running_batch
from ffdl.elastic.autoscale import Candidate, TypedCandidate, autoscale, autoscale_types
from ffdl.elastic.candidates import JobState, elastic_candidate
from ffdl.elastic.efficiency import GradientStats
from ffdl.elastic.fairness import AnyCandidate, JobFacts, weigh
from ffdl.elastic.plan import RescaleDecision
from ffdl.elastic.throughput import (
    StepObservation,
    ThroughputModel,
    fit,
    on_faster_gpus,
    prior,
)
from ffdl.sdk.metrics import GRADIENT_GROUP
from ffdl.server.loops.scheduler import PREEMPTED
from ffdl.server.platform import Platform
from ffdl.server.services.nodes import effective_nodes
from ffdl.server.services.snapshots import epoch
from ffdl.server.store.models import Job, Metric, Tenant
from ffdl.server.store.transitions import note_job_event, set_job_status
from ffdl.server.telemetry.instruments import OPTIMIZER_SECONDS, Timer

# Scheduler intervals a newly queued elastic job is left to the scheduler (see above).
QUEUED_GRACE_INTERVALS = 3

_TRANSITIONING = frozenset(
    {
        JobStatus.PENDING.value,
        JobStatus.DOWNLOADING.value,
        JobStatus.HALTING.value,
        JobStatus.RESCALING.value,
        JobStatus.STORING.value,
    }
)
_MAX_OBSERVATIONS = 200
_GRADIENT_WINDOW = 20


@dataclass
class _Learned:
    """Throughput observations of one job, kept across passes."""

    last_metric_number: int = 0
    last_point: tuple[float, float] | None = None  # (time, cumulative samples)
    observations: list[StepObservation] = field(default_factory=list)
    model: ThroughputModel = field(default_factory=prior)


@dataclass(frozen=True)
class _Pass:
    """What one pass read: the jobs, the nodes (and the drained ones), the first queued
    non-elastic job, and each elastic job's last epoch and gradient statistics."""

    jobs: Sequence[Job]
    nodes: Sequence[Node]
    drained: set[str]
    queued_fixed: Any
    epochs: dict[str, int]
    gradients: dict[str, GradientStats]


class AutoscalerLoop:
    def __init__(self, platform: Platform) -> None:
        self._platform = platform
        self._learned: dict[tuple[str, str], _Learned] = {}  # by job id and GPU type
        self._specs: dict[str, ElasticSpec] = {}  # a job's manifest does not change
        self._samples: dict[str, float] = {}  # each job's last reported cumulative samples
        self._quotas: dict[str, int | None] = {}  # each tenant's max_gpus
        self._rhos: dict[str, float | None] = {}  # each job's rho in the last pass

    def __call__(self) -> None:
        platform = self._platform
        if platform.backend.problem() is not None:
            # No resizes or moves while learners cannot be started: a rescale would stop
            # jobs that cannot then come back.
            return
        nodes = effective_nodes(platform)
        drained = {n.name for n in nodes if not n.schedulable}
        holding = [s.value for s in HOLDING_JOB_STATES]
        with platform.store.read() as session:
            jobs = session.scalars(
                select(Job).where(
                    Job.status.in_(holding) | ((Job.status == JobStatus.QUEUED.value) & Job.elastic)
                )
            ).all()
            queued_fixed = session.execute(
                select(Job.priority, Job.learners, Job.gpus, Job.gpu_types)
                .where(Job.status == JobStatus.QUEUED.value, Job.elastic.is_(False))
                .order_by(Job.priority.desc(), Job.submitted_at)
                .limit(1)
            ).first()
            quotas = session.execute(select(Tenant.id, Tenant.max_gpus)).all()
            self._quotas = {tenant: max_gpus for tenant, max_gpus in quotas}
            elastic_ids = [j.id for j in jobs if j.elastic]
            epochs = self._epochs(session, elastic_ids)
            gradients = gradient_stats(session, elastic_ids)
            node_types = {n.name: n.gpu_type for n in nodes}
            for job in jobs:
                if job.elastic and job.status == JobStatus.PROCESSING.value:
                    self._learn(session, job, node_types)
        self._move_off_drained(jobs, drained)
        types = _gpu_types(nodes)
        settings = platform.settings
        options = {
            "restart_penalty": settings.restart_penalty,
            "restart_cost_s": settings.restart_cost_s,
            "fairness_after_s": settings.fairness_after_s,
            "admit_after_s": settings.admit_after_s,
            "objective": settings.elastic_objective,
            "turn_s": settings.fairness_turn_s,
        }
        seen = _Pass(jobs, nodes, drained, queued_fixed, epochs, gradients)
        with Timer(OPTIMIZER_SECONDS.observe):
            if len(types) > 1:
                decisions = self._plan_over_types(seen, options)
            else:
                decisions = self._plan(seen, options)
        if decisions:
            self._apply(decisions)
        self._store_rho(jobs)
        live = {job.id for job in jobs}
        self._samples = {k: v for k, v in self._samples.items() if k in live}
        self._learned = {k: v for k, v in self._learned.items() if k[0] in live}
        self._specs = {k: v for k, v in self._specs.items() if k in live}

    def _plan(self, seen: _Pass, options: dict[str, Any]) -> list[RescaleDecision]:
        """Decisions on a cluster of one GPU type (or none)."""
        jobs, nodes, drained, queued_fixed = seen.jobs, seen.nodes, seen.drained, seen.queued_fixed
        epochs, gradients = seen.epochs, seen.gradients
        capacity = sum(n.gpus for n in nodes if n.schedulable)
        candidates: list[Candidate] = []
        running_elastic_priorities: list[int] = []
        held = 0
        now = time.time()
        node_types = {n.name: n.gpu_type for n in nodes}
        only = _gpu_types(nodes)
        for job in jobs:
            gpus = job.gpus * job.learners
            if job.status == JobStatus.QUEUED.value:
                if self._waits_for_scheduler(job, now):
                    continue
                reach = reachable_gpus(job, nodes)
                model = self._model(job.id, None)
                kind = only[0] if len(only) == 1 else None
                candidates.append(
                    self._candidate(
                        job, 0, now, epochs.get(job.id), gradients.get(job.id), reach, model, kind
                    )
                )
                continue
            held += gpus
            if not job.elastic or job.status in _TRANSITIONING or _on(job, drained):
                capacity -= gpus
                continue
            running_elastic_priorities.append(job.priority)
            reach = reachable_gpus(job, nodes)
            kind = _type_of(job, node_types)
            model = self._model(job.id, kind)
            candidates.append(
                self._candidate(
                    job, gpus, now, epochs.get(job.id), gradients.get(job.id), reach, model, kind
                )
            )
        if queued_fixed is not None and running_elastic_priorities:
            demand = queued_fixed.learners * queued_fixed.gpus
            free = sum(n.gpus for n in nodes if n.schedulable) - held
            if demand > free and queued_fixed.priority > min(running_elastic_priorities):
                capacity -= demand
        candidates = self._fair(candidates, jobs, sum(n.gpus for n in nodes if n.schedulable))
        return autoscale(
            candidates,
            capacity,
            gpus_per_node=max((n.gpus for n in nodes), default=1) or 1,
            **options,
        )

    def _plan_over_types(self, seen: _Pass, options: dict[str, Any]) -> list[RescaleDecision]:
        """Decisions on a cluster of several GPU types: each elastic job is offered on every
        type it accepts, valued there by what it measured there, else by what it measured
        elsewhere (or the prior) scaled by ``gpu_speeds``."""
        jobs, nodes, drained, queued_fixed = seen.jobs, seen.nodes, seen.drained, seen.queued_fixed
        epochs, gradients = seen.epochs, seen.gradients
        node_types = {n.name: n.gpu_type for n in nodes}
        total = {t: 0 for t in _gpu_types(nodes)}
        per_node = dict.fromkeys(total, 1)
        for node in nodes:
            if node.schedulable and node.gpu_type in total:
                total[node.gpu_type] += node.gpus
                per_node[node.gpu_type] = max(per_node[node.gpu_type], node.gpus)
        capacity = dict(total)
        candidates: list[TypedCandidate] = []
        now = time.time()
        speeds = self._platform.settings.gpu_speeds
        # Faster types first: a job that accepts any type and ties prefers the faster.
        by_speed = sorted(total, key=lambda t: (-speeds.get(t, 1.0), t))
        lowest = 101  # the lowest priority of a running elastic job
        for job in jobs:
            gpus = job.gpus * job.learners
            queued = job.status == JobStatus.QUEUED.value
            if queued and self._waits_for_scheduler(job, now):
                continue
            if not queued and (
                not job.elastic or job.status in _TRANSITIONING or _on(job, drained)
            ):
                for learner in Placement.from_json(job.placement or []).learners:
                    kind = node_types.get(learner.node)
                    if kind in capacity:
                        capacity[kind] -= job.gpus
                continue
            accepted = [t for t in (job.gpu_types or by_speed) if t in total]
            current = None if queued else _type_of(job, node_types)
            variants = {
                t: self._candidate(
                    job,
                    0 if queued else gpus,
                    now,
                    epochs.get(job.id),
                    gradients.get(job.id),
                    total[t],
                    self._model(job.id, t),
                    gpu_type=t,
                )
                for t in accepted
            }
            if variants:
                pinned = job.pinned_gpu_type if job.pinned_gpu_type in total else None
                candidates.append(TypedCandidate(variants, current, pinned))
                lowest = min(lowest, job.priority) if not queued else lowest
        if queued_fixed is not None and queued_fixed.priority > lowest:
            # Room for a blocked higher-priority job, on the type it would take first.
            kinds = [t for t in (queued_fixed.gpu_types or by_speed) if t in capacity]
            if kinds:
                kind = max(kinds, key=lambda t: capacity[t])
                demand = queued_fixed.learners * queued_fixed.gpus
                if demand > total[kind] - _held_on(jobs, node_types, kind):
                    capacity[kind] -= demand
        candidates = self._fair(candidates, jobs, sum(total.values()))
        return autoscale_types(candidates, capacity, gpus_per_node=per_node, **options)

    def _fair(
        self, candidates: list[AnyCandidate], jobs: Sequence[Job], cluster_gpus: int
    ) -> list[AnyCandidate]:
        """``candidates`` weighed for fairness between tenants (``tenant_fairness``); every
        job's rho is kept for ``_store_rho``."""
        now = time.time()
        facts = {
            job.id: JobFacts(
                tenant=job.tenant_id,
                age_s=now - epoch(job.submitted_at),
                samples_done=self._samples.get(job.id, 0.0),
            )
            for job in jobs
            if job.elastic
        }
        mode = self._platform.settings.tenant_fairness
        weighed, self._rhos = weigh(candidates, facts, self._quotas, mode, cluster_gpus)
        return weighed

    def _store_rho(self, jobs: Sequence[Job]) -> None:
        """Record each job's rho where it moved by more than 5% (or appeared, or went)."""
        moved = {
            job.id: rho
            for job in jobs
            if job.id in self._rhos
            and (rho := self._rhos[job.id]) != job.rho
            and (rho is None or job.rho is None or abs(rho - job.rho) > 0.05 * job.rho)
        }
        if not moved:
            return
        with self._platform.store.write() as session:
            for job_id, rho in moved.items():
                job = session.get(Job, job_id)
                if job is not None:
                    job.rho = rho

    def _waits_for_scheduler(self, job: Job, now: float) -> bool:
        """A queued job just submitted (``QUEUED_GRACE_INTERVALS``) or held back."""
        interval = self._platform.settings.scheduler_interval_s
        fresh_s = max(QUEUED_GRACE_INTERVALS * interval, 1.0)
        return now - epoch(job.status_changed_at) < fresh_s or _held_back(job, now)

    # -- inputs ----------------------------------------------------------------------------

    def _candidate(
        self,
        job: Job,
        gpus: int,
        now: float,
        epoch_now: int | None,
        grad_stats: GradientStats | None,
        cluster_gpus: int,
        model: ThroughputModel,
        gpu_type: str | None = None,
    ) -> Candidate:
        return elastic_candidate(
            job_state(job, self._spec(job), gpus, now, epoch_now),
            cluster_gpus=cluster_gpus,
            min_rescale_interval_s=self._platform.settings.min_rescale_interval_s,
            model=model,
            grad_stats=grad_stats,
            gpu_type=gpu_type,
        )

    def _model(self, job_id: str, gpu_type: str | None) -> ThroughputModel:
        measured = {
            kind: learned.model
            for (j, kind), learned in self._learned.items()
            if j == job_id and learned.observations
        }
        return model_on_type(measured, gpu_type, self._platform.settings.gpu_speeds)

    def _epochs(self, session: Any, job_ids: list[str]) -> dict[str, int]:
        if not job_ids:
            return {}
        rows = session.execute(
            select(Metric.job_id, func.max(Metric.iteration))
            .where(Metric.job_id.in_(job_ids), Metric.group == "train")
            .group_by(Metric.job_id)
        ).all()
        return {job_id: int(it) for job_id, it in rows if it is not None}

    def _spec(self, job: Job) -> ElasticSpec:
        spec = self._specs.get(job.id)
        if spec is None:
            spec = Manifest.from_dict(job.manifest).elastic
            assert spec is not None, f"{job.id} is not elastic"
            self._specs[job.id] = spec
        return spec

    def _learn(self, session: Any, job: Job, node_types: dict[str, str]) -> None:
        """Turn new cumulative sample counts into step-time observations and refit (one
        model per GPU type the job has run on)."""
        kind = _type_of(job, node_types) or ""
        learned = self._learned.setdefault((job.id, kind), _Learned())
        # Reports read while it ran on another type are not this type's to learn from.
        seen = max(v.last_metric_number for (j, _), v in self._learned.items() if j == job.id)
        if seen > learned.last_metric_number:
            learned.last_metric_number, learned.last_point = seen, None
        rows = session.execute(
            select(Metric.number, Metric.time, Metric.values, Metric.attempt)
            .where(
                Metric.job_id == job.id,
                Metric.number > learned.last_metric_number,
                Metric.group == "train",
                Metric.learner == 1,
            )
            .order_by(Metric.number)
        ).all()
        if not rows:
            return
        elastic = self._spec(job)
        batch = running_batch(elastic, job.batch_size)
        gpus = job.gpus * job.learners
        nodes = len(Placement.from_json(job.placement or []).nodes) or 1
        planned = job_layout(elastic, batch, gpus, kind or None) if batch is not None else None
        steps = planned.steps if planned is not None else 1
        added = False
        for row in rows:
            learned.last_metric_number = row.number
            samples = row.values.get("samples")
            if samples is not None:
                self._samples[job.id] = float(samples)
            if row.attempt != job.attempt or samples is None:
                learned.last_point = None
                continue
            point = (float(row.time), float(samples))
            previous, learned.last_point = learned.last_point, point
            if previous is None or batch is None or gpus <= 0:
                continue
            elapsed, done = point[0] - previous[0], point[1] - previous[1]
            if elapsed > 0 and done > 0:
                step_time = elapsed * batch / done
                learned.observations.append(
                    StepObservation(gpus, batch, nodes, step_time, steps=steps)
                )
                added = True
        if added:
            learned.observations = learned.observations[-_MAX_OBSERVATIONS:]
            learned.model = fit(learned.observations, prior())

    # -- actions ---------------------------------------------------------------------------

    def _move_off_drained(self, jobs: Any, drained: set[str]) -> None:
        if not drained:
            return
        moved = False
        with self._platform.store.write() as session:
            for snapshot_job in jobs:
                if snapshot_job.status != JobStatus.PROCESSING.value or not _on(
                    snapshot_job, drained
                ):
                    continue
                job = session.get(Job, snapshot_job.id)
                if job is None or job.status != JobStatus.PROCESSING.value:
                    continue
                where = ", ".join(
                    sorted(set(Placement.from_json(job.placement or []).nodes) & drained)
                )
                if job.elastic:
                    job.rescale_target = {
                        "gpus": job.gpus * job.learners,
                        "batch": job.batch_size,
                        "reason": f"moving off drained node {where}",
                    }
                    set_job_status(
                        session, job, JobStatus.RESCALING, f"moving off drained node {where}"
                    )
                else:
                    job.desired = PREEMPTED
                    set_job_status(
                        session, job, JobStatus.HALTING, f"moving off drained node {where}"
                    )
                moved = True
        if moved:
            self._platform.wakeups.notify("lcm")

    def _apply(self, decisions: list[RescaleDecision]) -> None:
        changed = False
        with self._platform.store.write() as session:
            for decision in decisions:
                job = session.get(Job, decision.job_id)
                if job is None:
                    continue
                per = max(job.gpus, 1)
                if job.status == JobStatus.QUEUED.value:
                    if decision.to_gpus > 0:
                        job.learners = decision.to_gpus // per
                        job.batch_size = decision.to_batch or job.batch_size
                        # The scheduler tries the type it was planned on first.
                        job.rescale_target = (
                            {"gpu_type": decision.gpu_type} if decision.gpu_type else None
                        )
                        changed = True
                    continue
                if job.status != JobStatus.PROCESSING.value:
                    continue
                if decision.to_gpus <= 0:
                    if not decision.yielded:
                        # Making room for higher-priority work is the scheduler's call:
                        # the optimizer shrinks elastic jobs for it, never stops them.
                        continue
                    # Stopped for a job that waited too long (the optimizer's bounded wait):
                    # halted with a checkpoint and queued again, as the scheduler preempts,
                    # and held back for a turn so that the scheduler gives its GPUs to the
                    # job that waited rather than back to it.
                    job.desired = PREEMPTED
                    turn = timedelta(seconds=self._platform.settings.fairness_turn_s)
                    job.not_before = datetime.now(UTC).replace(tzinfo=None) + turn
                    set_job_status(session, job, JobStatus.HALTING, decision.reason)
                    changed = True
                    continue
                gain = f" (expected gain {decision.expected_gain:+.1f} samples/s)"
                if (
                    decision.in_place
                    and decision.to_batch
                    and decision.to_gpus == (job.gpus * job.learners)
                ):
                    # The learners take it at their next epoch (the report answers carry
                    # it): no restart, no status change.
                    job.batch_size = decision.to_batch
                    note_job_event(session, job, decision.reason + gain)
                    continue
                job.rescale_target = {
                    "gpus": decision.to_gpus,
                    "batch": decision.to_batch,
                    "reason": decision.reason,
                    "expected_gain": decision.expected_gain,
                    "gpu_type": decision.gpu_type,
                }
                set_job_status(session, job, JobStatus.RESCALING, decision.reason + gain)
                changed = True
        if changed:
            self._platform.wakeups.notify("lcm", "scheduler")


def _held_back(job: Job, now: float) -> bool:
    """A queued job the scheduler will not place yet (a restart's back-off, a turn given up)."""
    return job.not_before is not None and epoch(job.not_before) > now


def gradient_stats(session: Any, job_ids: list[str]) -> dict[str, GradientStats]:
    """Each job's gradient statistics, averaged over its last reports (single steps are noisy)."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(Metric.job_id, Metric.values)
        .where(Metric.job_id.in_(job_ids), Metric.group == GRADIENT_GROUP)
        .order_by(Metric.id.desc())
        .limit(_GRADIENT_WINDOW * len(job_ids))
    ).all()
    sums: dict[str, list[float]] = {}
    for job_id, values in rows:
        sq_norm, variance = values.get("sq_norm"), values.get("variance")
        if sq_norm is None or variance is None:
            continue
        acc = sums.setdefault(job_id, [0.0, 0.0, 0.0])
        if acc[2] >= _GRADIENT_WINDOW:
            continue
        acc[0] += float(sq_norm)
        acc[1] += float(variance)
        acc[2] += 1
    return {
        job_id: GradientStats(sq_norm=acc[0] / acc[2], variance=acc[1] / acc[2])
        for job_id, acc in sums.items()
        if acc[0] > 0
    }


def _on(job: Job, nodes: set[str]) -> bool:
    return bool(nodes) and any(
        lp.node in nodes for lp in Placement.from_json(job.placement or []).learners
    )


def job_state(
    job: Job, elastic: ElasticSpec, gpus: int, now: float, epoch_now: int | None
) -> JobState:
    """Where ``job`` (holding ``gpus`` GPUs, 0 while queued) stands at ``now``."""
    return JobState(
        id=job.id,
        priority=job.priority,
        elastic=elastic,
        gpus_per_learner=job.gpus,
        current_gpus=gpus,
        current_batch=job.batch_size,
        current_nodes=len(Placement.from_json(job.placement or []).nodes) or None,
        since_change_s=now - epoch(job.status_changed_at),
        epoch=epoch_now,
        pinned_gpus=job.pinned_gpus,
        age_s=now - epoch(job.submitted_at),
        restarts=max(job.attempt - 1, 0) if gpus else 0,
    )


def reachable_gpus(job: Job, nodes: Sequence[Node]) -> int:
    """The most GPUs one gang of ``job`` could hold on the schedulable nodes: those of the
    types it accepts, and of one type unless it may mix them."""
    accepted = set(job.gpu_types or ())
    by_type: dict[str, int] = {}
    for node in nodes:
        if node.schedulable and (not accepted or node.gpu_type in accepted):
            by_type[node.gpu_type] = by_type.get(node.gpu_type, 0) + node.gpus
    if job.mix_gpu_types:
        return sum(by_type.values())
    return max(by_type.values(), default=0)


def model_on_type(
    measured: dict[str, ThroughputModel], gpu_type: str | None, speeds: dict[str, float]
) -> ThroughputModel:
    """A job's step-time model on ``gpu_type``, from the models fitted to what it measured on
    each type (``measured``): its own there; else one fitted elsewhere, scaled by the types'
    ``gpu_speeds``; else the prior, scaled. ``gpu_type`` None: whichever it measured."""
    if gpu_type is None:
        return next(iter(measured.values()), prior())
    if gpu_type in measured:
        return measured[gpu_type]
    if measured:
        kind, model = next(iter(measured.items()))
        return on_faster_gpus(model, speeds.get(gpu_type, 1.0) / speeds.get(kind, 1.0))
    return on_faster_gpus(prior(), speeds.get(gpu_type, 1.0))


def _gpu_types(nodes: Sequence[Node]) -> list[str]:
    """The GPU types of the schedulable nodes (CPU slots and untyped GPUs are none)."""
    return sorted(
        {
            n.gpu_type
            for n in nodes
            if n.schedulable and n.gpus and n.gpu_type not in ("", CPU_SLOTS)
        }
    )


def _type_of(job: Job, node_types: dict[str, str]) -> str | None:
    """The GPU type a placed job runs on (its first learner's)."""
    placement = Placement.from_json(job.placement or [])
    if not placement.learners:
        return None
    return placement.gpu_type or node_types.get(placement.learners[0].node)


def _held_on(jobs: Sequence[Job], node_types: dict[str, str], gpu_type: str) -> int:
    """GPUs of ``gpu_type`` that running jobs hold."""
    return sum(
        job.gpus
        for job in jobs
        if job.status != JobStatus.QUEUED.value
        for learner in Placement.from_json(job.placement or []).learners
        if node_types.get(learner.node) == gpu_type
    )
