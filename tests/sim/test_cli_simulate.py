"""``ffdl simulate`` from the command line."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from ffdl.cli import simulate as cli_simulate
from ffdl.cli.main import app
from ffdl.sim.experiments import EXPERIMENT_NAMES
from ffdl.sim.policies import POLICY_NAMES

runner = CliRunner()


def test_synthetic_run_prints_the_summary_and_writes_a_report(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "simulate",
            "--policy",
            "elastic",
            "--jobs",
            "30",
            "--nodes",
            "4",
            "--report",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "elastic pack" in result.output
    assert re.search(r"completed\s+│\s+30\s", result.output)
    assert (tmp_path / "summary.md").exists() and (tmp_path / "utilisation.png").exists()


def test_philly_run_with_filters(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-01 00:00:00,100.0,1,100.0,vc-a\n"
        "2017-10-01 00:10:00,100.0,2,200.0,vc-b\n"
        "2017-10-02 00:00:00,100.0,2,200.0,vc-a\n"
    )
    args = ["simulate", "--workload", "philly", "--trace", str(trace), "--vc", "vc-a"]
    result = runner.invoke(app, [*args, "--end", "2017-10-01T12:00"])
    assert result.exit_code == 0, result.output
    assert re.search(r"jobs\s+│\s+1\s", result.output)
    empty = runner.invoke(app, [*args, "--start", "2017-11-01"])
    assert empty.exit_code == 1
    assert "no jobs" in empty.output


def test_bad_choices_are_usage_errors() -> None:
    result = runner.invoke(app, ["simulate", "--policy", "random"])
    assert result.exit_code == 2
    assert "--policy must be one of" in result.output
    assert runner.invoke(app, ["simulate", "--experiment", "everything"]).exit_code == 2
    bad_load = runner.invoke(app, ["simulate", "--load", "0"])
    assert bad_load.exit_code == 1 and "load must be > 0" in bad_load.output


def test_experiment_runs_and_reports(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["simulate", "--experiment", "gang", "--quick", "--report", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "8 GPUs learner-at-a-time: 0 of 4 jobs started" in result.output
    assert (tmp_path / "summary.csv").exists()


def test_the_cli_names_match_the_simulator() -> None:
    assert cli_simulate.POLICY_NAMES == POLICY_NAMES
    assert cli_simulate.EXPERIMENT_NAMES == EXPERIMENT_NAMES
