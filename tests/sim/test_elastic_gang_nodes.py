"""The simulator's elastic policy values a running gang on the machines it spans, as the
live autoscaler does: a gang that found one free GPU on each of two machines reaches the
optimizer with ``current_nodes`` 2, and one on a single machine with 1."""

from __future__ import annotations

from typing import Any

import pytest

import ffdl.sim.policies as policies
from ffdl.core.resources import Node, Resources
from ffdl.elastic.autoscale import Candidate
from ffdl.sim.engine import SimConfig, Simulator
from ffdl.sim.policies import make_policy
from ffdl.sim.workload import SimJob, fixed_duration_job

NODES = [Node(f"node-{i}", 2, 16.0, 65536) for i in range(2)]
HOUR = 3600.0


def elastic_job(job_id: str, submit_s: float) -> SimJob:
    return SimJob(
        id=job_id,
        submit_s=submit_s,
        learners=2,
        per_learner=Resources(1, 1.0, 256),
        work=5e6,  # samples: hours at the speeds of one or two GPUs
        family="resnet-like",
        elastic_gpus=(1, 2),
    )


def views_seen(jobs: list[SimJob], monkeypatch: pytest.MonkeyPatch) -> dict[str, set[Any]]:
    """Each running elastic job's ``current_nodes`` as handed to the real optimizer. A
    short job arriving later makes a pass while the elastic job runs."""
    jobs = [*jobs, fixed_duration_job("later", 600.0, 60.0, per_learner=Resources(0, 1.0, 256))]
    seen: dict[str, set[Any]] = {}
    real = policies.autoscale

    def recording(candidates: list[Candidate], *args: Any, **kwargs: Any) -> Any:
        for candidate in candidates:
            if candidate.job.current_gpus:
                seen.setdefault(candidate.job.id, set()).add(candidate.job.current_nodes)
        return real(candidates, *args, **kwargs)

    monkeypatch.setattr(policies, "autoscale", recording)
    Simulator(NODES, jobs, make_policy("elastic"), SimConfig(restart_s=30.0)).run()
    return seen


def test_a_gang_spread_over_two_machines_reaches_the_optimizer_as_spread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One long fixed job on each machine (two do not fit one machine's CPUs) leaves one GPU
    # free on each.
    blockers = [
        fixed_duration_job(f"fixed-{i}", 0.0, 10 * HOUR, per_learner=Resources(1, 10.0, 256))
        for i in range(2)
    ]
    seen = views_seen([*blockers, elastic_job("spread", 1.0)], monkeypatch)
    assert 2 in seen["spread"], seen


def test_a_gang_on_one_machine_reaches_the_optimizer_as_packed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = views_seen([elastic_job("packed", 0.0)], monkeypatch)
    assert seen["packed"] == {1}, seen
