"""The fleet benchmark's runs (``fleet.py``): what each run was, and the tables it prints,
each figure beside its ratio to the first run's."""

from __future__ import annotations

from dataclasses import dataclass, field

# Loops whose share of the window spent in passes is printed.
TIMED_LOOPS = ("scheduler", "lcm", "monitor", "autoscaler")


@dataclass(frozen=True)
class Setup:
    store: str  # "sqlite" or "postgres"
    replicas: int

    @property
    def label(self) -> str:
        return f"{'SQLite' if self.store == 'sqlite' else 'PostgreSQL'}, {self.replicas} repl."


@dataclass
class Run:
    setup: Setup
    nodes: int
    stored: int
    figures: dict[str, float | None] = field(default_factory=dict)
    lost: int = 0


def print_runs(runs: list[Run]) -> None:
    tables = [
        (
            "start and scheduling (s)",
            [
                "started/s",
                "to PROCESSING p50",
                "to PROCESSING p99",
                "queued p50",
                "queued p99",
                "deploy p50",
                "deploy p99",
                "report p50",
                "report p99",
                "sched pass p50",
                "sched pass p99",
                "LCM pass p50",
                "LCM pass p99",
            ],
        ),
        (
            "loops: time in passes (% of the window)",
            [f"{loop} %" for loop in TIMED_LOOPS],
        ),
        (
            "API latency (s)",
            [
                f"{n} {q}"
                for n in ("submit", "list", "list deep", "list after", "show", "loglines")
                for q in ("p50", "p99")
            ],
        ),
        (
            "reports",
            [
                "lines/s",
                "metrics/s",
                "backlog",
                "report p50 ms",
                "report p99 ms",
                "served p50 ms",
                "served p99 ms",
                "replicas CPU %",
                "busiest replica %",
                "harness CPU %",
                "posts/s",
                "CPU ms per post",
                "CPU µs per line",
            ],
        ),
        (
            "cost",
            ["max RSS MiB", "DB MiB per M lines", "scrape ms", "scrape KiB", "CPU s per start"],
        ),
    ]
    baseline = runs[0]
    for title, columns in tables:
        print(f"\n{title}")
        header = f"  {'setup':<22} {'nodes':>6} {'jobs':>7} {'learners':>8}"
        for column in columns:
            header += f" {column:>17}"
        print(header)
        for run in runs:
            jobs = run.figures.get("jobs stored") or 0
            learners = run.figures.get("learners running") or 0
            row = f"  {run.setup.label:<22} {run.nodes:>6} {jobs:>7.0f} {learners:>8.0f}"
            for column in columns:
                value = run.figures.get(column)
                base = baseline.figures.get(column)
                if value is None:
                    row += f" {'-':>17}"
                    continue
                ratio = f"({value / base:.2f}×)" if base and run is not baseline else ""
                row += f" {value:>9.3f} {ratio:>7}"
            print(row)
    for run in runs:
        print(
            f"  {run.setup.label}, {run.nodes} nodes: errors {run.figures.get('errors') or 0:.0f}, "
            f"reports failed {run.figures.get('reports failed') or 0:.0f}, jobs lost {run.lost}"
        )
