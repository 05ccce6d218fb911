"""The scheduling pass: ``schedule(snapshot) -> Decisions``, a pure function.

Owns how the parts combine in one pass over the queue (priority, then FIFO):

1. A job that could never fit the cluster waits with the reason and blocks nobody.
2. A job over its tenant's quota is set aside for the borrowing step (5).
3. Otherwise the job starts if its whole gang fits, subject to the constraints below.
4. The first job that does not fit is the *head*. With preemption on, it may first preempt
   borrowers and lower-priority jobs (see ``preemption``); if it does, it holds what it will
   use (victims' capacity and any free capacity in its trial placement) and the next job
   that does not fit becomes the head. A head that cannot preempt gets a *reservation*:
   the earliest time its resources become free by expected ends (see ``eta.reserve``).
   Backfill rule: a later job may start only if it is expected to end (by its own
   ``expected_duration_s``) before the reservation time, or if it fits in what is free
   both now and in the reservation's shadow (what is left at that time after the head's
   share). When the reservation time is unknown, later jobs may only use nodes the head
   could never use (wrong GPU type, too small for one learner, outside any label value
   that could hold it). A blocked job that has waited longer than the aging threshold
   fences off the nodes it could use in the same way, so nothing backfills past it onto
   them. With ``backfill=False`` nothing starts after the head.
5. Jobs over quota may borrow idle capacity on nodes that no waiting job within its
   quota could use; otherwise they wait with the quota named.
6. Every job that did not start gets its position, a reason and an ETA (``eta``).

At most ``max_preemptors`` jobs preempt in one pass. Preempted resources are not reused in
the same pass: the victims must checkpoint first, and the preemptor starts in a later pass
once they are halted.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from dataclasses import dataclass

from ffdl.core.resources import Placement, Resources
from ffdl.scheduler.eta import (
    BackfillLimits,
    Holding,
    PooledEstimates,
    QueueSimulation,
    Reservation,
    reservation_words,
    reserve,
)
from ffdl.scheduler.free import FreeState, KeptFree
from ffdl.scheduler.placement import (
    Choice,
    assign,
    cluster_shape,
    effective_policy,
    find_nodes,
    never_fits,
    never_fits_on,
    usable_nodes,
)
from ffdl.scheduler.preemption import Hold, VictimIndex, preempt_for
from ffdl.scheduler.queue import (
    DEFAULT_AGING_THRESHOLD_S,
    behind_reason,
    describe_shortfall,
    has_aged,
    plural,
    queue_order,
)
from ffdl.scheduler.quota import QuotaBook, overdrafts
from ffdl.scheduler.snapshot import (
    Decisions,
    Preempt,
    QueuedJob,
    RunningJob,
    Snapshot,
    Start,
    Waiting,
)

__all__ = ["Plan", "never_fits", "plan", "schedule"]

# Why a job did not start, decided during the walk; the words come at the end.
_NEVER, _QUOTA, _PREEMPTING, _HEAD, _CAPACITY, _HELD = range(6)

# Preempting jobs per pass: each one costs victims a checkpoint, so the cluster is not
# churned in one go (and a pass stays fast); the next pass lets the next ones preempt.
DEFAULT_MAX_PREEMPTORS = 4

_ShapeKey = tuple[int, float, int, int, tuple[str, ...], bool, str | None]


@dataclass(frozen=True, slots=True)
class Plan:
    """The decisions of a pass, with what led to them (for tests, the simulator, the UI)."""

    decisions: Decisions
    reservation: Reservation | None = None
    borrowed: tuple[str, ...] = ()  # jobs started on capacity beyond their tenant's quota


def schedule(
    snapshot: Snapshot,
    *,
    backfill: bool = True,
    preemption: bool = True,
    aging_threshold_s: float = DEFAULT_AGING_THRESHOLD_S,
    max_preemptors: int = DEFAULT_MAX_PREEMPTORS,
    kept: KeptFree | None = None,
) -> Decisions:
    """Decide which queued jobs start where, which running jobs to preempt, and why the
    others wait. Pure: the same snapshot always gives the same decisions. A loop that
    schedules pass after pass passes its ``KeptFree`` as ``kept``: the decisions are the
    same, and the free capacity is brought up to date instead of built again."""
    return plan(
        snapshot,
        backfill=backfill,
        preemption=preemption,
        aging_threshold_s=aging_threshold_s,
        max_preemptors=max_preemptors,
        kept=kept,
    ).decisions


def plan(
    snapshot: Snapshot,
    *,
    backfill: bool = True,
    preemption: bool = True,
    aging_threshold_s: float = DEFAULT_AGING_THRESHOLD_S,
    max_preemptors: int = DEFAULT_MAX_PREEMPTORS,
    kept: KeptFree | None = None,
) -> Plan:
    """``schedule`` with the head's reservation and the borrowing starts."""
    # A pass allocates tens of thousands of short-lived objects and makes no reference
    # cycles, so the cyclic collector would only walk the caller's whole heap mid-pass;
    # it is paused for the pass (reference counting still frees everything).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _Pass(snapshot, backfill, preemption, aging_threshold_s, max_preemptors, kept).run()
    finally:
        if collecting:
            gc.enable()


