"""Families whose speed is a measured table: the table is read as given, it is not of the
four-parameter form, and the comparison's jobs, engine and ffdl's online fit run on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ffdl.elastic.throughput import StepObservation, fit, prior
from ffdl.sim.compare.engine import ClusterShape, simulate
from ffdl.sim.compare.families import FAMILIES, families
from ffdl.sim.compare.jobs import SeenSteps
from ffdl.sim.compare.measured import (
    MeasuredSpeed,
    ProfilePoint,
    default_profiles_path,
    measured_speeds,
    read_profiles,
)
from ffdl.sim.compare.policies import FfdlElastic
from ffdl.sim.compare.workloads import WorkloadSpec, build
from ffdl.sim.philly import default_trace_path

PROFILES = read_profiles(default_profiles_path())


def step_time(speed: MeasuredSpeed, gpus: int, local: float, nodes: int) -> float:
    return float(speed.step_times(np.array([gpus]), np.array([gpus * local]), np.array([nodes]))[0])


def test_every_family_has_a_profile_and_the_measured_points_are_read_exactly() -> None:
    assert set(PROFILES) == set(FAMILIES)
    speeds = measured_speeds()
    for name, points in PROFILES.items():
        for p in points[:: max(1, len(points) // 40)]:
            got = step_time(speeds[name], p.gpus, p.local_batch, p.nodes)
            assert got == pytest.approx(p.step_time_s, rel=1e-9), (name, p)


def test_between_points_the_table_is_interpolated_linearly() -> None:
    speed = MeasuredSpeed(
        [
            ProfilePoint(1, 1, 10, 1.0),
            ProfilePoint(1, 1, 30, 2.0),
            ProfilePoint(1, 2, 10, 1.5),
            ProfilePoint(1, 2, 30, 2.5),
            ProfilePoint(2, 2, 10, 3.0),
            ProfilePoint(2, 2, 30, 4.0),
            ProfilePoint(4, 4, 10, 5.0),
            ProfilePoint(4, 4, 30, 6.0),
        ],
        max_nodes=4,
        gpus_per_node=2,
    )
    assert step_time(speed, 1, 20, 1) == pytest.approx(1.5)  # between local batches
    assert step_time(speed, 1, 40, 1) == pytest.approx(2.5)  # past the end, same slope
    assert step_time(speed, 3, 10, 3) == pytest.approx(4.0)  # 3 nodes: between 2 and 4
    assert step_time(speed, 2, 10, 1) == pytest.approx(1.5)
    assert speed.throughput(2, 40, 2) == pytest.approx(40 / 3.5)


def test_the_measured_curves_are_not_of_the_four_parameter_form() -> None:
    # yolov3 on one GPU steps faster at a local batch of 8 than at 6: no model of the form
    # alpha + beta * b / g does that.
    yolov3 = measured_speeds()["yolov3"]
    assert step_time(yolov3, 1, 8, 1) < step_time(yolov3, 1, 6, 1)
    for name, points in PROFILES.items():
        seen = [
            StepObservation(p.gpus, p.gpus * p.local_batch, p.nodes, p.step_time_s) for p in points
        ]
        best = fit(seen, prior())
        errors = [
            abs(best.step_time(o.gpus, o.batch_size, o.nodes) / o.step_time_s - 1) for o in seen
        ]
        assert np.percentile(errors, 90) > 0.15, name


def test_a_malformed_profile_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "profiles.csv"
    path.write_text("family,nodes,gpus,local_batch,step_time_s\nx,1,1,8,0.1\nx,3,2,8,0.1\n")
    with pytest.raises(ValueError, match=r"profiles\.csv:3: .*nodes <= gpus"):
        read_profiles(path)
    with pytest.raises(ValueError, match="points on one GPU"):
        MeasuredSpeed([ProfilePoint(1, 2, 8, 0.1), ProfilePoint(1, 2, 16, 0.2)])
    with pytest.raises(ValueError, match="unknown speed 'guessed'"):
        families("guessed")


def test_measured_families_keep_their_limits_and_their_time_on_one_gpu() -> None:
    for name, family in families("measured").items():
        model = FAMILIES[name]
        assert (family.local_batch, family.batch_range) == (model.local_batch, model.batch_range)
        one = family.training_time_s(1, family.base_batch, 4)
        assert one == pytest.approx(model.training_time_s(1, model.base_batch, 4), rel=1e-9)
    assert families("measured")["cifar10"].speed is measured_speeds()["cifar10"]


def test_the_online_fit_learns_from_the_step_times_the_engine_shows() -> None:
    jobs = build(WorkloadSpec(load=0.1, seed=2, speed="measured"), default_trace_path())
    assert all(j.family.speed is measured_speeds()[j.family.name] for j in jobs)
    policy = FfdlElastic(name="elastic-fit", learns_speed=True)
    result = simulate(jobs, policy, ClusterShape(nodes=4, gpus_per_node=4))
    assert result.completed == len(jobs)
    # Every job ran, was seen, and was planned on a model fitted to what it was seen to take.
    fitted = policy.learned.fitted()
    assert set(fitted) == {j.id for j in jobs}
    assert all(count > 0 and model != prior() for count, model in fitted.values())


def test_seen_steps_keep_the_latest_as_runs() -> None:
    a = StepObservation(1, 8, 1, 0.3)
    b = StepObservation(2, 16, 1, 0.4)
    seen = SeenSteps()
    for observation in (a, a, a, b, b):
        seen = seen.added(observation, keep=4)
    assert seen.runs == ((a, 2), (b, 2)) and seen.count == 4 and seen.latest == b
    assert seen.each() == [a, a, b, b]
    assert seen.added(b, keep=2).runs == ((b, 2),)
