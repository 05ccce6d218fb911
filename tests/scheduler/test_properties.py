"""Properties of a scheduling pass over random clusters and job mixes.

Everything here is checked against the snapshot and the decisions with independent
arithmetic (free capacity, learner slots), not with the scheduler's own helpers.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.resources import LearnerPlacement, Node, Placement, Resources
from ffdl.scheduler.policy import Plan, never_fits, plan
from ffdl.scheduler.quota import overdrafts
from ffdl.scheduler.snapshot import (
    Decisions,
    QueuedJob,
    RunningJob,
    Snapshot,
    TenantQuota,
)

NOW = 100_000.0
TENANTS = ("a", "b", "c")

# -- independent arithmetic -----------------------------------------------------------------

Free = dict[str, list[float]]  # node → [gpus, cpus, memory]


def capacity(nodes: tuple[Node, ...]) -> Free:
    return {n.name: [n.gpus, n.cpus, n.memory_mb] for n in nodes}


def take(free: Free, node: str, per: Resources, count: int = 1) -> None:
    if node in free:
        free[node][0] -= per.gpus * count
        free[node][1] -= per.cpus * count
        free[node][2] -= per.memory_mb * count


def slots(room: list[float], per: Resources) -> int:
    if min(room) < -1e-9:
        return 0
    counts = [10**6]
    if per.gpus:
        counts.append(int(room[0] // per.gpus))
    if per.cpus:
        counts.append(int((room[1] + 1e-9) // per.cpus))
    if per.memory_mb:
        counts.append(int(room[2] // per.memory_mb))
    return min(counts)


def fits(job: QueuedJob, free: Free, nodes: tuple[Node, ...]) -> bool:
    # A gang's learners share one label value (with locality) and one GPU type (unless the
    # gang may span types).
    groups: dict[tuple[str | None, str | None], int] = {}
    for node in nodes:
        if not node.schedulable or not job.accepts(node.gpu_type):
            continue
        value = None if job.same_label is None else node.labels.get(job.same_label)
        if job.same_label is not None and value is None:
            continue
        key = (value, None if job.spans_types else node.gpu_type)
        groups[key] = groups.get(key, 0) + slots(free[node.name], job.per_learner)
    return any(total >= job.learners for total in groups.values())


def free_after(
    snapshot: Snapshot, decisions: Decisions, without: AbstractSet[str] = frozenset()
) -> Free:
    free = capacity(snapshot.nodes)
    for job in snapshot.running:
        if job.id not in without:
            for lp in job.placement.learners:
                take(free, lp.node, job.per_learner)
    by_id = {q.id: q for q in snapshot.queued}
    for start in decisions.starts:
        for lp in start.placement.learners:
            take(free, lp.node, by_id[start.job_id].per_learner)
    return free


def queue(snapshot: Snapshot) -> list[QueuedJob]:
    return sorted(snapshot.queued, key=lambda j: (-j.priority, j.submitted_at, j.id))


def usable(job: QueuedJob, nodes: tuple[Node, ...]) -> set[str]:
    """Nodes the job could ever use; where its gang must pick one of several GPU types, only
    those of a type whose nodes could hold it."""
    kinds = sorted({n.gpu_type for n in nodes if job.accepts(n.gpu_type)})
    if job.spans_types or len(kinds) < 2:
        return _usable_among(job, [n for n in nodes if job.accepts(n.gpu_type)])
    empty = {n.name: [float(n.gpus), n.cpus, float(n.memory_mb)] for n in nodes}
    result: set[str] = set()
    for kind in kinds:
        of_kind = [n for n in nodes if n.gpu_type == kind]
        if sum(slots(empty[n.name], job.per_learner) for n in of_kind) >= job.learners:
            result |= _usable_among(job, of_kind)
    return result


def _usable_among(job: QueuedJob, nodes: list[Node]) -> set[str]:
    empty = {n.name: [float(n.gpus), n.cpus, float(n.memory_mb)] for n in nodes}
    single = {n.name for n in nodes if n.schedulable and slots(empty[n.name], job.per_learner) > 0}
    if job.same_label is None:
        return single
    result: set[str] = set()
    for value in {n.labels.get(job.same_label) for n in nodes} - {None}:
        group = [n for n in nodes if n.labels.get(job.same_label) == value]
        room = sum(slots(empty[n.name], job.per_learner) for n in group)
        if room >= job.learners:
            result |= {n.name for n in group} & single
    return result


# -- strategies -----------------------------------------------------------------------------


@st.composite
def cluster_nodes(draw: st.DrawFn) -> tuple[Node, ...]:
    count = draw(st.integers(1, 5))
    return tuple(
        Node(
            f"n{i}",
            draw(st.sampled_from([0, 1, 2, 4])),
            draw(st.sampled_from([2.0, 4.0, 8.0])),
            draw(st.sampled_from([4096, 16384])),
            draw(st.sampled_from(["v100", "a100"])),
            draw(st.sampled_from([{}, {"rack": "r1"}, {"rack": "r2"}])),
            draw(st.booleans()) or draw(st.booleans()) or draw(st.booleans()),
        )
        for i in range(count)
    )


@st.composite
def running_jobs(draw: st.DrawFn, nodes: tuple[Node, ...]) -> tuple[RunningJob, ...]:
    free = capacity(nodes)
    free_ids = {n.name: list(range(n.gpus)) for n in nodes}
    jobs = []
    for index in range(draw(st.integers(0, 6))):
        per = Resources(
            draw(st.sampled_from([0, 1, 2])),
            draw(st.sampled_from([0.5, 1.0, 2.0])),
            draw(st.sampled_from([512, 1024])),
        )
        learners = []
        for learner in range(draw(st.integers(1, 2))):
            node = draw(st.sampled_from(nodes))
            if slots(free[node.name], per) < 1:
                break
            take(free, node.name, per)
            ids = tuple(free_ids[node.name][: per.gpus])
            del free_ids[node.name][: per.gpus]
            learners.append(LearnerPlacement(learner + 1, node.name, ids))
        else:
            jobs.append(
                RunningJob(
                    f"run-{index}",
                    draw(st.sampled_from(TENANTS)),
                    draw(st.sampled_from([10, 50, 90])),
                    NOW - draw(st.floats(0, 7200)),
                    len(learners),
                    per,
                    Placement(tuple(learners)),
                    draw(st.none() | st.floats(60, 14400)),
                    draw(st.booleans()),
                )
            )
            continue
        # a learner did not fit: give its reservations back by skipping the job entirely
        for lp in learners:
            free[lp.node][0] += per.gpus
            free[lp.node][1] += per.cpus
            free[lp.node][2] += per.memory_mb
            free_ids[lp.node] = sorted(free_ids[lp.node] + list(lp.gpu_ids))
    return tuple(jobs)


@st.composite
def queued_jobs(draw: st.DrawFn, count: tuple[int, int] = (0, 7)) -> tuple[QueuedJob, ...]:
    return tuple(
        QueuedJob(
            f"q-{index}",
            draw(st.sampled_from(TENANTS)),
            draw(st.sampled_from([10, 50, 90])),
            NOW - draw(st.floats(0, 7200)),
            draw(st.integers(1, 3)),
            Resources(
                draw(st.sampled_from([0, 1, 2, 4])),
                draw(st.sampled_from([0.5, 1.0, 2.0])),
                draw(st.sampled_from([512, 1024, 4096])),
            ),
            draw(st.sampled_from([None, None, "v100", "a100"])),
            draw(st.sampled_from([None, "pack", "spread"])),
            draw(st.sampled_from([None, None, "rack"])),
            draw(st.none() | st.floats(60, 7200)),
            mix_gpu_types=draw(st.sampled_from([False, False, True])),
        )
        for index in range(draw(st.integers(*count)))
    )


@st.composite
def snapshots(draw: st.DrawFn, *, with_quotas: bool = True, typical: bool = True) -> Snapshot:
    nodes = draw(cluster_nodes())
    quotas: dict[str, TenantQuota] = {}
    if with_quotas:
        for tenant in draw(st.lists(st.sampled_from(TENANTS), unique=True, max_size=2)):
            quotas[tenant] = TenantQuota(
                tenant,
                draw(st.none() | st.integers(0, 6)),
                draw(st.none() | st.integers(0, 3)),
            )
    return Snapshot(
        NOW,
        nodes,
        draw(queued_jobs()),
        draw(running_jobs(nodes)),
        quotas,
        draw(st.sampled_from(["pack", "spread"])),
        draw(st.none() | st.just(1800.0)) if typical else None,
    )


# -- the properties -------------------------------------------------------------------------


def assert_valid(snapshot: Snapshot, result: Plan) -> None:
    decisions = result.decisions
    nodes = {n.name: n for n in snapshot.nodes}
    by_id = {q.id: q for q in snapshot.queued}
    started = [s.job_id for s in decisions.starts]
    waiting = [w.job_id for w in decisions.waiting]
    assert sorted(started + waiting) == sorted(by_id)
    order = [j.id for j in queue(snapshot) if j.id not in started]
    assert waiting == order
    assert [w.position for w in decisions.waiting] == list(range(1, len(waiting) + 1))

    ids_used: dict[str, set[int]] = {n: set() for n in nodes}
    for holder in snapshot.running:
        for lp in holder.placement.learners:
            ids_used[lp.node] |= set(lp.gpu_ids)
    for start in decisions.starts:
        job = by_id[start.job_id]
        learners = start.placement.learners
        assert [lp.learner for lp in learners] == list(range(1, job.learners + 1))
        for lp in learners:
            node = nodes[lp.node]
            assert node.schedulable
            assert job.accepts(node.gpu_type)
            assert len(lp.gpu_ids) == job.per_learner.gpus
            assert all(0 <= g < node.gpus for g in lp.gpu_ids)
            assert not ids_used[lp.node] & set(lp.gpu_ids)
            ids_used[lp.node] |= set(lp.gpu_ids)
        if job.same_label is not None:
            values = {nodes[lp.node].labels.get(job.same_label) for lp in learners}
            assert len(values) == 1 and None not in values
        if not job.spans_types:
            assert len({nodes[lp.node].gpu_type for lp in learners}) == 1
    for room in free_after(snapshot, decisions).values():
        assert room[0] >= 0 and room[1] >= -1e-9 and room[2] >= 0

    running = {r.id: r for r in snapshot.running}
    borrowing = overdrafts(snapshot.quotas, snapshot.running)
    victims = [p.job_id for p in decisions.preemptions]
    assert len(victims) == len(set(victims))
    for preempt in decisions.preemptions:
        victim, by = running[preempt.job_id], by_id[preempt.by]
        assert victim.preemptible
        assert victim.priority < by.priority or victim.tenant in borrowing
        assert preempt.reason.startswith(f"preempted by {by.id}")
        assert preempt.by in waiting
    # Preemptors in turn: what only borrowing made eligible leaves each tenant at its quota.
    taken: dict[str, list[RunningJob]] = {}
    for preemptor in dict.fromkeys(p.by for p in decisions.preemptions):
        anyway: dict[str, list[RunningJob]] = {}
        borrowed: dict[str, list[RunningJob]] = {}
        for preempt in decisions.preemptions:
            victim = running[preempt.job_id]
            if preempt.by == preemptor and victim.tenant in borrowing:
                only_borrowing = victim.priority >= by_id[preemptor].priority
                (borrowed if only_borrowing else anyway).setdefault(victim.tenant, []).append(
                    victim
                )
        for tenant, jobs in borrowed.items():
            before = [*taken.get(tenant, ()), *anyway.get(tenant, ())]
            assert borrowing[tenant].allows(before, jobs)
        for side in (anyway, borrowed):
            for tenant, jobs in side.items():
                taken.setdefault(tenant, []).extend(jobs)
    for preemptor in {p.by for p in decisions.preemptions}:
        mine = {p.job_id for p in decisions.preemptions if p.by == preemptor}
        assert fits(by_id[preemptor], free_after(snapshot, decisions, mine), snapshot.nodes)


@settings(max_examples=300, deadline=None)
@given(snapshots(), st.booleans(), st.booleans())
def test_decisions_are_always_valid(snapshot: Snapshot, backfill: bool, preemption: bool) -> None:
    assert_valid(snapshot, plan(snapshot, backfill=backfill, preemption=preemption))


@settings(max_examples=300, deadline=None)
@given(snapshots(with_quotas=False), st.booleans())
def test_higher_priority_that_fits_never_waits_while_lower_priority_starts(
    snapshot: Snapshot, backfill: bool
) -> None:
    result = plan(snapshot, backfill=backfill, preemption=False, aging_threshold_s=10**9)
    decisions = result.decisions
    free = free_after(snapshot, decisions)
    by_id = {q.id: q for q in snapshot.queued}
    started = [by_id[s.job_id] for s in decisions.starts]
    order = queue(snapshot)
    for wait in decisions.waiting:
        job = by_id[wait.job_id]
        if never_fits(job, snapshot.nodes) is not None or not fits(job, free, snapshot.nodes):
            continue
        lower = [s for s in started if s.priority < job.priority]
        if not lower:
            continue
        # it fits what is left, yet a lower-priority job started: only a reservation for a
        # job ahead of it (of at least its priority) may hold it back
        reservation = result.reservation
        assert backfill and reservation is not None
        head = by_id[reservation.job_id]
        assert order.index(head) < order.index(job) and head.priority >= job.priority
        assert wait.reason.startswith("behind")


@settings(max_examples=300, deadline=None)
@given(snapshots(with_quotas=False, typical=False))
def test_backfill_never_delays_the_heads_reservation(snapshot: Snapshot) -> None:
    result = plan(snapshot, preemption=False, aging_threshold_s=10**9)
    if result.reservation is None:
        return
    by_id = {q.id: q for q in snapshot.queued}
    head = by_id[result.reservation.job_id]
    order = queue(snapshot)
    later = [s for s in result.decisions.starts if order.index(by_id[s.job_id]) > order.index(head)]
    at = result.reservation.at
    if at is None:
        forbidden = usable(head, snapshot.nodes)
        for start in later:
            assert not set(start.placement.nodes) & forbidden
        return
    # what is free at the reserved time: everything ends that is expected to end by then
    free = capacity(snapshot.nodes)
    for holder in snapshot.running:
        duration = holder.expected_duration_s
        if duration is None or holder.started_at + duration > at:
            for lp in holder.placement.learners:
                take(free, lp.node, holder.per_learner)
    for start in result.decisions.starts:
        job = by_id[start.job_id]
        duration = job.expected_duration_s
        if duration is None or NOW + duration > at:
            for lp in start.placement.learners:
                take(free, lp.node, job.per_learner)
    assert fits(head, free, snapshot.nodes)


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_quotas_hold_except_for_borrowing_on_capacity_nobody_within_quota_wants(
    snapshot: Snapshot,
) -> None:
    result = plan(snapshot, preemption=False)
    by_id = {q.id: q for q in snapshot.queued}
    usage = {t: [0, 0] for t in TENANTS}
    for holder in snapshot.running:
        usage[holder.tenant][0] += holder.total.gpus
        usage[holder.tenant][1] += 1
    for start in result.decisions.starts:  # in the order they were decided
        job = by_id[start.job_id]
        usage[job.tenant][0] += job.total.gpus
        usage[job.tenant][1] += 1
        quota = snapshot.quotas.get(job.tenant)
        over = quota is not None and (
            (quota.max_gpus is not None and usage[job.tenant][0] > quota.max_gpus)
            or (
                quota.max_running_jobs is not None and usage[job.tenant][1] > quota.max_running_jobs
            )
        )
        if over:
            assert job.id in result.borrowed
    for borrowed in result.borrowed:
        start = next(s for s in result.decisions.starts if s.job_id == borrowed)
        for wait in result.decisions.waiting:
            other = by_id[wait.job_id]
            if wait.reason.startswith("tenant ") or never_fits(other, snapshot.nodes):
                continue
            assert not set(start.placement.nodes) & usable(other, snapshot.nodes)


@st.composite
def preemption_cases(draw: st.DrawFn) -> Snapshot:
    nodes = draw(cluster_nodes())
    running = tuple(replace(r, preemptible=True) for r in draw(running_jobs(nodes)))
    job = draw(queued_jobs(count=(1, 1)))[0]
    return Snapshot(NOW, nodes, (replace(job, priority=draw(st.sampled_from([50, 90]))),), running)


@settings(max_examples=500, deadline=None)
@given(preemption_cases())
def test_preemption_picks_a_smallest_sufficient_set_of_lower_priority_jobs(
    snapshot: Snapshot,
) -> None:
    job = snapshot.queued[0]
    decisions = plan(snapshot).decisions
    if decisions.starts:
        assert not decisions.preemptions
        return
    eligible = [r.id for r in snapshot.running if r.priority < job.priority]
    victims = {p.job_id for p in decisions.preemptions}
    assert victims <= set(eligible)

    def fits_without(ids: set[str]) -> bool:
        return fits(job, free_after(snapshot, decisions, ids), snapshot.nodes)

    if not victims:
        assert not fits_without(set(eligible))
        return
    assert fits_without(victims)
    for size in range(1, len(victims)):
        for smaller in combinations(eligible, size):
            assert not fits_without(set(smaller))
