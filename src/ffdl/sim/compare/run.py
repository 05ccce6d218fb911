"""The policy comparison as a command: every policy on the Philly-derived workloads at each
load and seed, figures averaged over seeds with their spread, written as a report.

    python -m ffdl.sim.compare --loads 0.5,1,2 --seeds 0,1,2,3 --report docs/simulations/policies

Prints one line per run as it goes, then the summary table (mean over seeds, ± half the
range); with ``--report DIR`` also writes ``summary.md``, ``runs.csv`` and ``avg_jct.png``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from ffdl.elastic.optimizer import Objective
from ffdl.sim.compare.engine import ClusterShape, Policy, RunResult, simulate
from ffdl.sim.compare.families import SPEEDS
from ffdl.sim.compare.measured import MEASURED_GPUS_PER_NODE, MEASURED_NODES
from ffdl.sim.compare.policies import FfdlElastic, Fifo, Optimus, Tiresias
from ffdl.sim.compare.pollux import Pollux
from ffdl.sim.compare.workloads import WorkloadSpec, build
from ffdl.sim.metrics import percentile
from ffdl.sim.philly import default_trace_path

POLICIES: dict[str, Callable[[], Policy]] = {
    "fifo": Fifo,
    "tiresias": Tiresias,
    "optimus": Optimus,
    "pollux": Pollux,
    "pollux-fit": lambda: Pollux(name="pollux-fit", learns_speed=True),
    "elastic-fixed-batch": lambda: FfdlElastic(name="elastic-fixed-batch", fixed_batch=True),
    "elastic": FfdlElastic,
    "elastic-fit": lambda: FfdlElastic(name="elastic-fit", learns_speed=True),
}
FIGURES = ("avg_jct_h", "p99_jct_h", "makespan_h", "restarts", "gpu_util")


@dataclass(frozen=True, slots=True)
class Run:
    policy: str
    load: float
    seed: int
    figures: dict[str, float]
    wall_s: float


def figures_of(result: RunResult, gpus: int) -> dict[str, float]:
    jcts = result.jcts()
    return {
        "avg_jct_h": statistics.fmean(jcts) / 3600 if jcts else float("nan"),
        "p99_jct_h": percentile(jcts, 99) / 3600 if jcts else float("nan"),
        "makespan_h": result.makespan_s / 3600,
        "restarts": float(result.restarts),
        "gpu_util": result.gpu_seconds_held / (gpus * result.makespan_s)
        if result.makespan_s
        else 0.0,
        "completed": float(result.completed),
    }


def run_matrix(
    policies: Sequence[str],
    loads: Sequence[float],
    seeds: Sequence[int],
    *,
    trace: Path,
    shape: ClusterShape,
    speed: str = "model",
    say: Callable[[str], None] = print,
    make: Callable[[str], Policy] | None = None,
) -> list[Run]:
    """Every policy on every (load, seed) workload; ``make`` builds a policy by name
    (default: ``POLICIES``)."""
    make = make or (lambda name: POLICIES[name]())
    runs = []
    for load in loads:
        for seed in seeds:
            jobs = build(
                WorkloadSpec(load=load, seed=seed, gpus_per_node=shape.gpus_per_node, speed=speed),
                trace,
            )
            for name in policies:
                started = time.perf_counter()
                result = simulate(jobs, make(name), shape)
                wall = time.perf_counter() - started
                run = Run(name, load, seed, figures_of(result, shape.gpus), wall)
                runs.append(run)
                f = run.figures
                say(
                    f"load {load:g} seed {seed} {name:20s} avg JCT {f['avg_jct_h']:6.2f} h  "
                    f"p99 {f['p99_jct_h']:6.2f} h  makespan {f['makespan_h']:5.1f} h  "
                    f"restarts {f['restarts']:4.0f}  GPU use {f['gpu_util']:.0%}  ({wall:.1f} s)"
                )
    return runs


def summary_rows(runs: Sequence[Run]) -> list[list[str]]:
    """One row per (load, policy): each figure's mean over seeds ± half its range."""
    rows = []
    keys = sorted({(r.load, r.policy) for r in runs}, key=lambda k: (k[0], _order(k[1])))
    for load, policy in keys:
        group = [r for r in runs if r.load == load and r.policy == policy]
        cells = [f"{load:g}", policy]
        for figure in FIGURES:
            values = [r.figures[figure] for r in group]
            mean, half = statistics.fmean(values), (max(values) - min(values)) / 2
            cells.append(_cell(figure, mean, half))
        rows.append(cells)
    return rows


