"""The time-left estimate: what it measures, when it knows nothing, and attempts."""

from __future__ import annotations

from typing import Any

import pytest

from ffdl.core.progress import RATE_WINDOW_S, Report, advance, remaining_now


def run(
    reports: list[Report], attempt: int = 1, state: dict[str, Any] | None = None
) -> dict[str, Any]:
    for report in reports:
        state = advance(state, report, attempt)
    assert state is not None
    return state


def steps(start: float, first: int, last: int, per_s: float, total: int = 1000) -> list[Report]:
    return [
        Report(time=start + (step - first) / per_s, step=step, total_steps=total)
        for step in range(first, last + 1)
    ]


def test_a_steady_job_ends_when_its_rate_says() -> None:
    state = run(steps(1000.0, 0, 200, per_s=10.0))
    assert state["unit"] == "step" and state["fraction"] == pytest.approx(0.2)
    assert state["rate"] == pytest.approx(10.0)
    assert state["remaining_s"] == pytest.approx(80.0)
    assert state["estimated_end_at"] == pytest.approx(1000.0 + 20.0 + 80.0)
    assert remaining_now(state, 1000.0 + 50.0) == pytest.approx(50.0)
    assert remaining_now(state, 5000.0) == 0.0


def test_without_a_total_or_before_a_window_there_is_no_estimate() -> None:
    untotalled = run([Report(time=t, step=int(t)) for t in range(0, 30)])
    assert untotalled["unit"] is None and untotalled["fraction"] is None
    assert untotalled["estimated_end_at"] is None and remaining_now(untotalled, 40.0) is None
    early = run(steps(0.0, 0, 3, per_s=1.0))  # 3 s < one window
    assert early["fraction"] == pytest.approx(0.003) and early["remaining_s"] is None
    assert RATE_WINDOW_S > 3


def test_a_total_declared_once_holds_for_later_reports() -> None:
    state = run([Report(time=0.0, step=0, total_steps=100)])
    state = run([Report(time=float(t), step=t * 2) for t in range(1, 21)], state=state)
    assert state["fraction"] == pytest.approx(0.4) and state["rate"] == pytest.approx(2.0)


def test_a_resume_does_not_count_the_pause_and_a_rescale_brings_its_rate() -> None:
    before = run(steps(0.0, 0, 100, per_s=10.0))
    # Halted at step 100 for an hour, resumed as attempt 2 twice as fast (rescaled).
    after = run(steps(3610.0, 100, 102, per_s=20.0), attempt=2, state=before)
    assert after["rate"] == pytest.approx(10.0)  # the old rate until a window has run
    after = run(steps(3610.0, 103, 400, per_s=20.0), attempt=2, state=after)
    assert 15.0 < after["rate"] <= 20.0
    assert after["fraction"] == pytest.approx(0.4)


def test_samples_give_the_throughput_whatever_the_unit() -> None:
    reports = [
        Report(time=float(t), samples=t * 64, epoch=t // 10, total_epochs=10) for t in range(40)
    ]
    state = run(reports)
    assert state["unit"] == "epoch" and state["fraction"] == pytest.approx(0.3)
    assert state["samples_rate"] == pytest.approx(64.0)


def test_counts_past_the_total_are_done_not_more() -> None:
    state = run([Report(time=float(t), step=t * 100, total_steps=500) for t in range(12)])
    assert state["fraction"] == 1.0 and state["remaining_s"] == 0.0
