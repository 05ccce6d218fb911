"""Gang scheduling against placing learners one at a time: the talk's 8-GPU deadlock."""

from __future__ import annotations

from ffdl.core.resources import Node, Resources
from ffdl.sim.engine import SimConfig, Simulator
from ffdl.sim.experiments import run_experiment
from ffdl.sim.policies import make_policy
from ffdl.sim.workload import SimJob, fixed_duration_job

EIGHT_GPUS = [Node("node-a", 4, 32.0, 131072), Node("node-b", 4, 32.0, 131072)]
HOUR = 3600.0


def four_gangs() -> list[SimJob]:
    return [
        fixed_duration_job(f"job-{i}", 0.0, HOUR, learners=4, per_learner=Resources(1, 4.0, 8192))
        for i in range(1, 5)
    ]


def test_gang_runs_two_jobs_holds_two_back_and_finishes_all_four() -> None:
    result = Simulator(
        EIGHT_GPUS, four_gangs(), make_policy("gang"), SimConfig(horizon_s=4 * HOUR)
    ).run()
    starts = sorted(o.first_start_s for o in result.outcomes if o.first_start_s is not None)
    assert starts == [0.0, 0.0, HOUR, HOUR]
    assert all(o.finish_s is not None for o in result.outcomes)
    assert result.series.held_gpus[0] == 8
    assert result.series.running_gpus[0] == 8
    assert result.summary()["makespan_s"] == 2 * HOUR


def test_learner_at_a_time_deadlocks_with_every_gpu_held_and_none_working() -> None:
    result = Simulator(
        EIGHT_GPUS, four_gangs(), make_policy("learner-at-a-time"), SimConfig(horizon_s=4 * HOUR)
    ).run()
    assert all(o.first_start_s is None and o.finish_s is None for o in result.outcomes)
    assert result.series.held_gpus[-1] == 8
    assert result.series.running_gpus[-1] == 0
    assert result.end_s == 4 * HOUR
    assert result.held_gpu_seconds == 8 * 4 * HOUR
    assert result.running_gpu_seconds == 0


def test_at_scale_learner_at_a_time_leaves_jobs_stuck_and_gpus_idle() -> None:
    output = run_experiment("gang", quick=True)
    by_label = {r.label: r for r in output.results}
    gang = by_label["64 GPUs gang"].summary()
    naive = by_label["64 GPUs learner-at-a-time"].summary()
    assert gang["unfinished"] == 0
    assert naive["unfinished"] > 0
    assert naive["held_utilisation"] - naive["running_utilisation"] > 0.1
    assert naive["completed"] < gang["completed"]
