"""Mixed GPU types: a gang on GPUs of one type unless it allows more, a job only on the types
it accepts (its first choice first), and preemption that frees room of one type."""

from __future__ import annotations

from dataclasses import replace

from ffdl.core.resources import LearnerPlacement, Node, Placement, Resources
from ffdl.scheduler.free import FreeState
from ffdl.scheduler.placement import PACK, SPREAD, find_nodes, never_fits
from ffdl.scheduler.policy import schedule
from ffdl.scheduler.snapshot import QueuedJob, RunningJob, Snapshot

NOW = 10_000.0


def node(name: str, gpus: int, kind: str) -> Node:
    return Node(name, gpus, 64.0, 262144, kind)


def job(
    learners: int,
    gpus: int,
    *types: str,
    mix: bool = False,
    job_id: str = "j",
    priority: int = 50,
) -> QueuedJob:
    return QueuedJob(
        job_id,
        "t",
        priority,
        NOW - 10,
        learners,
        Resources(gpus, 1.0, 1024),
        gpu_types=types,
        mix_gpu_types=mix,
    )


def holding(job_id: str, where: str, gpu_ids: tuple[int, ...], priority: int = 10) -> RunningJob:
    return RunningJob(
        job_id,
        "t",
        priority,
        NOW - 1000,
        1,
        Resources(len(gpu_ids), 1.0, 1024),
        Placement((LearnerPlacement(1, where, gpu_ids),)),
    )


MIXED = (node("h1", 4, "h100"), node("h2", 4, "h100"), node("a1", 4, "a100"))


def types_of(choice: list[tuple[str, int]] | None, nodes: tuple[Node, ...]) -> set[str]:
    assert choice is not None
    kinds = {n.name: n.gpu_type for n in nodes}
    return {kinds[name] for name, _count in choice}


def test_a_gang_runs_on_gpus_of_one_type_unless_it_allows_more() -> None:
    # h1 and a1 have 3 GPUs free each, h2 none: 2 x 3 GPUs fit only across the two types.
    busy = (holding("x", "h1", (0,)), holding("y", "h2", (0, 1, 2, 3)), holding("z", "a1", (0,)))
    state = FreeState(MIXED, busy)
    for policy in (PACK, SPREAD):
        assert find_nodes(state, job(2, 3), policy) is None
        assert find_nodes(state, job(2, 3, "h100", "a100"), policy) is None
        mixed = find_nodes(state, job(2, 3, mix=True), policy)
        assert types_of(mixed, MIXED) == {"h100", "a100"}
    # On the empty cluster the gang fits on the two H100 nodes, so it is never refused.
    assert never_fits(job(2, 3), MIXED) is None
    assert types_of(find_nodes(FreeState(MIXED, ()), job(2, 3), PACK), MIXED) == {"h100"}


def test_a_gang_too_large_for_any_one_type_is_refused_with_the_way_out() -> None:
    nodes = (node("h1", 4, "h100"), node("a1", 4, "a100"))
    assert never_fits(job(2, 4), nodes) == (
        "needs 8 GPUs in total but the a100 nodes have 4, "
        "and a gang runs on GPUs of one type (mix_gpu_types allows more)"
    )
    assert never_fits(job(2, 4, mix=True), nodes) is None
    # Learners without GPUs hold no GPU of any type: their gang may span types.
    assert never_fits(job(2, 0), nodes) is None


def test_a_job_lands_only_on_the_types_it_accepts_its_first_choice_first() -> None:
    state = FreeState(MIXED, ())
    assert types_of(find_nodes(state, job(1, 2, "a100", "h100"), PACK), MIXED) == {"a100"}
    assert types_of(find_nodes(state, job(1, 2, "h100", "a100"), PACK), MIXED) == {"h100"}
    # With its first choice full, the second; with every accepted type full, nothing.
    full_a100 = FreeState(MIXED, (holding("x", "a1", (0, 1, 2, 3)),))
    assert types_of(find_nodes(full_a100, job(1, 2, "a100", "h100"), PACK), MIXED) == {"h100"}
    assert find_nodes(full_a100, job(1, 2, "a100"), PACK) is None
    assert never_fits(job(1, 2, "v100"), MIXED) == (
        "no node has gpu_type=v100 (the cluster's: a100, h100)"
    )


def test_the_scheduler_never_starts_a_restricted_job_on_another_type() -> None:
    busy = (holding("x", "a1", (0, 1, 2, 3), priority=90),)
    snapshot = Snapshot(NOW, MIXED, (job(1, 1, "a100", job_id="only-a100"),), busy)
    decisions = schedule(snapshot)
    assert decisions.starts == ()
    assert [w.job_id for w in decisions.waiting] == ["only-a100"]
    assert "a100" in decisions.waiting[0].reason


def test_preemption_frees_room_of_one_type() -> None:
    # A 2 x 2-GPU gang fits on h2 (2 free) and either h1 or a1 once their holder goes. a1's
    # holder is the preferred victim (lowest priority), but a1 is another type than h2.
    nodes = (node("h1", 2, "h100"), node("h2", 2, "h100"), node("a1", 2, "a100"))
    busy = (
        holding("on-h100", "h1", (0, 1), priority=20),
        holding("on-a100", "a1", (0, 1), priority=10),
    )
    decisions = schedule(Snapshot(NOW, nodes, (job(2, 2, job_id="hi", priority=90),), busy))
    assert [p.job_id for p in decisions.preemptions] == ["on-h100"]
    mixing = job(2, 2, mix=True, job_id="hi", priority=90)
    decisions = schedule(Snapshot(NOW, nodes, (mixing,), busy))
    assert [p.job_id for p in decisions.preemptions] == ["on-a100"]


def test_a_placement_records_the_gpu_type_of_each_learner() -> None:
    snapshot = Snapshot(NOW, MIXED, (job(2, 2, "a100", job_id="gang"),), ())
    [start] = schedule(snapshot).starts
    assert [lp.gpu_type for lp in start.placement.learners] == ["a100", "a100"]
    assert start.placement.gpu_type == "a100"
    stored = start.placement.to_json()
    assert all(item["gpu_type"] == "a100" for item in stored)
    assert Placement.from_json(stored).gpu_type == "a100"
    # Placements stored before types were recorded read back as of no known type.
    older = [{"learner": 1, "node": "a1", "gpu_ids": [0]}]
    assert Placement.from_json(older).gpu_type is None


def test_a_waiting_elastic_job_goes_first_to_the_type_it_was_planned_on() -> None:
    # Room on both types; its own order says h100 first, the optimizer planned it on a100.
    planned = replace(job(1, 2, "h100", "a100", job_id="elastic"), preferred_type="a100")
    [start] = schedule(Snapshot(NOW, MIXED, (planned,), ())).starts
    assert start.placement.gpu_type == "a100"
    # Where that type has no room, the others still take it.
    busy = (holding("x", "a1", (0, 1, 2, 3), priority=90),)
    [elsewhere] = schedule(Snapshot(NOW, MIXED, (planned,), busy)).starts
    assert elsewhere.placement.gpu_type == "h100"
    # A preference for a type it does not accept changes nothing.
    stray = replace(job(1, 2, "h100", job_id="only-h100"), preferred_type="a100")
    [only] = schedule(Snapshot(NOW, MIXED, (stray,), ())).starts
    assert only.placement.gpu_type == "h100"
