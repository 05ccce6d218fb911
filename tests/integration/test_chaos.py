"""A short chaos run in the test suite: the platform loses no job, line or process.

The full run is ``make chaos`` (``benchmarks/chaos.py``); this one submits a dozen jobs
from three clients while the server is killed twice (down a few seconds each time),
controllers and user processes are killed and jobs are halted and resumed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _chaos_module() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("ffdl_chaos", BENCHMARKS / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_a_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    chaos = _chaos_module()
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
