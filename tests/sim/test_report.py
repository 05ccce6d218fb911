"""Reports: the summary files and plots are written, small, and say what was measured."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from ffdl.core.resources import Node
from ffdl.sim.engine import Simulator
from ffdl.sim.experiments import EXPERIMENT_NAMES, run_experiment
from ffdl.sim.metrics import percentile
from ffdl.sim.policies import make_policy
from ffdl.sim.report import duration_text, write_report
from ffdl.sim.workload import SyntheticSpec, synthetic

MAX_PNG_BYTES = 200 * 1024


def test_report_files_hold_the_summary_and_small_plots(tmp_path: Path) -> None:
    nodes = [Node(f"n{i}", 4, 32.0, 131072) for i in range(4)]
    jobs = synthetic(SyntheticSpec(jobs=40, seed=3, elastic=True), cluster_gpus=16, gpus_per_node=4)
    results = [
        Simulator(nodes, jobs, make_policy(p), label=f"run {p}").run() for p in ("fifo", "elastic")
    ]
    written = write_report(results, tmp_path / "out", title="Two policies", notes="A note.")
    names = {p.name for p in written}
    assert {
        "summary.md",
        "summary.csv",
        "utilisation.png",
        "fragmentation.png",
        "queue.png",
        "jct.png",
    } <= names
    for path in written:
        assert path.exists() and path.stat().st_size > 0
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert path.stat().st_size < MAX_PNG_BYTES
    markdown = (tmp_path / "out" / "summary.md").read_text()
    assert markdown.startswith("# Two policies")
    assert "| run fifo |" in markdown and "| run elastic |" in markdown
    assert "A note." in markdown and "![utilisation](utilisation.png)" in markdown
    rows = list(csv.DictReader((tmp_path / "out" / "summary.csv").open()))
    assert [r["run"] for r in rows] == ["run fifo", "run elastic"]
    assert [int(r["completed"]) for r in rows] == [40, 40]
    for row, result in zip(rows, results, strict=True):
        assert float(row["avg_jct_s"]) == pytest.approx(result.summary()["avg_jct_s"], rel=1e-5)


@pytest.mark.parametrize("name", EXPERIMENT_NAMES)
def test_every_experiment_runs_quickly_and_writes_its_report(name: str, tmp_path: Path) -> None:
    output = run_experiment(name, tmp_path / name, quick=True)
    assert output.results
    assert (tmp_path / name / "summary.md").read_text().count("\n| ") >= len(output.results)
    for path in output.files:
        assert path.exists()
        if path.suffix == ".png":
            assert path.stat().st_size < MAX_PNG_BYTES


def test_helpers() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert [duration_text(s) for s in (30, 600, 7200 * 2, 86400 * 3)] == [
        "30 s",
        "10.0 min",
        "4.0 h",
        "3.0 d",
    ]
    with pytest.raises(ValueError, match="unknown experiment"):
        run_experiment("nope")
