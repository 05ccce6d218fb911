"""The exact snapshot reductions change no decision: runs with and without them agree."""

from __future__ import annotations

import pytest

from ffdl.core.resources import Node
from ffdl.sim.engine import SimConfig, Simulator
from ffdl.sim.free_index import FreeIndex
from ffdl.sim.policies import make_policy
from ffdl.sim.workload import Discrete, SimJob, SyntheticSpec, synthetic, talk_cpus_per_learner

NODES = [Node(f"node-{i:02d}", 4, 32.0, 131072) for i in range(12)]


def jobs(seed: int) -> list[SimJob]:
    spec = SyntheticSpec(
        jobs=100,
        load=1.2,
        seed=seed,
        learners=Discrete((1, 1, 2, 3, 4, 8)),
        gpus_per_learner=Discrete((1, 2, 3, 4)),
        # CPUs and memory sometimes bound a node before its GPUs do.
        cpus_per_learner=talk_cpus_per_learner(),
        memory_per_learner_mb=Discrete((8192, 32768)),
        priorities=Discrete((30, 50, 70)),
        elastic=True,
    )
    return synthetic(spec, cluster_gpus=48, gpus_per_node=4)


def outcomes(policy: str, placement: str, work: list[SimJob], reductions: bool) -> list[object]:
    config = SimConfig(reductions=reductions, tick_s=300.0)
    result = Simulator(NODES, work, make_policy(policy, placement=placement), config).run()
    return [(o.id, o.first_start_s, o.finish_s, o.restarts) for o in result.outcomes]


@pytest.mark.parametrize("policy", ["fifo", "priority-backfill", "elastic"])
@pytest.mark.parametrize("placement", ["pack", "spread"])
@pytest.mark.parametrize("seed", [1, 2])
def test_reduced_snapshots_decide_exactly_as_full_ones(
    policy: str, placement: str, seed: int
) -> None:
    work = jobs(seed)
    assert outcomes(policy, placement, work, True) == outcomes(policy, placement, work, False)


def test_free_index_keeps_levels_in_cluster_order_and_irregular_nodes_apart() -> None:
    nodes = [Node(f"n{i}", 4, 16.0, 65536) for i in range(6)]
    index = FreeIndex(nodes, cpus_per_gpu=4.0, memory_per_gpu_mb=16384.0)
    for node in nodes:
        index.update(node.name, 4, 16.0, 65536)
    index.update("n4", 2, 8.0, 32768)
    index.update("n1", 2, 8.0, 32768)
    index.update("n3", 2, 1.0, 32768)  # CPUs, not GPUs, bound this one
    index.update("n5", 0, 0.0, 0)
    assert [n.name for n in index.subset(per_level=1)] == ["n0", "n1", "n3"]
    assert [n.name for n in index.subset(per_level=5)] == ["n0", "n1", "n2", "n3", "n4"]
