"""A short chaos run in the test suite: the platform loses no job, line or process.

The full run is ``make chaos`` (``benchmarks/chaos.py``); this one submits a dozen jobs
from three clients while the server is killed twice (down a few seconds each time),
controllers and user processes are killed and jobs are halted and resumed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_modules import load_benchmark


@pytest.mark.timeout(600)
def test_a_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    chaos = load_benchmark("chaos.py")
    settings = chaos.Settings(
        jobs=12,
        clients=3,
        lines=80,
        seed=7,
        down_min_s=1.0,
        down_max_s=4.0,
        chaos_every_s=1.5,
        server_kills=2,
        deadline_s=480.0,
    )
    report = chaos.run_chaos(settings, tmp_path / "home")
    chaos.print_report(settings, report)
    assert report.server_kills >= 1
    assert report.acknowledged == settings.jobs
    assert (report.lost_jobs, report.duplicated_jobs) == (0, 0)
    assert report.completed == settings.jobs, report
    assert (report.lines_missing, report.lines_duplicated) == (0, 0), report
    assert report.orphans == 0
