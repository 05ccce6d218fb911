"""Preemption: who may be a victim, the fewest victims, holding the room, never a loop."""

from __future__ import annotations

from ffdl.core.resources import LearnerPlacement, Node, Placement, Resources
from ffdl.scheduler.policy import schedule
from ffdl.scheduler.snapshot import QueuedJob, RunningJob, Snapshot

NOW = 50_000.0


def nodes(*gpus: int) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", g, 64.0, 262144) for i, g in enumerate(gpus))


def queued(job_id: str, gpus: int, learners: int = 1, priority: int = 90) -> QueuedJob:
    return QueuedJob(job_id, "t", priority, NOW - 10, learners, Resources(gpus, 1.0, 1024))


def running(
    job_id: str,
    node: str,
    gpu_ids: tuple[int, ...],
    *,
    priority: int = 10,
    started: float = NOW - 1000,
    preemptible: bool = True,
) -> RunningJob:
    return RunningJob(
        job_id,
        "t",
        priority,
        started,
        1,
        Resources(len(gpu_ids), 1.0, 1024),
        Placement((LearnerPlacement(1, node, gpu_ids),)),
        preemptible=preemptible,
    )


def test_preempts_the_fewest_jobs_that_make_room() -> None:
    busy = (
        running("small-1", "n0", (0,)),
        running("small-2", "n0", (1,)),
        running("big", "n1", (0, 1, 2, 3), priority=20),
        running("rest", "n0", (2, 3), priority=20),
    )
    decisions = schedule(Snapshot(NOW, nodes(4, 4), (queued("hi", 4),), busy))
    # one victim (big) beats three (small-1, small-2 and rest), though big has a higher priority
    assert [p.job_id for p in decisions.preemptions] == ["big"]
    assert decisions.preemptions[0].by == "hi"
    assert decisions.preemptions[0].reason == "preempted by hi"
    assert decisions.starts == ()
    assert decisions.waiting[0].reason == "waiting for 1 preempted job to checkpoint"


def test_among_equal_counts_lowest_priority_then_newest_is_chosen() -> None:
    busy = (
        running("old-low", "n0", (0, 1), priority=10, started=NOW - 5000),
        running("new-low", "n1", (0, 1), priority=10, started=NOW - 100),
        running("mid", "n2", (0, 1), priority=30),
    )
    decisions = schedule(Snapshot(NOW, nodes(2, 2, 2), (queued("hi", 2),), busy))
    assert [p.job_id for p in decisions.preemptions] == ["new-low"]


def test_never_preempts_equal_or_higher_priority_or_unpreemptible_jobs() -> None:
    busy = (
        running("same", "n0", (0, 1), priority=90),
        running("higher", "n1", (0, 1), priority=95),
        running("pinned", "n2", (0, 1), priority=10, preemptible=False),
    )
    decisions = schedule(Snapshot(NOW, nodes(2, 2, 2), (queued("hi", 2),), busy))
    assert decisions.preemptions == ()


def test_preempts_nothing_when_no_victim_set_makes_it_fit() -> None:
    busy = (
        running("low", "n0", (0, 1)),
        running("pinned", "n1", (0, 1), preemptible=False),
    )
    decisions = schedule(Snapshot(NOW, nodes(2, 2), (queued("hi", 2, learners=2),), busy))
    assert decisions.preemptions == ()
    assert decisions.waiting[0].reason.startswith("needs 2 learners × 2 GPUs")


def test_preempted_room_is_not_reused_in_the_same_pass() -> None:
    busy = (running("low", "n0", (0, 1, 2, 3)),)
    jobs = (queued("hi", 4), queued("next", 1, priority=50))
    decisions = schedule(Snapshot(NOW, nodes(4), jobs, busy))
    assert [p.job_id for p in decisions.preemptions] == ["low"]
    assert decisions.starts == ()


def test_preemptor_holds_the_free_part_of_its_room() -> None:
    # hi needs 4 GPUs on one node: 2 free + 2 from the victim; the 2 free ones are held
    busy = (running("low", "n0", (0, 1)),)
    jobs = (queued("hi", 4), queued("next", 1, priority=50))
    decisions = schedule(Snapshot(NOW, nodes(4), jobs, busy))
    assert [p.job_id for p in decisions.preemptions] == ["low"]
    assert decisions.starts == ()
    # once the victim has halted, the preemptor fits and starts
    after = schedule(Snapshot(NOW + 60, nodes(4), jobs))
    assert [s.job_id for s in after.starts] == ["hi"]


def test_each_victim_is_taken_by_one_preemptor_only() -> None:
    busy = (running("a", "n0", (0, 1)), running("b", "n1", (0, 1)))
    jobs = (queued("p1", 2, priority=90), queued("p2", 2, priority=80))
    decisions = schedule(Snapshot(NOW, nodes(2, 2), jobs, busy))
    by = {p.job_id: p.by for p in decisions.preemptions}
    assert sorted(by) == ["a", "b"]
    assert sorted(by.values()) == ["p1", "p2"]


def test_preemption_can_be_switched_off_and_capped() -> None:
    busy = (running("a", "n0", (0, 1)), running("b", "n1", (0, 1)))
    jobs = (queued("p1", 2, priority=90), queued("p2", 2, priority=80))
    snap = Snapshot(NOW, nodes(2, 2), jobs, busy)
    assert schedule(snap, preemption=False).preemptions == ()
    assert [p.by for p in schedule(snap, max_preemptors=1).preemptions] == ["p1"]


def test_a_gang_preempts_across_nodes() -> None:
    busy = (
        running("x", "n0", (0, 1)),
        running("y", "n1", (0, 1)),
        running("z", "n2", (0,)),
    )
    decisions = schedule(Snapshot(NOW, nodes(2, 2, 2), (queued("hi", 2, learners=2),), busy))
    # any two victims make room for two learners; among equal counts the preference order
    # (equal priority and start here, so by id) picks x and y
    assert [p.job_id for p in decisions.preemptions] == ["x", "y"]
