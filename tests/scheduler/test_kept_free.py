"""A scheduler loop's kept free capacity against the same state built anew, pass after pass."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.resources import LearnerPlacement, Node, Placement, Resources
from ffdl.scheduler.free import FreeState, KeptFree, Pool
from ffdl.scheduler.policy import plan
from ffdl.scheduler.snapshot import RunningJob, Snapshot
from tests.scheduler.test_properties import NOW, cluster_nodes, queued_jobs, running_jobs


def _pool(pool: Pool | None) -> Any:
    if pool is None:
        return None
    # Running CPU totals are sums of fractions: equal to rounding, not to the last bit.
    return (
        pool.free_gpus,
        round(pool.free_cpus, 6),
        pool.free_memory_mb,
        pool.top,
        [sorted(level) for level in pool.levels],
    )


def _view(state: FreeState) -> Any:
    """Everything a pass reads from the state: each node, and every pool's index and totals."""
    nodes = {
        name: (item.gpus, item.cpus, item.memory_mb, tuple(item.gpu_ids))
        for name, item in state.free.items()
    }
    pools = [_pool(state.pool_for(()))]
    pools += [_pool(state.pool_for((kind,))) for kind in sorted(state.gpu_types)]
    pools.append(_pool(state.pool_for(("a100", "v100"))))
    pools += [(value, _pool(p)) for value, p in state.label_groups("rack").items()]
    return nodes, pools, [node.name for node in state.drained]


def _ran(job_id: str, snapshot: Snapshot, placement: Placement) -> RunningJob:
    queued = next(q for q in snapshot.queued if q.id == job_id)
    return RunningJob(
        f"{job_id}@{snapshot.now:.0f}",
        queued.tenant,
        queued.priority,
        snapshot.now,
        len(placement.learners),
        queued.per_learner,
        placement,
    )


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_a_kept_state_is_the_state_built_anew_pass_after_pass(data: st.DataObject) -> None:
    nodes: tuple[Node, ...] = data.draw(cluster_nodes())
    running: tuple[RunningJob, ...] = data.draw(running_jobs(nodes))
    kept = KeptFree()
    for step in range(5):
        snapshot = Snapshot(
            NOW + step,
            nodes,
            data.draw(queued_jobs()),
            running,
            {},
            data.draw(st.sampled_from(["pack", "spread"])),
            1800.0,
        )
        assert _view(kept.state(nodes, running)) == _view(FreeState(nodes, running))
        # The pass allocates from the kept state; the next pass must not see that on paper.
        result = plan(snapshot, kept=kept)
        assert result == plan(snapshot)

        # Between passes: jobs end or are preempted, a row is read again as a new object
        # with the same values, a job shrinks to one learner, the starts begin running.
        preempted = {p.job_id for p in result.decisions.preemptions}
        after: list[RunningJob] = []
        for job in running:
            fate = data.draw(st.sampled_from(["stays", "ends", "read again", "shrinks"]))
            if job.id in preempted or fate == "ends":
                continue
            if fate == "read again":
                job = replace(job)
            elif fate == "shrinks":
                learners = job.placement.learners[:1]
                job = replace(job, learners=len(learners), placement=Placement(learners))
            after.append(job)
        after += [_ran(s.job_id, snapshot, s.placement) for s in result.decisions.starts]
        running = tuple(after)
        if data.draw(st.integers(0, 4)) == 0:  # a node is drained or returns
            flipped = data.draw(st.sampled_from(nodes))
            nodes = tuple(
                replace(n, schedulable=not n.schedulable) if n is flipped else n for n in nodes
            )


def test_a_kept_state_recomputes_only_the_nodes_whose_jobs_changed() -> None:
    nodes = tuple(Node(f"n{i}", 4, 8.0, 16384) for i in range(3))
    first, second = running_jobs_on(nodes)
    kept = KeptFree()
    state = kept.state(nodes, (first, second))
    n1, n2 = state.free["n1"], state.free["n2"]
    assert (n1.gpus, n2.gpus) == (3, 2)
    state.allocate("n0", first.per_learner, 2)  # what a pass takes on paper

    moved = replace(second, placement=Placement(()))  # second's row changed: it holds nothing
    again = kept.state(nodes, (first, moved))
    assert again is state
    assert (state.free["n0"].gpus, state.free["n0"].gpu_ids) == (4, [0, 1, 2, 3])
    assert (state.free["n1"].gpus, state.free["n2"].gpus) == (3, 4)
    assert state.free["n1"] is n1  # untouched nodes keep their entries
    assert _view(again) == _view(FreeState(nodes, (first, moved)))


def running_jobs_on(nodes: tuple[Node, ...]) -> tuple[RunningJob, RunningJob]:
    per = Resources(1, 1.0, 1024)
    first = RunningJob(
        "first", "a", 50, NOW, 1, per, Placement((LearnerPlacement(1, nodes[1].name, (0,)),))
    )
    second = RunningJob(
        "second",
        "a",
        50,
        NOW,
        2,
        per,
        Placement(
            (
                LearnerPlacement(1, nodes[2].name, (0,)),
                LearnerPlacement(2, nodes[2].name, (1,)),
            )
        ),
    )
    return first, second
