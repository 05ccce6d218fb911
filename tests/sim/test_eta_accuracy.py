"""Measuring the platform's estimates in the simulator: start-time ETAs against real starts,
time left against real ends, from declared durations or from progress."""

from __future__ import annotations

import math

import pytest

from ffdl.core.resources import Node
from ffdl.sim.eta_accuracy import measure, with_guessed_durations
from ffdl.sim.workload import fixed_duration_job

ONE_GPU = [Node("node-a", 1, 8.0, 8192)]


def test_right_declared_durations_give_exact_etas() -> None:
    jobs = [
        fixed_duration_job("a", 0.0, 3600.0, expected_duration_s=3600.0),
        fixed_duration_job("b", 10.0, 1800.0, expected_duration_s=1800.0),
        fixed_duration_job("c", 20.0, 600.0, expected_duration_s=600.0),
    ]
    result = measure(ONE_GPU, jobs, "declared")
    assert result.started_after_waiting == 2
    assert result.start_median_s == pytest.approx(0.0, abs=1.0)
    assert result.remaining_median_s == pytest.approx(0.0, abs=1.0)


def test_progress_corrects_a_wrong_declared_duration() -> None:
    # Declared 10 h, runs 1 h: the declared estimate is 9 h off; progress sees the truth.
    jobs = [
        fixed_duration_job("a", 0.0, 3600.0, expected_duration_s=36000.0),
        fixed_duration_job("b", 600.0, 600.0, expected_duration_s=600.0),
    ]
    declared = measure(ONE_GPU, jobs, "declared")
    progress = measure(ONE_GPU, jobs, "progress")
    assert declared.remaining_median_s > 8 * 3600
    assert progress.remaining_samples > 0 and progress.remaining_median_s < 60.0
    # b arrives while a runs: its first ETA is a's end as the platform then sees it.
    assert declared.start_median_s > 8 * 3600
    assert progress.start_median_s < 60.0


def test_guessed_durations_are_seeded_and_spread() -> None:
    jobs = [fixed_duration_job(f"j{i}", 0.0, 100.0, expected_duration_s=100.0) for i in range(200)]
    once = with_guessed_durations(jobs, seed=3)
    assert [j.expected_duration_s for j in once] == [
        j.expected_duration_s for j in with_guessed_durations(jobs, seed=3)
    ]
    logs = [math.log((j.expected_duration_s or 1.0) / 100.0) for j in once]
    assert abs(sum(logs) / len(logs)) < 0.15 and max(logs) - min(logs) > 0.5
