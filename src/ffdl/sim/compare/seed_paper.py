"""The elastic scaling paper's experiment on its own terms, with memory-bounded batches.

The paper compares batch-adaptive elastic scaling with a baseline that scales GPUs at a
fixed batch size, by the jobs each completes within a horizon and their average completion
time, as the arrival rate grows past the cluster's capacity. Here both are ffdl's optimizer
(``elastic`` and ``elastic-fixed-batch``) on the comparison's engine and Philly-derived
workloads, at loads from 0.5 to well past capacity, every job's batch bounded per GPU by
memory, so the fixed-batch baseline can shrink a job only to ``ceil(B / max local batch)``
GPUs.

    python -m ffdl.sim.compare.seed_paper --loads 0.5,1,2,3,4 --seeds 0,1,2,3 --horizon-h 24

Prints, per load, the jobs completed within the horizon (from the window's start) and the
average JCT of the completed jobs for each policy, and the two ratios the paper reports.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path

from ffdl.sim.compare.engine import ClusterShape, simulate
from ffdl.sim.compare.policies import FfdlElastic
from ffdl.sim.compare.run import loads_and_seeds, markdown
from ffdl.sim.compare.workloads import WorkloadSpec, build
from ffdl.sim.philly import default_trace_path

HEADER = (
    "load",
    "jobs",
    "completed, fixed batch",
    "completed, adaptive",
    "× completed",
    "avg JCT, fixed batch",
    "avg JCT, adaptive",
    "÷ avg JCT",
)


def experiment(
    loads: Sequence[float], seeds: Sequence[int], horizon_h: float, trace: Path
) -> list[list[str]]:
    shape = ClusterShape()
    rows = []
    for load in loads:
        figures: dict[str, list[tuple[int, float]]] = {"fixed": [], "adaptive": []}
        jobs_count = 0
        for seed in seeds:
            jobs = build(WorkloadSpec(load=load, seed=seed), trace)
            jobs_count = len(jobs)
            for key, policy in (
                ("fixed", FfdlElastic(name="elastic-fixed-batch", fixed_batch=True)),
                ("adaptive", FfdlElastic()),
            ):
                result = simulate(jobs, policy, shape, horizon_s=horizon_h * 3600)
                jcts = result.jcts()
                average = statistics.fmean(jcts) / 3600 if jcts else float("nan")
                figures[key].append((result.completed, average))
        fixed_done = statistics.fmean(c for c, _ in figures["fixed"])
        adaptive_done = statistics.fmean(c for c, _ in figures["adaptive"])
        fixed_jct = statistics.fmean(j for _, j in figures["fixed"])
        adaptive_jct = statistics.fmean(j for _, j in figures["adaptive"])
        rows.append(
            [
                f"{load:g}",
                str(jobs_count),
                f"{fixed_done:.1f}",
                f"{adaptive_done:.1f}",
                f"{adaptive_done / fixed_done:.2f}×",
                f"{fixed_jct:.2f} h",
                f"{adaptive_jct:.2f} h",
                f"{fixed_jct / adaptive_jct:.2f}×",
            ]
        )
        print(" | ".join(rows[-1]), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ffdl.sim.compare.seed_paper")
    parser.add_argument("--loads", default="0.5,1,2,3,4")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--horizon-h", type=float, default=24.0)
    parser.add_argument("--trace", type=Path, default=None)
    args = parser.parse_args(argv)
    loads, seeds = loads_and_seeds(parser, args.loads, args.seeds)
    if args.horizon_h <= 0:
        parser.error("--horizon-h must be > 0")
    trace = args.trace or default_trace_path()
    if not trace.exists():
        parser.error(f"the Philly trace is not at {trace} (see data/README.md)")
    rows = experiment(loads, seeds, args.horizon_h, trace)
    print()
    print(markdown(HEADER, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
