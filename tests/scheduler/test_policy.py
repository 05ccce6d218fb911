"""Named scenarios for one scheduling pass: gangs, priorities, backfill, aging, reasons, ETAs."""

from __future__ import annotations

import gc

from ffdl.core.resources import LearnerPlacement, Node, Placement, Resources
from ffdl.scheduler.policy import plan, schedule
from ffdl.scheduler.snapshot import Decisions, QueuedJob, RunningJob, Snapshot

NOW = 100_000.0


def node(
    name: str,
    gpus: int = 4,
    *,
    gpu_type: str = "",
    labels: dict[str, str] | None = None,
    schedulable: bool = True,
) -> Node:
    return Node(name, gpus, 32.0, 131072, gpu_type, labels or {}, schedulable)


def queued(
    job_id: str,
    learners: int = 1,
    gpus: int = 1,
    *,
    priority: int = 50,
    at: float = 0.0,
    tenant: str = "t",
    gpu_type: str | None = None,
    placement_policy: str | None = None,
    same_label: str | None = None,
    expected_duration_s: float | None = None,
) -> QueuedJob:
    return QueuedJob(
        job_id,
        tenant,
        priority,
        NOW - 600 + at,
        learners,
        Resources(gpus, 1.0, 1024),
        gpu_type,
        placement_policy,
        same_label,
        expected_duration_s,
    )


def running(
    job_id: str,
    where: list[tuple[str, tuple[int, ...]]],
    *,
    priority: int = 50,
    started: float = NOW - 100,
    duration: float | None = None,
    tenant: str = "t",
    preemptible: bool = True,
) -> RunningJob:
    learners = tuple(LearnerPlacement(i + 1, name, ids) for i, (name, ids) in enumerate(where))
    return RunningJob(
        job_id,
        tenant,
        priority,
        started,
        len(where),
        Resources(len(where[0][1]), 1.0, 1024),
        Placement(learners),
        duration,
        preemptible,
    )


def started(decisions: Decisions) -> list[str]:
    return [s.job_id for s in decisions.starts]


def waiting(decisions: Decisions) -> dict[str, tuple[int, str]]:
    return {w.job_id: (w.position, w.reason) for w in decisions.waiting}


def test_talks_deadlock_example_two_nodes_starts_two_whole_gangs() -> None:
    jobs = tuple(queued(f"j{i}", learners=4, gpus=1, at=i) for i in range(4))
    decisions = schedule(Snapshot(NOW, (node("a"), node("b")), jobs))
    assert started(decisions) == ["j0", "j1"]
    assert [len(s.placement.learners) for s in decisions.starts] == [4, 4]
    # pack: each gang on a single node, no node shared between the two gangs
    assert [s.placement.nodes for s in decisions.starts] == [("a",), ("b",)]
    assert {w.job_id: w.position for w in decisions.waiting} == {"j2": 1, "j3": 2}


def test_talks_deadlock_example_one_eight_gpu_node() -> None:
    jobs = tuple(queued(f"j{i}", learners=4, gpus=1, at=i) for i in range(4))
    decisions = schedule(Snapshot(NOW, (node("big", gpus=8),), jobs))
    assert started(decisions) == ["j0", "j1"]
    ids = [lp.gpu_ids for s in decisions.starts for lp in s.placement.learners]
    assert sorted(g for t in ids for g in t) == list(range(8))


def test_spread_puts_one_learner_per_node_and_pack_fills_one_node() -> None:
    nodes = tuple(node(n) for n in "abcd")
    spread = queued("s", learners=2, gpus=2, placement_policy="spread")
    pack = queued("p", learners=2, gpus=2, placement_policy="pack")
    assert schedule(Snapshot(NOW, nodes, (spread,))).starts[0].placement.nodes == ("a", "b")
    assert schedule(Snapshot(NOW, nodes, (pack,))).starts[0].placement.nodes == ("a",)


