"""Tenant quotas: the check, borrowing idle capacity, and reclaiming it first."""

from __future__ import annotations

from ffdl.core.resources import LearnerPlacement, Node, Placement, Resources
from ffdl.scheduler.policy import plan, schedule
from ffdl.scheduler.quota import QuotaBook, overdrafts
from ffdl.scheduler.snapshot import QueuedJob, RunningJob, Snapshot, TenantQuota

NOW = 10_000.0


def nodes(*gpus: int, gpu_type: str = "") -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", g, 64.0, 262144, gpu_type) for i, g in enumerate(gpus))


def queued(
    job_id: str,
    tenant: str,
    gpus: int = 1,
    *,
    priority: int = 50,
    at: float = 0.0,
    gpu_type: str | None = None,
) -> QueuedJob:
    return QueuedJob(
        job_id, tenant, priority, NOW - 100 + at, 1, Resources(gpus, 1.0, 1024), gpu_type
    )


def running(
    job_id: str,
    tenant: str,
    node: str,
    gpu_ids: tuple[int, ...],
    *,
    priority: int = 50,
    started: float = NOW - 1000,
) -> RunningJob:
    return RunningJob(
        job_id,
        tenant,
        priority,
        started,
        1,
        Resources(len(gpu_ids), 1.0, 1024),
        Placement((LearnerPlacement(1, node, gpu_ids),)),
    )


def test_quota_reasons_name_the_limit() -> None:
    quotas = {"a": TenantQuota("a", max_gpus=4, max_running_jobs=2)}
    book = QuotaBook(quotas, (running("r1", "a", "n0", (0, 1, 2)),), None)
    assert book.over_quota(queued("x", "a", 1)) is None
    assert book.over_quota(queued("x", "a", 2)) == (
        "tenant a is at its quota of 4 GPUs (3 in use, this job needs 2)"
    )
    book.charge("a", 1, None)
    assert book.over_quota(queued("x", "a", 0)) == "tenant a is at its quota of 2 running jobs"
    assert book.over_quota(queued("x", "nobody-limits-me", 99)) is None


def test_overdrafts_name_the_quota_a_tenant_exceeds() -> None:
    quotas = {"a": TenantQuota("a", max_gpus=4), "b": TenantQuota("b", max_running_jobs=1)}
    jobs = (
        running("first", "a", "n0", (0, 1), started=1.0),
        running("second", "a", "n0", (2, 3), started=2.0),
        running("third", "a", "n1", (0,), started=3.0),
        running("other", "b", "n1", (1, 2, 3), started=0.0),
        running("free", "c", "n2", (0,), started=0.0),
    )
    found = overdrafts(quotas, jobs)
    assert list(found) == ["a"]
    assert (found["a"].jobs, found["a"].gpus) == (3, 5)
    assert found["a"].reason == "tenant a is over its quota of 4 GPUs"


def test_an_overdraft_allows_taking_back_only_what_was_borrowed() -> None:
    quotas = {"a": TenantQuota("a", max_gpus=4, max_running_jobs=2)}
    one, two, three = (
        running("one", "a", "n0", (0,)),
        running("two", "a", "n0", (1, 2)),
        running("three", "a", "n1", (0, 1, 2)),
    )
    overdraft = overdrafts(quotas, (one, two, three))["a"]  # 3 jobs and 6 GPUs
    assert overdraft.allows([], [])
    assert overdraft.allows([], [three])  # 3 jobs: over both quotas
    # One at a time, largest last: without "one", 2 jobs and 5 GPUs are still over 4 GPUs.
    assert overdraft.allows([], [one, three])
    # Without "two" (or "three") first, the tenant holds 4 GPUs or fewer: within quota.
    assert not overdraft.allows([], [two, three])
    assert overdraft.allows([one], [two])  # "one" taken anyway: 5 GPUs left, still over
    assert not overdraft.allows([two], [one])  # "two" taken anyway: 4 GPUs left, within
    assert not overdraft.allows([one, two], [three])


def test_reclaim_takes_the_borrowing_tenants_job_where_room_is_needed() -> None:
    # Tenant a may run 2 jobs and runs 3. Reclaiming the one started last would free half
    # of n0; reclaiming the one alone on n1 frees a whole node.
    quotas = {"a": TenantQuota("a", max_running_jobs=2)}
    busy = (
        running("a-first", "a", "n0", (0, 1), started=1.0),
        running("a-alone", "a", "n1", (0, 1), started=2.0),
        running("a-last", "a", "n0", (2, 3), started=3.0),
    )
    decisions = schedule(Snapshot(NOW, nodes(4, 4), (queued("b", "b", 4),), busy, quotas))
    assert [p.job_id for p in decisions.preemptions] == ["a-alone"]
    assert decisions.preemptions[0].reason == (
        "preempted by b to reclaim capacity it borrowed (tenant a is over its quota of 2 "
        "running jobs)"
    )


def test_reclaim_never_takes_a_tenant_below_its_quota() -> None:
    quotas = {"a": TenantQuota("a", max_running_jobs=1)}
    busy = (running("a1", "a", "n0", (0, 1)), running("a2", "a", "n0", (2, 3)))
    decisions = schedule(Snapshot(NOW, nodes(4), (queued("b", "b", 4),), busy, quotas))
    assert decisions.preemptions == ()
    # A lower-priority job of the same tenant is taken by priority; then nothing is left
    # borrowed, so the other cannot be reclaimed on top.
    busy = (running("a1", "a", "n0", (0, 1), priority=10), running("a2", "a", "n0", (2, 3)))
    decisions = schedule(Snapshot(NOW, nodes(4), (queued("b", "b", 4),), busy, quotas))
    assert decisions.preemptions == ()