def _shape(job: QueuedJob) -> _ShapeKey:
    """What placement depends on, as plain values (cheap to hash for 10,000 jobs)."""
    per = job.per_learner
    return (
        per.gpus,
        per.cpus,
        per.memory_mb,
        job.learners,
        job.gpu_types,
        job.mix_gpu_types,
        job.same_label,
    )


class _Pass:
    """One scheduling pass over a snapshot (the working state of ``plan``)."""

    def __init__(
        self,
        snapshot: Snapshot,
        backfill: bool,
        preemption: bool,
        aging_threshold_s: float,
        max_preemptors: int,
        kept: KeptFree | None,
    ) -> None:
        self.max_preemptors = max_preemptors
        self.snap = snapshot
        self.now = snapshot.now
        self.backfill = backfill
        self.preemption = preemption
        self.aging_threshold_s = aging_threshold_s
        self.state = (
            FreeState(snapshot.nodes, snapshot.running)
            if kept is None
            else kept.state(snapshot.nodes, snapshot.running)
        )
        self.shape = cluster_shape(snapshot.nodes)
        self.quota = QuotaBook(snapshot.quotas, snapshot.running, snapshot.typical_duration_s)
        self.overdrafts = overdrafts(snapshot.quotas, snapshot.running)
        self._victim_index: VictimIndex | None = None  # built on first preemption
        self.order = queue_order(snapshot.queued)
        self.schedulable = {n.name for n in snapshot.nodes if n.schedulable}
        self.starts: list[Start] = []
        self.started: dict[str, QueuedJob] = {}
        self.borrowed: list[str] = []
        self.preemptions: list[Preempt] = []
        self.victims: dict[str, RunningJob] = {}
        self.holds: list[Hold] = []
        self.outcome: dict[str, tuple[int, str]] = {}
        self.waiting_in_quota: list[QueuedJob] = []
        self.never_cache: dict[_ShapeKey, str | None] = {}
        self.usable_cache: dict[_ShapeKey, set[str]] = {}
        self.no_fit_cache: dict[tuple[_ShapeKey, bool], tuple[int, int]] = {}
        self.fits_now_cache: dict[_ShapeKey, tuple[int, bool]] = {}
        self.fenced_shapes: set[_ShapeKey] = set()
        self.head: QueuedJob | None = None
        self.reservation: Reservation | None = None
        self.limits: BackfillLimits | None = None  # set once a job blocks the queue
        self._running_holding: list[Holding] | None = None
        self.closed = False  # nothing more may start in the main walk

    # -- the walk ----------------------------------------------------------------------

    def run(self) -> Plan:
        deferred: list[tuple[QueuedJob, str]] = []
        for index, job in enumerate(self.order):
            if self.closed:
                self._rest_wait(index, deferred)
                break
            key = _shape(job)
            never = self._never(job, key)
            if never is not None:
                self.outcome[job.id] = (_NEVER, never)
                continue
            over = self.quota.over_quota(job)
            if over is not None:
                deferred.append((job, over))
                continue
            short = self._is_short(job)
            choice = self._try(job, key, short)
            if choice is not None:
                self._start(job, choice, short)
            elif self.head is None:
                if not (self.preemption and self._preempt(job)):
                    self._become_head(job)
                    self.waiting_in_quota.append(job)
            else:
                self.outcome[job.id] = (_HELD if self._fits_now(job, key) else _CAPACITY, "")
                self.waiting_in_quota.append(job)
                if has_aged(job, self.now, self.aging_threshold_s):
                    self._fence(job)
        self._borrow(deferred)
        return Plan(
            Decisions(tuple(self.starts), tuple(self.preemptions), self._waiting()),
            self.reservation,
            tuple(self.borrowed),
        )

    def _rest_wait(self, start: int, deferred: list[tuple[QueuedJob, str]]) -> None:
        """Once nothing more can start, only jobs over their quota need handling now (for
        borrowing); the rest wait, and their reasons are worked out with the others."""
        quotas = self.snap.quotas
        # Usage no longer changes, so the quota verdict depends on tenant and GPUs only.
        verdicts: dict[tuple[str, int], str | None] = {}
        for job in self.order[start:]:
            if job.tenant not in quotas:
                continue
            key = (job.tenant, job.per_learner.gpus * job.learners)
            if key not in verdicts:
                verdicts[key] = self.quota.over_quota(job)
            over = verdicts[key]
            if over is not None and self._never(job, _shape(job)) is None:
                deferred.append((job, over))

    def _verdict(self, job: QueuedJob, key: _ShapeKey) -> tuple[int, str]:
        """Why a job from after the walk closed waits (free capacity no longer changes)."""
        never = self._never(job, key)
        if never is not None:
            return (_NEVER, never)
        return (_HELD if self._fits_now(job, key) else _CAPACITY, "")

    def _never(self, job: QueuedJob, key: _ShapeKey) -> str | None:
        if key not in self.never_cache:
            self.never_cache[key] = never_fits_on(job, self.shape)
        return self.never_cache[key]

    def _is_short(self, job: QueuedJob) -> bool:
        """Expected to end before the head's reserved time (so it cannot delay the head)."""
        at = self.reservation.at if self.reservation is not None else None
        return (
            at is not None
            and job.expected_duration_s is not None
            and self.now + job.expected_duration_s <= at
        )

    def _try(self, job: QueuedJob, key: _ShapeKey, short: bool) -> Choice | None:
        view = self.state if self.limits is None else self.limits.view_for(short)
        versions = (id(view), view.version)
        if self.no_fit_cache.get((key, short)) == versions:
            return None
        choice = find_nodes(view, job, effective_policy(job, self.snap.default_placement))
        if choice is None:
            self.no_fit_cache[(key, short)] = versions
        return choice

    def _fits_now(self, job: QueuedJob, key: _ShapeKey) -> bool:
        """Whether it would fit what is free, ignoring reservations and fences."""
        cached = self.fits_now_cache.get(key)
        if cached is not None and cached[0] == self.state.version:
            return cached[1]
        policy = effective_policy(job, self.snap.default_placement)
        fits = find_nodes(self.state, job, policy, any_fit=True) is not None
        self.fits_now_cache[key] = (self.state.version, fits)
        return fits

    def _duration(self, job: QueuedJob) -> float | None:
        return job.expected_duration_s or self.snap.typical_duration_s

    def _start(self, job: QueuedJob, choice: Choice, short: bool) -> Placement:
        placement = assign(self.state, job, choice)
        self.starts.append(Start(job.id, placement))
        self.started[job.id] = job
        duration = self._duration(job)
        self.quota.charge(
            job.tenant, job.total.gpus, None if duration is None else self.now + duration
        )
        if self.limits is not None:
            self.limits.started(job, choice, past_reservation=not short)
        return placement

    # -- the head ----------------------------------------------------------------------

    def _become_head(self, job: QueuedJob) -> None:
        self.head = job
        self.outcome[job.id] = (_HEAD, "")
        if not self.backfill:
            self.closed = True
        policy = effective_policy(job, self.snap.default_placement)
        self.reservation, shadow = reserve(job, policy, self.state, self._releases(), self.now)
        self.limits = BackfillLimits(self.state)
        if self.reservation.at is None:
            self._fence(job)
        else:
            self.limits.set_shadow(shadow)

    def _holding(self) -> list[Holding]:
        """Running jobs not preempted and this pass's starts: (id, per learner, expected
        end, the learners' nodes)."""
        if self._running_holding is None:
            # Victims are only chosen before the head blocks, so this is final by now.
            typical = self.snap.typical_duration_s
            self._running_holding = []
            for running in self.snap.running:
                if running.id not in self.victims:
                    end = running.expected_end(typical)
                    nodes = [lp.node for lp in running.placement.learners]
                    self._running_holding.append((running.id, running.per_learner, end, nodes))
        holding = list(self._running_holding)
        for start in self.starts:
            job = self.started[start.job_id]
            duration = self._duration(job)
            end = None if duration is None else self.now + duration
            nodes = [lp.node for lp in start.placement.learners]
            holding.append((job.id, job.per_learner, end, nodes))
        return holding

    def _hold_end(self, hold: Hold) -> float | None:
        duration = self._duration(hold.job)
        return None if duration is None else self.now + duration

    def _releases(self) -> list[Holding]:
        """Everything that frees resources by an expected end (for ``reserve``): holders,
        and the free capacity preempting jobs hold."""
        holding = self._holding()
        for hold in self.holds:
            end = self._hold_end(hold)
            holding.extend(
                (hold.job.id, amount, end, (name,)) for name, amount in hold.from_free.items()
            )
        return holding

    def _usable(self, job: QueuedJob) -> set[str]:
        key = _shape(job)
        usable = self.usable_cache.get(key)
        if usable is None:
            usable = self.usable_cache[key] = usable_nodes(job, self.shape)
        return usable

    def _fence(self, job: QueuedJob) -> None:
        """Keep later jobs off every node ``job`` could use."""
        key = _shape(job)
        if self.closed or self.limits is None or key in self.fenced_shapes:
            return
        self.fenced_shapes.add(key)
        usable = self._usable(job)
        if len(usable | self.limits.fenced) >= len(self.schedulable):
            self.closed = True  # nothing can start any more: no need to update the views
            return
        self.limits.fence(usable)

    # -- preemption --------------------------------------------------------------------

    def _preempt(self, job: QueuedJob) -> bool:
        if len(self.holds) >= self.max_preemptors:
            return False
        if self._victim_index is None:
            self._victim_index = VictimIndex(self.snap.running, self.overdrafts)
        policy = effective_policy(job, self.snap.default_placement)
        hold = preempt_for(job, policy, self.state, self._victim_index)
        if hold is None:
            return False
        self.holds.append(hold)
        for victim in hold.victims:
            self.victims[victim.job.id] = victim.job
            reason = f"preempted by {job.id}"
            if victim.borrowing:
                reason += f" to reclaim capacity it borrowed ({victim.borrowing})"
            self.preemptions.append(Preempt(victim.job.id, job.id, reason))
        borrowed = sum(1 for victim in hold.victims if victim.borrowing)
        detail = f"waiting for {plural(len(hold.victims), 'preempted job')} to checkpoint"
        if borrowed:
            detail += f" ({borrowed} of them reclaimed from borrowed capacity)"
        self.outcome[job.id] = (_PREEMPTING, detail)
        return True

    # -- borrowing ---------------------------------------------------------------------

    def _borrow(self, deferred: list[tuple[QueuedJob, str]]) -> None:
        if not deferred:
            return
        # Borrowers keep off every node a waiting job within its quota could use.
        fenced: set[str] = set()
        seen: set[_ShapeKey] = set()
        for waiting in self.waiting_in_quota:
            key = _shape(waiting)
            if key not in seen:
                seen.add(key)
                fenced |= self._usable(waiting)
                if len(fenced) >= len(self.schedulable):
                    break
        shut = bool(self.waiting_in_quota) and (
            not self.backfill or len(fenced) >= len(self.schedulable)
        )
        for job, over in deferred:
            if shut:
                self.outcome[job.id] = (
                    _QUOTA,
                    f"{over}; idle capacity cannot be borrowed while jobs within their "
                    "quota wait for it",
                )
                continue
            policy = effective_policy(job, self.snap.default_placement)
            choice = find_nodes(self.state, job, policy, fenced or None)
            if choice is not None:
                self.borrowed.append(job.id)
                self._start(job, choice, short=True)
                continue
            self.outcome[job.id] = (
                _QUOTA,
                f"{over}; it may borrow idle capacity, but {describe_shortfall(self.state, job)}",
            )

    # -- waiting reasons and ETAs ------------------------------------------------------

    def _estimates(self) -> PooledEstimates:
        """The pooled ETA simulations, fed with everything that holds resources after
        this pass and what preempted jobs hand back once they halt."""
        holding: list[tuple[Resources, float | None, Iterable[str]]] = [
            (per, end, nodes) for _id, per, end, nodes in self._holding()
        ]
        handed_back: list[tuple[str, Resources]] = []
        for hold in self.holds:
            end = self._hold_end(hold)
            holding.extend((amount, end, (name,)) for name, amount in hold.placement)
            handed_back.extend(hold.victims_left.items())
        typical_used = self.snap.typical_duration_s is not None and (
            any(r.expected_duration_s is None for r in self.snap.running)
            or any(j.expected_duration_s is None for j in self.order)
        )
        return PooledEstimates(self.now, self.state, holding, handed_back, typical_used)

    def _waiting(self) -> tuple[Waiting, ...]:
        # Built at the first job that waits: it walks every running job, and most passes
        # of a cluster with room leave no job waiting.
        estimates: PooledEstimates | None = None
        sims: dict[tuple[str, ...], QueueSimulation] = {}
        verdicts: dict[_ShapeKey, tuple[int, str]] = {}
        shortfalls: dict[_ShapeKey, str] = {}
        out: list[Waiting] = []
        started, outcome, now = self.started, self.outcome, self.now
        typical = self.snap.typical_duration_s
        # Waiting jobs ahead, and how many of them are of a higher priority.
        ahead, ahead_higher, priority = 0, 0, None
        for job in self.order:
            job_id = job.id
            if job_id in started:
                continue
            if job.priority != priority:
                priority, ahead_higher = job.priority, ahead
            key = None
            decided = outcome.get(job_id)
            if decided is None:  # a job from after the walk closed
                key = _shape(job)
                decided = verdicts.get(key)
                if decided is None:
                    decided = verdicts[key] = self._verdict(job, key)
            kind, detail = decided
            sim = sims.get(job.gpu_types)
            if sim is None:
                if estimates is None:
                    estimates = self._estimates()
                sim = sims[job.gpu_types] = estimates.for_types(job.gpu_types)
            eta: float | None
            if kind == _HELD:
                reason = behind_reason(ahead_higher, ahead - ahead_higher)
                eta, eta_reason = sim.admit(job, job.expected_duration_s or typical)
            elif kind == _CAPACITY:
                key = key or _shape(job)
                reason = shortfalls.get(key) or shortfalls.setdefault(
                    key, describe_shortfall(self.state, job)
                )
                eta, eta_reason = sim.admit(job, job.expected_duration_s or typical)
            elif kind == _HEAD:
                reason = describe_shortfall(self.state, job)
                if self.reservation is not None:
                    reason += "; " + reservation_words(self.reservation, now)
                not_before = self.reservation.at if self.reservation is not None else None
                eta, eta_reason = sim.admit(job, job.expected_duration_s or typical, not_before)
            elif kind == _QUOTA:
                at, eta_reason = self.quota.within_quota_at(job, now)
                eta = None if at is None else max(at, sim.clock) - now
                reason = detail
            elif kind == _PREEMPTING:
                eta, eta_reason = 0.0, "starts once the preempted jobs have checkpointed"
                reason = detail
            else:
                eta, eta_reason = None, "it can never fit this cluster"
                reason = detail
            ahead += 1
            out.append(Waiting(job_id, ahead, reason, eta, eta_reason))
        return tuple(out)