def test_pack_prefers_the_fullest_node_that_fits() -> None:
    nodes = (node("a"), node("b"))
    busy = running("r", [("b", (0, 1, 2))])
    decisions = schedule(Snapshot(NOW, nodes, (queued("x"),), (busy,)))
    assert decisions.starts[0].placement.learners[0] == LearnerPlacement(1, "b", (3,))


def test_default_placement_comes_from_the_snapshot() -> None:
    nodes = tuple(node(n) for n in "ab")
    job = queued("x", learners=2)
    assert schedule(Snapshot(NOW, nodes, (job,))).starts[0].placement.nodes == ("a",)
    spread = Snapshot(NOW, nodes, (job,), default_placement="spread")
    assert schedule(spread).starts[0].placement.nodes == ("a", "b")


def test_locality_keeps_the_gang_within_one_rack() -> None:
    nodes = (
        node("a1", labels={"rack": "r1"}),
        node("b1", labels={"rack": "r2"}),
        node("b2", labels={"rack": "r2"}),
    )
    job = queued("x", learners=3, gpus=2, same_label="rack")
    placement = schedule(Snapshot(NOW, nodes, (job,))).starts[0].placement
    assert placement.nodes == ("b1", "b2")


def test_locality_waits_when_no_single_rack_has_room_and_says_so() -> None:
    nodes = (node("a1", labels={"rack": "r1"}), node("b1", labels={"rack": "r2"}))
    busy = (running("r1", [("a1", (0, 1))]), running("r2", [("b1", (0, 1))]))
    local = queued("x", learners=2, gpus=2, same_label="rack")
    decisions = schedule(Snapshot(NOW, nodes, (local,), busy))
    assert started(decisions) == []
    assert "rack=" in decisions.waiting[0].reason
    anywhere = queued("x", learners=2, gpus=2)
    assert started(schedule(Snapshot(NOW, nodes, (anywhere,), busy))) == ["x"]


def test_gpu_type_is_respected() -> None:
    nodes = (node("k", gpu_type="k80"), node("v", gpu_type="v100"))
    job = queued("x", learners=2, gpus=2, gpu_type="v100")
    assert schedule(Snapshot(NOW, nodes, (job,))).starts[0].placement.nodes == ("v",)


def test_waiting_on_hosts_without_gpus_names_cpu_slots() -> None:
    nodes = (node("a", gpus=2, gpu_type="cpu"), node("b", gpus=2, gpu_type="cpu"))
    busy = (running("r", [("a", (0,)), ("b", (0,))]),)
    decisions = schedule(Snapshot(NOW, nodes, (queued("x", gpus=2),), busy))
    assert decisions.waiting[0].reason.startswith(
        "needs 2 CPU slots on one node; largest free block is 1"
    ), decisions.waiting


def test_unschedulable_nodes_take_no_new_work() -> None:
    nodes = (node("cordoned", schedulable=False), node("ok", gpus=1))
    decisions = schedule(Snapshot(NOW, nodes, (queued("x", gpus=2),)))
    assert started(decisions) == []
    # The drain is why it waits: the reason says so first.
    assert decisions.waiting[0].reason.startswith("node cordoned is drained; needs 2 GPUs")
    # A drained node too small for the job is not why it waits, and goes unnamed.
    too_big = queued("y", gpus=16)
    reason = schedule(Snapshot(NOW, nodes, (too_big,))).waiting[0].reason
    assert "drained" not in reason and reason.startswith("needs 16 GPUs"), reason


def test_higher_priority_first_then_fifo_then_id() -> None:
    jobs = (
        queued("late-high", priority=90, at=50),
        queued("early-low", priority=10, at=0),
        queued("b", priority=50, at=10),
        queued("a", priority=50, at=10),
    )
    decisions = schedule(Snapshot(NOW, (node("n", gpus=2),), jobs))
    assert started(decisions) == ["late-high", "a"]
    assert waiting(decisions)["b"][0] == 1
    assert waiting(decisions)["early-low"][0] == 2


