"""Pollux, Tiresias and Optimus on Pollux's eight workloads per load, against the results
its simulator shipped (``data/pollux-simulator/results.csv``): average and p99 JCT per
load, means over the workloads, and their ratios; and ffdl's policy (``ffdl``) on the
same workloads against Pollux's shipped results.

``python -m ffdl.sim.faithful --policies tiresias,optimus --loads 0.5,1.0,2.0`` prints the
table; ``--workloads 1,2`` runs fewer. It exits 1 when a baseline's average JCT at a load
is more than 10% from the shipped one.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ffdl.sim.faithful.engine import Cluster, Policy, RunResult, read_workload
from ffdl.sim.faithful.ffdl_policy import FfdlElastic
from ffdl.sim.faithful.policies import Optimus, Tiresias
from ffdl.sim.faithful.pollux import Pollux
from ffdl.sim.faithful.traces import applications, default_data_dir

POLICIES: dict[str, Callable[[], Policy]] = {
    "pollux": Pollux,
    "tiresias": Tiresias,
    "optimus": Optimus,
    "ffdl": FfdlElastic,
    # The same without the live hold rule, to price it.
    "ffdl-nohold": lambda: FfdlElastic(name="ffdl-nohold", min_rescale_interval_s=0.0),
    # The same without gradient accumulation, to measure what it brings.
    "ffdl-noaccum": lambda: FfdlElastic(name="ffdl-noaccum", accumulate=False),
    # The same taking batch-only changes without a restart, as Pollux's agents do.
    "ffdl-inplace": lambda: FfdlElastic(name="ffdl-inplace", rebatch_in_place=True),
    # The same with the rules before the proportional objective, restarts charged by age
    # and newcomers admitted after a minute (and with the ten-minute turns of then).
    "ffdl-before": lambda: FfdlElastic(
        name="ffdl-before",
        objective="throughput",
        restart_cost_s=None,
        admit_after_s=600.0,
        fairness_after_s=600.0,
        fairness_turn_s=600.0,
    ),
}
# What a policy without shipped results of its own is compared with.
REFERENCE = "pollux"
LOADS = ("0.5", "1.0", "2.0")
# The ±10% the engine must land within, per load, on average JCT.
TOLERANCE = 0.10


@dataclass(frozen=True)
class Shipped:
    average: float
    p99: float


def shipped_results(data_dir: Path | None = None) -> dict[tuple[str, str, str], Shipped]:
    """(policy, load, workload) → what Pollux's simulator reported."""
    path = (data_dir or default_data_dir()) / "results.csv"
    with path.open(newline="") as stream:
        return {
            (row["policy"], row["load"], row["workload"]): Shipped(
                float(row["avg_jct_s"]), float(row["p99_jct_s"])
            )
            for row in csv.DictReader(stream)
        }


def run_one(policy: str, load: str, workload: str, data_dir: Path | None = None) -> RunResult:
    root = data_dir or default_data_dir()
    jobs = read_workload(root / "workloads" / load / f"{workload}.csv")
    return Cluster(jobs, applications(data_dir), POLICIES[policy]()).run()


def _run(args: tuple[str, str, str]) -> tuple[str, str, str, RunResult, float]:
    started = time.monotonic()
    result = run_one(*args)
    return (*args, result, time.monotonic() - started)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ffdl.sim.faithful", description=__doc__)
    parser.add_argument("--policies", default="tiresias,optimus,pollux")
    parser.add_argument("--loads", default=",".join(LOADS))
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policies {unknown}; known: {sorted(POLICIES)}")
    loads = args.loads.split(",")
    if bad := [x for x in loads if x not in LOADS]:
        parser.error(f"unknown loads {bad}; known: {list(LOADS)}")
    workloads = [f"workload-{w}" for w in args.workloads.split(",")]
    shipped = shipped_results()
    tasks = [(p, x, w) for p in policies for x in loads for w in workloads]
    results: dict[tuple[str, str, str], RunResult] = {}
    with ProcessPoolExecutor(max_workers=args.processes) as pool:
        for policy, load, workload, result, took in pool.map(_run, tasks):
            results[policy, load, workload] = result
            reference = policy if (policy, load, workload) in shipped else REFERENCE
            want = shipped[reference, load, workload]
            print(
                f"{policy:9} {load} {workload}: avg {result.average_jct:8,.0f} s "
                f"({reference} shipped {want.average:8,.0f}: "
                f"{result.average_jct / want.average:.2f}x), p99 {result.p99_jct:8,.0f} s, "
                f"wait p99 {result.p99_wait:6,.0f} s, max {max(result.waits.values()):6,} s, "
                f"{took:.0f} s",
                flush=True,
            )
    print()
    print(
        "| policy | load | avg JCT (s) | p99 JCT (s) | p99 / max wait (s) | shipped "
        "| avg, p99 ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for policy in policies:
        for load in loads:
            ours = [results[policy, load, w] for w in workloads]
            own = all((policy, load, w) in shipped for w in workloads)
            reference = policy if own else REFERENCE
            theirs = [shipped[reference, load, w] for w in workloads]
            avg = float(np.mean([r.average_jct for r in ours]))
            p99 = float(np.mean([r.p99_jct for r in ours]))
            wait = max(max(r.waits.values()) for r in ours)
            # Waits are pooled per load: the p99 of every job's wait over the workloads.
            pooled = np.percentile([w for r in ours for w in r.waits.values()], 99)
            want_avg = float(np.mean([t.average for t in theirs]))
            want_p99 = float(np.mean([t.p99 for t in theirs]))
            if own:
                worst = max(worst, abs(avg / want_avg - 1))
            print(
                f"| {policy} | {load}x | {avg:,.0f} | {p99:,.0f} | {pooled:,.0f} / {wait:,} "
                f"| {reference} {want_avg:,.0f} / {want_p99:,.0f} "
                f"| {avg / want_avg:.2f}, {p99 / want_p99:.2f} |"
            )
    print(f"\nlargest average-JCT deviation of a baseline: {worst:.1%} (tolerance {TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
