"""The comparison on mixed GPU types as a command: every policy on Gavel's cluster and on an
H100/A100 mix, at each load and seed, with paired ratios and the goals checked.

    python -m ffdl.sim.compare.mixed_run --loads 0.5,1,2 --seeds 0,1,2 \\
        --report docs/simulations/mixed

A **load** is the arrival rate as a multiple of the rate the cluster can serve: with
``E[run time] * E[GPUs]`` reference-GPU-hours per job (Gavel's distributions) and the
cluster's capacity counted in reference GPUs (each type weighing its mean speed over the
models, one GPU each), load 1 brings as much work per hour as the cluster does at that
speed. Every job of a (cluster, load, seed) trace is the same for every policy; figures are
means over seeds ± half their range, and ratios are taken per seed, then averaged.
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ffdl.sim.compare.gavel import GavelTable, derived_table, gavel_jobs, gavel_table
from ffdl.sim.compare.mixed import (
    DEFAULT_RESTART_S,
    MixedCluster,
    MixedPolicy,
    MixedResult,
    simulate_mixed,
)
from ffdl.sim.compare.mixed_policies import FfdlMixed, GavelPolicy, MixedFifo, PolluxAgnostic
from ffdl.sim.compare.run import loads_and_seeds, markdown
from ffdl.sim.metrics import percentile

CLUSTERS: dict[str, Callable[[], tuple[MixedCluster, GavelTable]]] = {
    # Gavel's simulated cluster: 36 GPUs of each of the three types it measured.
    "gavel": lambda: (
        MixedCluster("gavel", {"v100": 36, "p100": 36, "k80": 36}, "v100"),
        gavel_table(),
    ),
    # A rack of H100s beside twice as many A100s (gavel.H100_A100_FACTORS).
    "h100-a100": lambda: (
        MixedCluster("h100-a100", {"h100": 32, "a100": 64}, "a100"),
        derived_table(gavel_table()),
    ),
}
POLICIES: dict[str, Callable[[], MixedPolicy]] = {
    "fifo": MixedFifo,
    "gavel-las": lambda: GavelPolicy("las"),
    "gavel-ftf": lambda: GavelPolicy("ftf"),
    "gavel-las-agnostic": lambda: GavelPolicy("las", aware=False),
    "gavel-ftf-agnostic": lambda: GavelPolicy("ftf", aware=False),
    "pollux-agnostic": PolluxAgnostic,
    "ffdl-agnostic": lambda: FfdlMixed(name="ffdl-agnostic", aware=False),
    "ffdl-fixed-size": lambda: FfdlMixed(name="ffdl-fixed-size", fixed_size=True),
    "ffdl": FfdlMixed,
}
AGNOSTIC = ("gavel-las-agnostic", "gavel-ftf-agnostic", "pollux-agnostic")
FIGURES = ("avg_jct_h", "p99_jct_h", "makespan_h", "worst_rho", "median_rho", "restarts")
# Gavel's run-time distribution (gavel.gavel_run_time_s), in hours: E[60 * 10^U(a, b)] min.
MEAN_RUN_H = (
    0.8 * (10**3 - 10**1.5) / (1.5 * math.log(10)) + 0.2 * (10**4 - 10**3) / math.log(10)
) / 60
MEAN_GPUS = 0.7 * 1 + 0.1 * 2 + 0.15 * 4 + 0.05 * 8


def capacity(cluster: MixedCluster, table: GavelTable) -> float:
    """The cluster's GPUs counted in reference GPUs: each type at its mean speed over the
    models (one GPU) against the reference type."""
    ref = cluster.reference
    return sum(
        count * statistics.fmean(table.rate(m, t, 1) / table.rate(m, ref, 1) for m in table.models)
        for t, count in cluster.gpus.items()
    )


def jobs_per_hour(cluster: MixedCluster, table: GavelTable, load: float) -> float:
    return load * capacity(cluster, table) / (MEAN_RUN_H * MEAN_GPUS)


@dataclass(frozen=True, slots=True)
class MixedRun:
    cluster: str
    policy: str
    load: float
    seed: int
    figures: dict[str, float]
    tenant_gpu_h: dict[str, float]
    wall_s: float


def figures_of(result: MixedResult) -> dict[str, float]:
    jcts, rhos = result.jcts(), result.rhos()
    nan = float("nan")
    return {
        "avg_jct_h": statistics.fmean(jcts) / 3600 if jcts else nan,
        "p99_jct_h": percentile(jcts, 99) / 3600 if jcts else nan,
        "makespan_h": result.makespan_s / 3600,
        "worst_rho": max(rhos) if rhos else nan,
        "median_rho": statistics.median(rhos) if rhos else nan,
        "restarts": float(sum(o.restarts for o in result.outcomes)),
        "completed": float(result.completed),
    }


Task = tuple[str, str, float, int, int, float]


def one_run(task: Task) -> MixedRun:
    """One (cluster, policy, load, seed, jobs, restart seconds)."""
    cluster_name, policy_name, load, seed, count, restart_s = task
    cluster, table = CLUSTERS[cluster_name]()
    jobs = gavel_jobs(
        table, count, jobs_per_hour(cluster, table, load), seed, reference=cluster.reference
    )
    started = time.perf_counter()
    result = simulate_mixed(jobs, POLICIES[policy_name](), cluster, table, restart_s=restart_s)
    wall = time.perf_counter() - started
    return MixedRun(
        cluster_name,
        policy_name,
        load,
        seed,
        figures_of(result),
        result.gpu_hours_by_tenant(),
        wall,
    )


def run_all(
    clusters: Sequence[str],
    policies: Sequence[str],
    loads: Sequence[float],
    seeds: Sequence[int],
    jobs: int,
    workers: int,
    say: Callable[[str], None] = print,
    highest_only: Sequence[str] = (),
    restart_s: float = DEFAULT_RESTART_S,
) -> list[MixedRun]:
    """Every (cluster, load, seed, policy), ``highest_only`` policies at the highest load
    only, on ``workers`` processes."""
    tasks: list[Task] = [
        (c, p, load, s, jobs, restart_s)
        for c in clusters
        for load in loads
        for s in seeds
        for p in policies
        if p not in highest_only or load == max(loads)
    ]
    # The slow searches first, so that the pool's processes end about together.
    tasks.sort(key=lambda task: task[1] not in highest_only)
    runs: list[MixedRun] = []

    def report(run: MixedRun) -> None:
        f = run.figures
        say(
            f"{run.cluster:9s} load {run.load:g} seed {run.seed} {run.policy:19s} "
            f"avg JCT {f['avg_jct_h']:6.2f} h  p99 {f['p99_jct_h']:6.1f} h  "
            f"makespan {f['makespan_h']:6.1f} h  worst rho {f['worst_rho']:5.2f}  "
            f"restarts {f['restarts']:5.0f}  ({run.wall_s:.1f} s)"
        )
        runs.append(run)

    if workers <= 1:
        for task in tasks:
            report(one_run(task))
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for run in pool.imap_unordered(one_run, tasks):
                report(run)
    order = {t: i for i, t in enumerate(tasks)}
    runs.sort(key=lambda r: order[(r.cluster, r.policy, r.load, r.seed, jobs, restart_s)])
    return runs


def _groups(runs: Sequence[MixedRun]) -> list[tuple[str, float]]:
    return sorted(
        {(r.cluster, r.load) for r in runs}, key=lambda k: (list(CLUSTERS).index(k[0]), k[1])
    )


def summary_rows(runs: Sequence[MixedRun]) -> list[list[str]]:
    rows = []
    for cluster, load in _groups(runs):
        for policy in POLICIES:
            group = [r for r in runs if (r.cluster, r.load, r.policy) == (cluster, load, policy)]
            if not group:
                continue
            cells = [cluster, f"{load:g}", policy]
            for figure in FIGURES:
                values = [r.figures[figure] for r in group]
                mean, half = statistics.fmean(values), (max(values) - min(values)) / 2
                digits = 0 if figure == "restarts" else 2 if "rho" in figure else 1
                cells.append(f"{mean:.{digits}f} ± {half:.{digits}f}")
            tenants = sorted({t for r in group for t in r.tenant_gpu_h})
            cells.append(
                " / ".join(
                    f"{statistics.fmean(r.tenant_gpu_h.get(t, 0.0) for r in group):.0f}"
                    for t in tenants
                )
            )
            rows.append(cells)
    return rows


SUMMARY_HEADER = (
    "cluster",
    "load",
    "policy",
    "avg JCT (h)",
    "p99 JCT (h)",
    "makespan (h)",
    "worst ρ",
    "median ρ",
    "restarts",
    "GPU-h per tenant (a / b / c / d)",
)


def _paired(
    runs: Sequence[MixedRun], cluster: str, load: float, policy: str, base: str, figure: str
) -> list[float]:
    """``base``'s figure over ``policy``'s, per seed."""
    mine = {r.seed: r for r in runs if (r.cluster, r.load, r.policy) == (cluster, load, policy)}
    theirs = {r.seed: r for r in runs if (r.cluster, r.load, r.policy) == (cluster, load, base)}
    return [
        theirs[s].figures[figure] / mine[s].figures[figure]
        for s in sorted(set(mine) & set(theirs))
        if mine[s].figures[figure] > 0
    ]


def _ratio(values: Sequence[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.fmean(values):.2f}× ({min(values):.2f}–{max(values):.2f})"


def ratio_rows(runs: Sequence[MixedRun], policy: str = "ffdl") -> list[list[str]]:
    """Per cluster, load and baseline: its avg JCT, p99 JCT and worst rho over ffdl's (above
    1: ffdl is better), paired by seed."""
    rows = []
    for cluster, load in _groups(runs):
        for base in POLICIES:
            if base == policy:
                continue
            cells = [
                _ratio(_paired(runs, cluster, load, policy, base, f))
                for f in ("avg_jct_h", "p99_jct_h", "worst_rho")
            ]
            if cells[0] != "–":
                rows.append([cluster, f"{load:g}", base, *cells])
    return rows


RATIO_HEADER = ("cluster", "load", "baseline", "avg JCT ÷ ffdl", "p99 JCT ÷ ffdl", "worst ρ ÷ ffdl")


def goal_rows(runs: Sequence[MixedRun], policy: str = "ffdl") -> list[list[str]]:
    """The goals, per cluster and load, met or not, with the paired ratio behind each."""
    rows = []
    groups = _groups(runs)
    for cluster, load in groups:
        highest = load == max(ld for c, ld in groups if c == cluster)
        # (goal, baseline, figure, the ratio needed, whether it must be exceeded)
        checks = [
            ("avg JCT below gavel-las", "gavel-las", "avg_jct_h", 1.0, True),
            ("worst ρ at most gavel-ftf's", "gavel-ftf", "worst_rho", 1.0, False),
        ]
        if highest:
            checks += [
                (f"avg JCT ≥ 1.5× better than {b}", b, "avg_jct_h", 1.5, False) for b in AGNOSTIC
            ]
        for goal, base, figure, need, strictly in checks:
            ratios = _paired(runs, cluster, load, policy, base, figure)
            if not ratios:
                continue
            mean = statistics.fmean(ratios)
            met = mean > need if strictly else mean >= need
            rows.append([cluster, f"{load:g}", goal, f"{mean:.2f}×", "met" if met else "NOT met"])
    return rows


GOAL_HEADER = ("cluster", "load", "goal", "baseline ÷ ffdl", "")


def write_report(runs: Sequence[MixedRun], directory: Path, command: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tenants = sorted({t for r in runs for t in r.tenant_gpu_h})
    with (directory / "runs.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(
            [
                "cluster",
                "policy",
                "load",
                "seed",
                *FIGURES,
                "completed",
                *(f"gpu_h_{t}" for t in tenants),
                "wall_s",
            ]
        )
        for r in runs:
            writer.writerow(
                [
                    r.cluster,
                    r.policy,
                    r.load,
                    r.seed,
                    *(f"{r.figures[f]:.4g}" for f in (*FIGURES, "completed")),
                    *(f"{r.tenant_gpu_h.get(t, 0.0):.1f}" for t in tenants),
                    f"{r.wall_s:.1f}",
                ]
            )
    text = [
        "# Policies on mixed GPU types",
        "",
        f"Written by `{command}`.",
        "",
        markdown(SUMMARY_HEADER, summary_rows(runs)),
        "",
        "Each baseline's figure over ffdl's, paired by seed (mean, then the range):",
        "",
        markdown(RATIO_HEADER, ratio_rows(runs)),
        "",
        "Goals:",
        "",
        markdown(GOAL_HEADER, goal_rows(runs)),
        "",
    ]
    (directory / "summary.md").write_text("\n".join(text))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ffdl.sim.compare.mixed_run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clusters", default=",".join(CLUSTERS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--loads", default="0.5,1,2", help="comma-separated, e.g. 0.5,1,2")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated trace seeds")
    parser.add_argument("--jobs", type=int, default=120, help="jobs per trace")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel")
    parser.add_argument(
        "--highest-only",
        default="",
        help="policies to run at the highest load only (comma-separated; for a slow search)",
    )
    parser.add_argument(
        "--restart-s",
        type=float,
        default=DEFAULT_RESTART_S,
        help="seconds a job makes no progress after it starts or changes GPUs",
    )
    parser.add_argument("--report", type=Path, default=None, help="directory for the report")
    args = parser.parse_args(argv)
    loads, seeds = loads_and_seeds(parser, args.loads, args.seeds)
    if any(not load > 0 for load in loads):
        parser.error("--loads must all be > 0")
    if args.jobs < 1 or args.workers < 1:
        parser.error("--jobs and --workers must be >= 1")
    if not args.restart_s >= 0:
        parser.error("--restart-s must be >= 0")
    for option, given, known in (
        ("--clusters", args.clusters, CLUSTERS),
        ("--policies", args.policies, POLICIES),
        ("--highest-only", args.highest_only, POLICIES),
    ):
        if not given:
            continue
        unknown = [x for x in given.split(",") if x not in known]
        if unknown:
            parser.error(f"{option}: unknown {unknown[0]!r}; choose from {', '.join(known)}")
    runs = run_all(
        args.clusters.split(","),
        args.policies.split(","),
        loads,
        seeds,
        args.jobs,
        args.workers,
        highest_only=[p for p in args.highest_only.split(",") if p],
        restart_s=args.restart_s,
    )
    print()
    print(markdown(SUMMARY_HEADER, summary_rows(runs)))
    print()
    print(markdown(RATIO_HEADER, ratio_rows(runs)))
    print()
    print(markdown(GOAL_HEADER, goal_rows(runs)))
    if args.report is not None:
        argv_text = " ".join(sys.argv[1:] if argv is None else argv)
        write_report(runs, args.report, f"python -m ffdl.sim.compare.mixed_run {argv_text}")
        print(f"\nreport written to {args.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