def ratio_rows(runs: Sequence[Run], against: str = "pollux") -> list[list[str]]:
    """Per load and policy: average and p99 JCT over ``against``'s, paired by seed."""
    rows = []
    for load in sorted({r.load for r in runs}):
        base = {r.seed: r for r in runs if r.load == load and r.policy == against}
        for policy in sorted({r.policy for r in runs}, key=_order):
            pairs = [
                (r, base[r.seed])
                for r in runs
                if r.load == load and r.policy == policy and r.seed in base
            ]
            if not pairs or policy == against:
                continue
            avg = [r.figures["avg_jct_h"] / b.figures["avg_jct_h"] for r, b in pairs]
            p99 = [r.figures["p99_jct_h"] / b.figures["p99_jct_h"] for r, b in pairs]
            rows.append(
                [
                    f"{load:g}",
                    policy,
                    f"{statistics.fmean(avg):.2f}× ({min(avg):.2f}-{max(avg):.2f})",
                    f"{statistics.fmean(p99):.2f}× ({min(p99):.2f}-{max(p99):.2f})",
                ]
            )
    return rows


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


SUMMARY_HEADER = ("load", "policy", "avg JCT", "p99 JCT", "makespan", "restarts", "GPU use")
RATIO_HEADER = ("load", "policy", "avg JCT / Pollux", "p99 JCT / Pollux")


def write_report(runs: Sequence[Run], directory: Path, command: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "runs.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["policy", "load", "seed", *FIGURES, "completed", "wall_s"])
        for r in runs:
            figures = [f"{r.figures[f]:.4f}" for f in FIGURES]
            completed = int(r.figures["completed"])
            writer.writerow([r.policy, r.load, r.seed, *figures, completed, f"{r.wall_s:.2f}"])
    text = [
        "# Policies on Philly-derived workloads",
        "",
        f"`{command}`",
        "",
        markdown(SUMMARY_HEADER, summary_rows(runs)),
        "",
    ]
    ratios = ratio_rows(runs)
    if ratios:
        text += [
            "Paired by seed, against Pollux (mean, and the range over seeds):",
            "",
            markdown(RATIO_HEADER, ratios),
            "",
        ]
    (directory / "summary.md").write_text("\n".join(text))
    _plot(runs, directory / "avg_jct.png")


def _plot(runs: Sequence[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted({r.load for r in runs})
    policies = sorted({r.policy for r in runs}, key=_order)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(policies)
    for k, policy in enumerate(policies):
        for ax, figure in zip(axes, ("avg_jct_h", "p99_jct_h"), strict=True):
            means = [
                statistics.fmean(
                    [r.figures[figure] for r in runs if r.load == load and r.policy == policy]
                    or [float("nan")]
                )
                for load in loads
            ]
            ax.bar([i + k * width for i in range(len(loads))], means, width, label=policy)
    for ax, title in zip(axes, ("average JCT (h)", "p99 JCT (h)"), strict=True):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(loads))])
        ax.set_xticklabels([f"load {load:g}" for load in loads])
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _order(policy: str) -> int:
    return list(POLICIES).index(policy) if policy in POLICIES else len(POLICIES)


def _cell(figure: str, mean: float, half: float) -> str:
    if figure == "gpu_util":
        return f"{mean:.0%} ± {half:.0%}"
    if figure == "restarts":
        return f"{mean:.0f} ± {half:.0f}"
    return f"{mean:.2f} h ± {half:.2f}"


def loads_and_seeds(
    parser: argparse.ArgumentParser, loads: str, seeds: str
) -> tuple[list[float], list[int]]:
    """``--loads`` and ``--seeds`` as lists, or the parser's usage error naming them."""
    try:
        return [float(x) for x in loads.split(",")], [int(x) for x in seeds.split(",")]
    except ValueError:
        parser.error("--loads takes numbers and --seeds whole numbers, comma-separated")