def test_backfill_fills_capacity_the_head_cannot_use() -> None:
    nodes = (node("a"), node("small", gpus=1))
    busy = running("r", [("a", (0, 1))], duration=3600)
    head = queued("head", gpus=4, priority=90)
    filler = queued("filler", gpus=1, priority=10, at=5)
    result = plan(Snapshot(NOW, nodes, (head, filler), (busy,)), preemption=False)
    assert result.reservation is not None and result.reservation.job_id == "head"
    assert result.reservation.at == NOW - 100 + 3600
    assert started(result.decisions) == ["filler"]
    assert result.decisions.starts[0].placement.nodes == ("small",)
    reason = waiting(result.decisions)["head"][1]
    assert "reserved: waiting for r to finish (expected in 58 min)" in reason


def test_backfill_never_takes_the_heads_reserved_gpus_unless_it_ends_first() -> None:
    nodes = (node("a"),)
    busy = running("r", [("a", (0, 1))], duration=1000)  # ends at NOW + 900
    head = queued("head", gpus=4, priority=90)
    long_job = queued("long", gpus=2, priority=10, at=1, expected_duration_s=5000)
    short_job = queued("short", gpus=2, priority=10, at=2, expected_duration_s=600)
    decisions = schedule(
        Snapshot(NOW, nodes, (head, long_job, short_job), (busy,)), preemption=False
    )
    assert started(decisions) == ["short"]
    assert waiting(decisions)["long"][1].startswith("behind 1 higher-priority job")


def test_without_backfill_nothing_passes_a_blocked_head() -> None:
    nodes = (node("a"), node("small", gpus=1))
    busy = running("r", [("a", (0, 1))], duration=3600)
    jobs = (queued("head", gpus=4, priority=90), queued("filler", gpus=1, priority=10))
    assert (
        started(schedule(Snapshot(NOW, nodes, jobs, (busy,)), backfill=False, preemption=False))
        == []
    )
    assert started(
        schedule(Snapshot(NOW, nodes, jobs, (busy,)), backfill=True, preemption=False)
    ) == ["filler"]


def test_unknown_reservation_only_backfills_where_the_head_cannot_go() -> None:
    nodes = (node("a"), node("b", gpu_type="k80"))
    busy = running("r", [("a", (0, 1))])  # no expected duration: the head's time is unknown
    head = queued("head", gpus=4, priority=90, gpu_type="")
    on_a = queued("on-a", gpus=1, priority=10, at=1, gpu_type="")
    on_b = queued("on-b", gpus=1, priority=10, at=2, gpu_type="k80")
    result = plan(Snapshot(NOW, nodes, (head, on_a, on_b), (busy,)), preemption=False)
    assert result.reservation is not None and result.reservation.at is None
    assert started(result.decisions) == ["on-b"]


def test_an_aged_job_blocks_backfill_onto_its_nodes() -> None:
    nodes = (node("a"), node("b"))
    busy = (
        running("r1", [("a", (0, 1, 2, 3))], duration=3600),
        running("r2", [("b", (0, 1))], duration=3600),
    )
    head = queued("head", learners=2, gpus=4, priority=90)
    old = QueuedJob("old", "t", 50, NOW - 7200, 1, Resources(4, 1.0, 1024))
    short = queued("short", gpus=1, priority=10, expected_duration_s=60)
    snap = Snapshot(NOW, nodes, (head, old, short), busy)
    # the short job ends long before the head's reservation, so it may backfill ...
    assert started(schedule(snap, aging_threshold_s=10**9, preemption=False)) == ["short"]
    # ... unless a job that has waited past the aging threshold could use those nodes
    decisions = schedule(snap, aging_threshold_s=3600, preemption=False)
    assert started(decisions) == []
    assert waiting(decisions)["short"][1] == "behind 2 higher-priority jobs"


def test_never_fitting_job_waits_with_its_reason_and_blocks_nobody() -> None:
    nodes = (node("a", gpus=2),)
    jobs = (queued("huge", learners=8, gpus=2, priority=90), queued("ok", priority=10))
    decisions = schedule(Snapshot(NOW, nodes, jobs))
    assert started(decisions) == ["ok"]
    assert waiting(decisions)["huge"] == (1, "needs 16 GPUs in total but the cluster has 2")
    assert decisions.waiting[0].eta_s is None


