"""``python -m ffdl.sim.compare`` and its seed-paper companion, run as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_a_short_comparison_prints_its_table_and_writes_its_report(tmp_path: Path) -> None:
    report = tmp_path / "report"
    done = run(
        "ffdl.sim.compare",
        "--policies", "fifo,elastic", "--loads", "0.1", "--seeds", "0,1",
        "--report", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| 0.1 | fifo |" in done.stdout and "| 0.1 | elastic |" in done.stdout
    assert {p.name for p in report.iterdir()} == {"summary.md", "runs.csv", "avg_jct.png"}
    rows = (report / "runs.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 and rows[0].startswith("policy,load,seed,avg_jct_h")
    assert (
        "python -m ffdl.sim.compare --policies fifo,elastic" in (report / "summary.md").read_text()
    )


def test_bad_input_is_refused_by_name() -> None:
    unknown = run("ffdl.sim.compare", "--policies", "fifo,slurm")
    assert unknown.returncode == 2 and "unknown policy 'slurm'" in unknown.stderr
    loads = run("ffdl.sim.compare", "--loads", "one")
    assert loads.returncode == 2 and "--loads takes numbers" in loads.stderr
    penalty = run("ffdl.sim.compare", "--restart-penalty", "-1")
    assert penalty.returncode == 2 and "must be >= 0" in penalty.stderr
    cost = run("ffdl.sim.compare", "--restart-cost-s", "soon")
    assert cost.returncode == 2 and "--restart-cost-s must be a number" in cost.stderr
    admit = run("ffdl.sim.compare", "--admit-after-s", "-5")
    assert admit.returncode == 2 and "--admit-after-s must be >= 0" in admit.stderr
    objective = run("ffdl.sim.compare", "--objective", "fairest")
    assert objective.returncode == 2 and "invalid choice: 'fairest'" in objective.stderr
    speed = run("ffdl.sim.compare", "--speed", "guessed")
    assert speed.returncode == 2 and "invalid choice: 'guessed'" in speed.stderr
    too_big = run("ffdl.sim.compare", "--speed", "measured", "--nodes", "32")
    assert too_big.returncode == 2 and "cover up to 16 nodes of 4 GPUs" in too_big.stderr
    search = run("ffdl.sim.compare", "--pollux-search", "100")
    assert search.returncode == 2 and "POPULATIONxGENERATIONS" in search.stderr
    horizon = run("ffdl.sim.compare.seed_paper", "--horizon-h", "0")
    assert horizon.returncode == 2 and "--horizon-h must be > 0" in horizon.stderr


def test_the_seed_paper_experiment_prints_both_ratios() -> None:
    done = run("ffdl.sim.compare.seed_paper", "--loads", "0.1", "--seeds", "0", "--horizon-h", "12")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("| 0.1 | 16 |"))
    assert row.count("×") == 2


def test_the_mixed_types_comparison_prints_its_goals_and_writes_its_report(
    tmp_path: Path,
) -> None:
    report = tmp_path / "mixed"
    done = run(
        "ffdl.sim.compare.mixed_run",
        "--clusters", "gavel", "--policies", "gavel-las,gavel-ftf,ffdl", "--loads", "1",
        "--seeds", "0,1", "--jobs", "6", "--workers", "1", "--report", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| gavel | 1 | ffdl |" in done.stdout
    assert "| gavel | 1 | gavel-las |" in done.stdout  # the paired ratio against ffdl
    assert "avg JCT below gavel-las" in done.stdout and "worst ρ at most gavel-ftf's" in done.stdout
    assert {p.name for p in report.iterdir()} == {"summary.md", "runs.csv"}
    rows = (report / "runs.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * 2 and rows[0].startswith("cluster,policy,load,seed,avg_jct_h")
    assert "gpu_h_team-a" in rows[0]


def test_the_mixed_types_comparison_refuses_bad_input_by_name() -> None:
    cluster = run("ffdl.sim.compare.mixed_run", "--clusters", "gavel,tpu")
    assert cluster.returncode == 2 and "--clusters: unknown 'tpu'" in cluster.stderr
    policy = run("ffdl.sim.compare.mixed_run", "--highest-only", "slurm")
    assert policy.returncode == 2 and "--highest-only: unknown 'slurm'" in policy.stderr
    load = run("ffdl.sim.compare.mixed_run", "--loads", "0")
    assert load.returncode == 2 and "--loads must all be > 0" in load.stderr
    restart = run("ffdl.sim.compare.mixed_run", "--restart-s", "-1")
    assert restart.returncode == 2 and "--restart-s must be >= 0" in restart.stderr
