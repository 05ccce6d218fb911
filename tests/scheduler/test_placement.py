"""Gang placement on free capacity, free-capacity bookkeeping, and ``never_fits``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.resources import LearnerPlacement, Node, Placement, Resources
from ffdl.scheduler.free import FreeState, compute_free, gpu_ids_in_use
from ffdl.scheduler.placement import (
    PACK,
    SPREAD,
    ClusterShape,
    assign,
    find_nodes,
    never_fits,
    usable_nodes,
)
from ffdl.scheduler.policy import schedule
from ffdl.scheduler.snapshot import QueuedJob, RunningJob, Snapshot


def job(
    learners: int = 1,
    gpus: int = 1,
    cpus: float = 1.0,
    memory_mb: int = 1024,
    *,
    gpu_type: str | None = None,
    same_label: str | None = None,
    mix_gpu_types: bool = False,
) -> QueuedJob:
    return QueuedJob(
        "j",
        "t",
        50,
        0.0,
        learners,
        Resources(gpus, cpus, memory_mb),
        gpu_type,
        None,
        same_label,
        mix_gpu_types=mix_gpu_types,
    )


def hold(node: str, gpu_ids: tuple[int, ...], cpus: float = 1.0) -> RunningJob:
    placement = Placement((LearnerPlacement(1, node, gpu_ids),))
    return RunningJob("r-" + node, "t", 50, 0.0, 1, Resources(len(gpu_ids), cpus, 1024), placement)


def test_free_capacity_subtracts_running_learners_and_their_gpu_ids() -> None:
    nodes = (Node("a", 4, 8.0, 8192), Node("b", 2, 8.0, 8192))
    running = (hold("a", (1, 3), cpus=3.0), hold("gone", (0,)))
    free = compute_free(nodes, running)
    assert (free["a"].gpus, free["a"].cpus, free["a"].memory_mb) == (2, 5.0, 7168)
    assert free["a"].gpu_ids == [0, 2]
    assert free["b"].gpu_ids == [0, 1]
    assert gpu_ids_in_use(nodes, running) == {"a": {1, 3}, "b": set()}


def test_assign_hands_out_the_lowest_free_gpu_ids() -> None:
    nodes = (Node("a", 8, 64.0, 65536),)
    state = FreeState(nodes, (hold("a", (0, 2)),))
    gang = job(learners=2, gpus=2)
    placement = assign(state, gang, [("a", 2)])
    assert [lp.gpu_ids for lp in placement.learners] == [(1, 3), (4, 5)]
    assert [lp.learner for lp in placement.learners] == [1, 2]
    assert state.free["a"].gpus == 2


def test_pack_uses_fewest_nodes_and_best_fit_for_the_last() -> None:
    nodes = tuple(Node(n, 8, 64.0, 65536) for n in "abc")
    running = (hold("a", (0, 1, 2, 3, 4, 5)), hold("b", (0, 1, 2, 3)))
    state = FreeState(nodes, running)
    # 3 learners × 2 GPUs: c (8 free) holds all three on its own
    assert find_nodes(state, job(3, 2), PACK) == [("c", 3)]
    # 6 learners × 2 GPUs: c holds 4, the other 2 go to b (4 free) rather than a (2 free)
    assert find_nodes(state, job(6, 2), PACK) == [("c", 4), ("b", 2)]
    # 1 learner × 2 GPUs: the fullest node that fits
    assert find_nodes(state, job(1, 2), PACK) == [("a", 1)]


def test_spread_uses_the_emptiest_nodes_one_learner_each() -> None:
    nodes = tuple(Node(n, 8, 64.0, 65536) for n in "abc")
    state = FreeState(nodes, (hold("a", (0, 1, 2, 3, 4, 5)),))
    assert find_nodes(state, job(2, 2), SPREAD) == [("b", 1), ("c", 1)]
    # more learners than nodes: round robin over the nodes with room
    assert find_nodes(state, job(5, 2), SPREAD) == [("b", 2), ("c", 2), ("a", 1)]


def test_cpu_and_memory_limit_the_learners_per_node() -> None:
    nodes = (Node("a", 8, 4.0, 65536), Node("b", 8, 64.0, 4096))
    state = FreeState(nodes, ())
    # a holds one such learner (CPUs), b one (memory): the gang needs both nodes
    assert find_nodes(state, job(2, 1, cpus=4.0, memory_mb=4096), PACK) == [("a", 1), ("b", 1)]
    assert find_nodes(state, job(3, 1, cpus=4.0, memory_mb=4096), PACK) is None
    assert find_nodes(state, job(2, 1, cpus=2.0, memory_mb=2048), PACK) == [("a", 2)]


def test_cpu_only_learners_are_placed_by_cpus() -> None:
    nodes = (Node("a", 0, 8.0, 8192), Node("b", 0, 2.0, 8192))
    state = FreeState(nodes, ())
    assert find_nodes(state, job(1, 0, cpus=2.0), PACK) == [("b", 1)]
    assert find_nodes(state, job(2, 0, cpus=2.0), SPREAD) == [("a", 1), ("b", 1)]
    assert find_nodes(state, job(6, 0, cpus=2.0), PACK) is None


def test_never_fits_reasons() -> None:
    nodes = (
        Node("a", 4, 32.0, 65536, "v100", {"rack": "r1"}),
        Node("b", 4, 32.0, 65536, "v100", {"rack": "r2"}),
    )
    assert never_fits(job(2, 4), nodes) is None
    assert never_fits(job(1, 8), nodes) == "needs 8 GPUs per learner but the largest node has 4"
    assert never_fits(job(4, 4), nodes) == "needs 16 GPUs in total but the cluster has 8"
    assert never_fits(job(1, 1, gpu_type="a100"), nodes) == (
        "no node has gpu_type=a100 (the cluster's: v100)"
    )
    assert never_fits(job(1, 1, cpus=64.0), nodes) == (
        "needs 64 CPUs per learner but the largest node has 32"
    )
    assert never_fits(job(2, 4, same_label="rack"), nodes) == (
        "needs 2 learners × 4 GPUs, 1 CPU, 1024 MiB memory on nodes with one rack value; "
        "the largest rack has 4 GPUs"
    )
    assert never_fits(job(1, 1, same_label="zone"), nodes) == "no node has a zone label"


def test_hosts_without_gpus_are_said_to_offer_cpu_slots() -> None:
    nodes = (Node("a", 4, 32.0, 65536, "cpu"), Node("b", 4, 32.0, 65536, "cpu"))
    assert never_fits(job(1, 8), nodes) == (
        "needs 8 CPU slots per learner but the largest node has 4"
    )
    assert never_fits(job(4, 4), nodes) == "needs 16 CPU slots in total but the cluster has 8"
    assert never_fits(job(0, 1), nodes) == "needs at least one learner"


def test_usable_nodes_follow_type_size_and_locality() -> None:
    nodes = (
        Node("a", 4, 32.0, 65536, "v100", {"rack": "r1"}),
        Node("b", 2, 32.0, 65536, "v100", {"rack": "r2"}),
        Node("c", 8, 32.0, 65536, "k80", {"rack": "r2"}),
        Node("d", 8, 32.0, 65536, "v100", {}, schedulable=False),
    )
    shape = ClusterShape(nodes)
    assert usable_nodes(job(1, 4), shape) == {"a", "c"}
    assert usable_nodes(job(1, 2, gpu_type="v100"), shape) == {"a", "b"}
    # Rack r2 holds the gang on c alone: a gang's GPUs are of one type unless it mixes.
    assert usable_nodes(job(3, 2, same_label="rack"), shape) == {"c"}
    assert usable_nodes(job(3, 2, same_label="rack", mix_gpu_types=True), shape) == {"b", "c"}


# -- properties ----------------------------------------------------------------------------

node_strategy = st.builds(
    Node,
    name=st.sampled_from(["n0"]),  # renamed below so names are unique
    gpus=st.sampled_from([0, 1, 2, 4, 8]),
    cpus=st.sampled_from([2.0, 4.0, 16.0, 32.0]),
    memory_mb=st.sampled_from([4096, 16384, 65536]),
    gpu_type=st.sampled_from(["v100", "a100"]),
    labels=st.sampled_from([{}, {"rack": "r1"}, {"rack": "r2"}]),
)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Node, ...]:
    drawn = draw(st.lists(node_strategy, min_size=1, max_size=6))
    return tuple(
        Node(f"n{i}", n.gpus, n.cpus, n.memory_mb, n.gpu_type, n.labels)
        for i, n in enumerate(drawn)
    )


@st.composite
def jobs(draw: st.DrawFn) -> QueuedJob:
    return job(
        draw(st.integers(1, 6)),
        draw(st.sampled_from([0, 1, 2, 4])),
        draw(st.sampled_from([0.5, 1.0, 4.0, 8.0])),
        draw(st.sampled_from([512, 2048, 16384])),
        gpu_type=draw(st.sampled_from([None, None, "v100", "a100"])),
        same_label=draw(st.sampled_from([None, None, "rack"])),
    )


@st.composite
def busy_clusters(draw: st.DrawFn) -> tuple[tuple[Node, ...], tuple[RunningJob, ...]]:
    """A cluster with some running single-learner jobs that fit it."""
    nodes = draw(clusters())
    running = []
    for node in nodes:
        used = draw(st.integers(0, node.gpus))
        cpus = draw(st.sampled_from([0.0, node.cpus / 2]))
        if used or cpus:
            running.append(
                RunningJob(
                    f"r-{node.name}",
                    "t",
                    50,
                    0.0,
                    1,
                    Resources(used, cpus, 1024),
                    Placement((LearnerPlacement(1, node.name, tuple(range(used))),)),
                )
            )
    return nodes, tuple(running)


def _slots(free: Resources, per: Resources) -> int:
    counts = []
    if per.gpus:
        counts.append(free.gpus // per.gpus)
    if per.cpus:
        counts.append(int((free.cpus + 1e-9) // per.cpus))
    if per.memory_mb:
        counts.append(free.memory_mb // per.memory_mb)
    return min(counts) if counts else 10**6


@settings(max_examples=300, deadline=None)
@given(busy_clusters(), jobs())
def test_pack_never_uses_more_nodes_than_spread(
    cluster: tuple[tuple[Node, ...], tuple[RunningJob, ...]], gang: QueuedJob
) -> None:
    nodes, running = cluster
    packed = find_nodes(FreeState(nodes, running), gang, PACK)
    spread = find_nodes(FreeState(nodes, running), gang, SPREAD)
    assert (packed is None) == (spread is None)
    if packed is None or spread is None:
        return
    assert len(packed) <= len(spread)
    for choice in (packed, spread):
        assert sum(count for _name, count in choice) == gang.learners
        assert len({name for name, _count in choice}) == len(choice)
        free = compute_free(nodes, running)
        for name, count in choice:
            assert count <= _slots(free[name].resources, gang.per_learner)
            if gang.gpu_type is not None:
                assert free[name].node.gpu_type == gang.gpu_type
        if gang.same_label is not None:
            values = {free[name].node.labels.get(gang.same_label) for name, _ in choice}
            assert len(values) == 1 and None not in values


@settings(max_examples=300, deadline=None)
@given(clusters(), jobs())
def test_never_fits_agrees_with_placing_on_the_empty_cluster(
    nodes: tuple[Node, ...], gang: QueuedJob
) -> None:
    reason = never_fits(gang, nodes)
    decisions = schedule(Snapshot(0.0, nodes, (gang,)))
    assert (reason is None) == bool(decisions.starts)
    if reason is not None:
        assert decisions.waiting[0].reason == reason


def _full_scan_pack(state: FreeState, gang: QueuedJob) -> list[tuple[str, int]] | None:
    """Pack as it was written before the scan could stop inside a level: every node of
    every level visited down to the one that settles the node count."""
    from ffdl.scheduler.placement import _eligible_slots, _needed

    pool = state.pool_for(())
    assert pool is not None
    per, learners, gpus = gang.per_learner, gang.learners, gang.per_learner.gpus
    if pool.top >= learners * gpus:
        for _level, name in pool.ascending(learners * gpus):
            if _eligible_slots(state, name, per, (), None) >= learners:
                return [(name, learners)]
    collected: list[tuple[int, int, str]] = []
    total, lowest = 0, pool.top + 1
    for level in range(pool.top, gpus - 1, -1):
        for name in pool.levels[level]:
            slots = _eligible_slots(state, name, per, (), None)
            if slots > 0:
                collected.append((slots, level, name))
                total += slots
        lowest = level
        if total >= learners:
            collected.sort(key=lambda c: -c[0])
            if collected[_needed(collected, learners) - 1][0] >= (level - 1) // gpus:
                break
    if total < learners:
        return None
    collected.sort(key=lambda c: -c[0])
    needed = _needed(collected, learners)
    chosen = collected[: needed - 1]
    remaining = learners - sum(slots for slots, _level, _name in chosen)
    best: tuple[int, str] | None = None
    for slots, level, name in collected[needed - 1 :]:
        if slots >= remaining and (best is None or level < best[0]):
            best = (level, name)
    for level, name in pool.ascending(remaining * gpus, lowest - 1):
        if best is not None and level >= best[0]:
            break
        if _eligible_slots(state, name, per, (), None) >= remaining:
            best = (level, name)
            break
    assert best is not None
    return [(name, slots) for slots, _level, name in chosen] + [(best[1], remaining)]


@st.composite
def crowded_levels(draw: st.DrawFn) -> tuple[tuple[Node, ...], tuple[RunningJob, ...]]:
    """Many 8-GPU nodes sharing few free-GPU levels, some short of CPUs (so nodes of one
    level hold different numbers of learners)."""
    nodes, running = [], []
    for index in range(draw(st.integers(1, 40))):
        name = f"n{index:02d}"
        nodes.append(Node(name, 8, draw(st.sampled_from([64.0, 64.0, 8.0, 4.0])), 1 << 20))
        used = draw(st.sampled_from([0, 0, 0, 4, 6]))
        if used:
            running.append(hold(name, tuple(range(used))))
    return tuple(nodes), tuple(running)


@settings(max_examples=400, deadline=None)
@given(
    crowded_levels(),
    st.integers(1, 12),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1.0, 2.0]),
)
def test_pack_stops_inside_a_crowded_level_only_where_the_rest_changes_nothing(
    cluster: tuple[tuple[Node, ...], tuple[RunningJob, ...]],
    learners: int,
    gpus: int,
    cpus: float,
) -> None:
    nodes, running = cluster
    gang = job(learners, gpus, cpus)
    assert find_nodes(FreeState(nodes, running), gang, PACK) == _full_scan_pack(
        FreeState(nodes, running), gang
    )