def test_reasons_name_the_numbers() -> None:
    nodes = (node("a"), node("b"))
    busy = (
        running("r1", [("a", (0, 1, 2))], duration=600),
        running("r2", [("b", (0, 1, 2))], duration=1200),
    )
    jobs = (queued("gang", learners=2, gpus=4, priority=90), queued("one", gpus=2, priority=80))
    decisions = schedule(Snapshot(NOW, nodes, jobs, busy), preemption=False)
    reasons = waiting(decisions)
    assert reasons["gang"][1] == (
        "needs 2 learners × 4 GPUs; 2 GPUs free on 2 nodes; "
        "reserved: waiting for r2 and 1 other job to finish (expected in 18 min)"
    )
    assert reasons["one"][1] == "needs 2 GPUs on one node; largest free block is 1"


def test_positions_count_only_jobs_that_did_not_start() -> None:
    nodes = (node("a", gpus=2),)
    jobs = tuple(queued(f"j{i}", gpus=1, at=i) for i in range(5))
    decisions = schedule(Snapshot(NOW, nodes, jobs))
    assert started(decisions) == ["j0", "j1"]
    assert [(w.job_id, w.position) for w in decisions.waiting] == [("j2", 1), ("j3", 2), ("j4", 3)]


def test_etas_follow_expected_ends_and_the_queue() -> None:
    nodes = (node("a", gpus=2),)
    busy = running("r", [("a", (0, 1))], started=NOW, duration=600)
    jobs = (
        queued("first", gpus=2, at=0, expected_duration_s=300),
        queued("second", gpus=2, at=1, expected_duration_s=300),
    )
    decisions = schedule(Snapshot(NOW, nodes, jobs, (busy,)))
    etas = {w.job_id: w.eta_s for w in decisions.waiting}
    assert etas == {"first": 600.0, "second": 900.0}


def test_eta_is_unknown_when_running_jobs_have_no_expected_duration() -> None:
    nodes = (node("a", gpus=2),)
    busy = running("r", [("a", (0, 1))])
    decisions = schedule(Snapshot(NOW, nodes, (queued("x", gpus=2),), (busy,)))
    assert decisions.waiting[0].eta_s is None
    assert decisions.waiting[0].eta_reason == "running jobs have no expected duration"
    typical = Snapshot(NOW, nodes, (queued("x", gpus=2),), (busy,), typical_duration_s=1000)
    assert schedule(typical).waiting[0].eta_s == 900.0


def test_same_snapshot_same_decisions() -> None:
    nodes = tuple(node(n, labels={"rack": n[0]}) for n in ("a1", "a2", "b1"))
    busy = (running("r", [("a1", (0,))], duration=50),)
    jobs = tuple(queued(f"j{i}", learners=1 + i % 3, gpus=1 + i % 2, at=i) for i in range(9))
    snap = Snapshot(NOW, nodes, jobs, busy)
    assert schedule(snap) == schedule(snap)


def test_a_pass_leaves_the_garbage_collector_as_it_found_it() -> None:
    snap = Snapshot(NOW, (node("a"),), (queued("x"),))
    try:
        gc.disable()
        schedule(snap)
        assert not gc.isenabled()
        gc.enable()
        schedule(snap)
        assert gc.isenabled()
    finally:
        gc.enable()


def test_a_head_waiting_on_an_overrunning_job_says_so() -> None:
    busy = running("late", [("a", (0, 1))], started=NOW - 1000, duration=500)
    decisions = schedule(
        Snapshot(NOW, (node("a"),), (queued("x", gpus=4),), (busy,)), preemption=False
    )
    assert decisions.waiting[0].reason.endswith(
        "reserved: waiting for late to finish (already past its expected end)"
    )
    assert decisions.waiting[0].eta_s == 0.0