def restart_cost(parser: argparse.ArgumentParser, text: str) -> float | None:
    """``--restart-cost-s``: seconds >= 0, or ``none``."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        parser.error(f"--restart-cost-s must be a number of seconds >= 0 or 'none', not {text!r}")
    return value


def pollux_search(parser: argparse.ArgumentParser, text: str | None) -> tuple[int, int] | None:
    """``--pollux-search`` as (population, generations), or the parser's usage error."""
    if text is None:
        return None
    population, _, generations = text.partition("x")
    if population.isdigit() and generations.isdigit():
        size = int(population), int(generations)
        if size[0] >= 2 and size[1] >= 1:
            return size
    parser.error(
        "--pollux-search takes POPULATIONxGENERATIONS, e.g. 100x100 (population >= 2, "
        "generations >= 1)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ffdl.sim.compare", description=__doc__)
    parser.add_argument("--loads", default="0.5,1,2", help="comma-separated, e.g. 0.5,1,2")
    parser.add_argument("--seeds", default="0,1,2,3", help="comma-separated workload seeds")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--trace", type=Path, default=None)
    parser.add_argument(
        "--speed",
        choices=SPEEDS,
        default="model",
        help="the families' step times: their model, or measured profiles",
    )
    parser.add_argument("--report", type=Path, default=None, help="directory for the report")
    parser.add_argument(
        "--restart-cost-s",
        default=None,
        help="for ffdl's elastic policies: a rescale's cost in seconds, charged against the "
        "job's age, or 'none' to charge --restart-penalty flat (default: the live setting)",
    )
    parser.add_argument(
        "--restart-penalty", type=float, default=None, help="for ffdl's elastic policies"
    )
    parser.add_argument(
        "--fairness-after-s", type=float, default=None, help="for ffdl's elastic policies"
    )
    parser.add_argument(
        "--admit-after-s", type=float, default=None, help="for ffdl's elastic policies"
    )
    parser.add_argument(
        "--objective",
        choices=get_args(Objective),
        default=None,
        help="for ffdl's elastic policies (default: the live setting)",
    )
    parser.add_argument(
        "--pollux-search",
        default=None,
        metavar="POPULATIONxGENERATIONS",
        help="the size of Pollux's genetic search, e.g. 100x100 (default 60x40)",
    )
    args = parser.parse_args(argv)
    search = pollux_search(parser, args.pollux_search)
    loads, seeds = loads_and_seeds(parser, args.loads, args.seeds)
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}")
    trace = args.trace or default_trace_path()
    if not trace.exists():
        parser.error(f"the Philly trace is not at {trace} (see data/README.md)")
    shape = ClusterShape(nodes=args.nodes, gpus_per_node=args.gpus_per_node)
    beyond_profiles = shape.nodes > MEASURED_NODES or shape.gpus_per_node > MEASURED_GPUS_PER_NODE
    if args.speed == "measured" and beyond_profiles:
        parser.error(
            f"--speed measured: the profiles cover up to {MEASURED_NODES} nodes of "
            f"{MEASURED_GPUS_PER_NODE} GPUs"
        )
    tuned: dict[str, object] = {
        key: value
        for key, value in (
            ("restart_penalty", args.restart_penalty),
            ("fairness_after_s", args.fairness_after_s),
            ("admit_after_s", args.admit_after_s),
        )
        if value is not None
    }
    if any(isinstance(value, float) and value < 0 for value in tuned.values()):
        parser.error("--restart-penalty, --fairness-after-s and --admit-after-s must be >= 0")
    if args.objective is not None:
        tuned["objective"] = args.objective
    if args.restart_cost_s is not None:
        tuned["restart_cost_s"] = restart_cost(parser, args.restart_cost_s)

    def make(name: str) -> Policy:
        policy = POLICIES[name]()
        if isinstance(policy, FfdlElastic):
            policy = dataclasses.replace(policy, **tuned)  # type: ignore[arg-type]
        if isinstance(policy, Pollux) and search is not None:
            policy = dataclasses.replace(policy, population=search[0], generations=search[1])
        return policy

    runs = run_matrix(policies, loads, seeds, trace=trace, shape=shape, speed=args.speed, make=make)
    print()
    print(markdown(SUMMARY_HEADER, summary_rows(runs)))
    if "pollux" in policies:
        print()
        print(markdown(RATIO_HEADER, ratio_rows(runs)))
    if args.report is not None:
        command = "python -m ffdl.sim.compare " + " ".join(sys.argv[1:] if argv is None else argv)
        write_report(runs, args.report, command)
        print(f"\nreport written to {args.report}")
    return 0