def test_preemptors_of_one_pass_together_reclaim_no_more_than_was_borrowed() -> None:
    quotas = {"a": TenantQuota("a", max_running_jobs=1)}
    busy = (
        running("a1", "a", "n0", (0, 1), started=1.0),
        running("a2", "a", "n1", (0, 1), started=2.0),  # started last: preferred
    )
    jobs = (queued("b1", "b", 2, at=1), queued("b2", "b", 2, at=2))
    decisions = schedule(Snapshot(NOW, nodes(2, 2), jobs, busy, quotas))
    assert [(p.job_id, p.by) for p in decisions.preemptions] == [("a2", "b1")]


def test_over_quota_job_borrows_idle_capacity_when_nobody_within_quota_waits() -> None:
    quotas = {"a": TenantQuota("a", max_running_jobs=1)}
    busy = (running("r", "a", "n0", (0,)),)
    result = plan(Snapshot(NOW, nodes(4), (queued("x", "a"),), busy, quotas))
    assert [s.job_id for s in result.decisions.starts] == ["x"]
    assert result.borrowed == ("x",)


def test_over_quota_job_does_not_borrow_what_a_tenant_within_quota_waits_for() -> None:
    quotas = {"a": TenantQuota("a", max_running_jobs=1)}
    busy = (running("r", "a", "n0", (0, 1)),)
    jobs = (
        queued("b-big", "b", 4, priority=90),  # within quota (b has none), does not fit now
        queued("a-small", "a", 1, priority=10),
    )
    decisions = schedule(Snapshot(NOW, nodes(4), jobs, busy, quotas), preemption=False)
    assert decisions.starts == ()
    reasons = {w.job_id: w.reason for w in decisions.waiting}
    assert reasons["a-small"] == (
        "tenant a is at its quota of 1 running job; idle capacity cannot be borrowed while "
        "jobs within their quota wait for it"
    )


def test_borrowing_uses_only_nodes_waiting_tenants_cannot_use() -> None:
    quotas = {"a": TenantQuota("a", max_gpus=1)}
    cluster = (*nodes(4, gpu_type="v100"), Node("k", 2, 64.0, 262144, "k80"))
    busy = (running("r", "a", "n0", (0,)),)
    jobs = (
        queued("b-big", "b", 4, priority=90, gpu_type="v100"),
        queued("a-v100", "a", 1, gpu_type="v100"),
        queued("a-any", "a", 1, at=1),
    )
    result = plan(Snapshot(NOW, cluster, jobs, busy, quotas), preemption=False)
    assert [(s.job_id, s.placement.nodes) for s in result.decisions.starts] == [("a-any", ("k",))]
    assert result.borrowed == ("a-any",)


def test_quota_counts_starts_of_the_same_pass() -> None:
    quotas = {"a": TenantQuota("a", max_running_jobs=2)}
    jobs = (
        queued("a1", "a", at=1),
        queued("a2", "a", at=2),
        queued("a3", "a", at=3),
        queued("b1", "b", 4, priority=90, at=0),
    )
    # n0 holds b1 (4 GPUs) or the a jobs; b1 goes first and fills it; a1, a2 go to n1 (2 GPUs)
    result = plan(Snapshot(NOW, nodes(4, 2), jobs, (), quotas))
    assert [s.job_id for s in result.decisions.starts] == ["b1", "a1", "a2"]
    waiting = {w.job_id: w.reason for w in result.decisions.waiting}
    assert waiting["a3"].startswith("tenant a is at its quota of 2 running jobs; it may borrow")


def test_borrowers_are_reclaimed_first_even_at_a_higher_priority() -> None:
    quotas = {"a": TenantQuota("a", max_gpus=2)}
    busy = (
        running("a-in-quota", "a", "n0", (0, 1), priority=90, started=1.0),
        running("a-borrowed", "a", "n1", (0, 1), priority=90, started=2.0),
        running("c-low", "c", "n2", (0, 1), priority=10, started=3.0),
    )
    decisions = schedule(Snapshot(NOW, nodes(2, 2, 2), (queued("b", "b", 2),), busy, quotas))
    assert [p.job_id for p in decisions.preemptions] == ["a-borrowed"]
    assert decisions.preemptions[0].reason == (
        "preempted by b to reclaim capacity it borrowed (tenant a is over its quota of 2 GPUs)"
    )
    assert decisions.waiting[0].reason == (
        "waiting for 1 preempted job to checkpoint (1 of them reclaimed from borrowed capacity)"
    )


def test_over_quota_jobs_never_preempt() -> None:
    quotas = {"a": TenantQuota("a", max_running_jobs=0)}
    busy = (running("low", "c", "n0", (0, 1), priority=10),)
    decisions = schedule(Snapshot(NOW, nodes(2), (queued("a", "a", 2, priority=90),), busy, quotas))
    assert decisions.preemptions == ()
    assert decisions.waiting[0].reason.startswith("tenant a is at its quota of 0 running jobs")
