"""Speed and memory of the cluster simulator on the whole Philly trace, against 60 s for FIFO.

The trace (82,247 jobs, ``data/philly-jobs.csv``) runs on 1,024 GPUs (128 nodes x 8 GPUs)
under ``fifo`` and under ``elastic``, each in a fresh process so that its peak memory (the
process's maximum resident set, interpreter and numpy included) is its own. Printed side by
side: wall time of the run (loading the trace excluded, and shown apart), peak memory, the
number of scheduler and autoscaler calls, and the virtual time covered. The goal of 60 s
applies to FIFO on two cores; the elastic policy solves the elastic optimizer at every
arrival and completion, and has no goal.

Then the policy comparison (``ffdl.sim.compare``), every compared policy:

- on one 160-job Philly-derived workload (load 1.0, seed 0) on 64 GPUs: wall time per policy
  beside FIFO's;
- on the whole trace (``workloads.whole_trace``: 74,428 jobs of at least 60 s and under 1,000
  GPU-hours, at their own submission times over 106 days) on 1,024 GPUs (128 nodes x 8),
  each policy given ``--trace-budget-s`` of wall time: the virtual days it covered, the jobs
  that arrived in them and those it completed, its pace in virtual days per wall minute, and
  its wall time for the whole trace when it finished within the budget. No time is projected
  for the others: the trace's first two weeks hold 28 of its jobs, so an early pace says
  nothing of the busy months after.

Run: ``python benchmarks/bench_simulator.py [--sample 0.1] [--policies fifo,elastic]
[--trace-budget-s 120]``.
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing
import resource
import time
from concurrent.futures import ProcessPoolExecutor

GOAL_S = 60.0
NODES, GPUS_PER_NODE = 128, 8
POLICIES = ("fifo", "elastic")


def run_one(policy: str, sample: float) -> dict[str, float]:
    """One simulation in this process; its figures (peak memory: this process's)."""
    from ffdl.core.resources import Node
    from ffdl.sim.engine import Simulator
    from ffdl.sim.philly import TraceFilter, load_philly
    from ffdl.sim.policies import make_policy

    started = time.perf_counter()
    nodes = [Node(f"node-{i:03d}", GPUS_PER_NODE, 64.0, 512 * 1024) for i in range(NODES)]
    jobs = load_philly(
        where=TraceFilter(sample=sample), gpus_per_node=GPUS_PER_NODE, max_gpus=NODES * 8
    )
    loaded = time.perf_counter()
    result = Simulator(nodes, jobs, make_policy(policy)).run()
    finished = time.perf_counter()
    summary = result.summary()
    return {
        "jobs": float(len(jobs)),
        "load_s": loaded - started,
        "wall_s": finished - loaded,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "scheduler_calls": float(result.scheduler_calls),
        "autoscale_calls": float(result.autoscale_calls),
        "virtual_days": result.end_s / 86400.0,
        "completed": summary["completed"],
        "avg_jct_h": summary["avg_jct_s"] / 3600.0,
    }


def run_isolated(policy: str, sample: float) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(run_one, policy, sample).result()


def compare_walls() -> dict[str, float]:
    """Wall seconds of each compared policy on the 160-job workload, printed as they go."""
    from ffdl.sim.compare.engine import ClusterShape, simulate
    from ffdl.sim.compare.run import POLICIES as COMPARED
    from ffdl.sim.compare.workloads import WorkloadSpec, build
    from ffdl.sim.philly import default_trace_path

    jobs = build(WorkloadSpec(load=1.0, seed=0), default_trace_path())
    walls = {}
    print(f"\n{len(jobs)} Philly-derived jobs on 64 GPUs (ffdl.sim.compare), one run each")
    print(f"{'policy':<20} {'wall s':>8} {'x fifo':>7} {'rounds':>7}")
    for name, make in COMPARED.items():
        started = time.perf_counter()
        result = simulate(jobs, make(), ClusterShape())
        walls[name] = time.perf_counter() - started
        rounds = result.makespan_s / 60.0
        ratio = walls[name] / walls["fifo"] if "fifo" in walls else 1.0
        print(f"{name:<20} {walls[name]:>8.2f} {ratio:>6.1f}x {rounds:>7.0f}")
    return walls


def compare_whole_trace(budget_s: float) -> dict[str, float]:
    """Each compared policy on the whole trace for at most ``budget_s`` wall seconds."""
    from ffdl.sim.compare.engine import ClusterShape, simulate
    from ffdl.sim.compare.run import POLICIES as COMPARED
    from ffdl.sim.compare.workloads import whole_trace
    from ffdl.sim.philly import default_trace_path

    jobs = whole_trace(default_trace_path(), gpus_per_node=8)
    span_days = (jobs[-1].submit_s - jobs[0].submit_s) / 86400
    print(
        f"\nthe whole trace: {len(jobs):,} jobs over {span_days:.0f} days on 1,024 GPUs "
        f"(ffdl.sim.compare), at most {budget_s:.0f} s of wall time per policy"
    )
    print(
        f"{'policy':<20} {'days':>6} {'jobs arrived':>12} {'jobs done':>10} {'wall s':>8} "
        f"{'days/min':>9} {'whole trace':>12}"
    )
    submits = [j.submit_s for j in jobs]
    walls = {}
    for name, make in COMPARED.items():
        started = time.perf_counter()

        def out_of_time(_now: float, started: float = started) -> bool:
            return time.perf_counter() - started > budget_s

        result = simulate(jobs, make(), ClusterShape(nodes=128, gpus_per_node=8), stop=out_of_time)
        wall = time.perf_counter() - started
        days = (result.end_s - jobs[0].submit_s) / 86400
        arrived = bisect.bisect_right(submits, result.end_s)
        whole = result.completed == len(jobs)
        if whole:
            walls[name] = wall
        label = f"{wall:>10.1f} s" if whole else "unfinished"
        print(
            f"{name:<20} {days:>6.1f} {arrived:>12,} {result.completed:>10,} {wall:>8.1f} "
            f"{days / (wall / 60):>9.2f} {label:>12}"
        )
    return walls


def main(
    sample: float = 1.0,
    policies: tuple[str, ...] = POLICIES,
    compare: bool = True,
    trace_budget_s: float = 120.0,
) -> dict[str, float]:
    figures = {policy: run_isolated(policy, sample) for policy in policies}
    header = (
        f"{'policy':<10} {'jobs':>7} {'wall s':>8} {'goal s':>7} {'ratio':>6} {'peak MiB':>9} "
        f"{'sched calls':>11} {'autoscale':>10} {'virtual d':>9} {'avg JCT h':>9} {'load s':>6}"
    )
    print(header)
    for policy, f in figures.items():
        goal = f"{GOAL_S:>7.0f}" if policy == "fifo" else f"{'-':>7}"
        ratio = f"{f['wall_s'] / GOAL_S:>5.2f}x" if policy == "fifo" else f"{'-':>6}"
        print(
            f"{policy:<10} {f['jobs']:>7,.0f} {f['wall_s']:>8.1f} {goal} {ratio} "
            f"{f['peak_mib']:>9.0f} {f['scheduler_calls']:>11,.0f} {f['autoscale_calls']:>10,.0f} "
            f"{f['virtual_days']:>9.1f} {f['avg_jct_h']:>9.2f} {f['load_s']:>6.1f}"
        )
    if "fifo" in figures and "elastic" in figures:
        fifo, elastic = figures["fifo"], figures["elastic"]
        print(
            f"elastic / fifo: wall {elastic['wall_s'] / fifo['wall_s']:.1f}x, "
            f"peak memory {elastic['peak_mib'] / fifo['peak_mib']:.2f}x"
        )
    result = {f"{policy}_{key}": value for policy, f in figures.items() for key, value in f.items()}
    if compare:
        result.update({f"compare_{name}_wall_s": wall for name, wall in compare_walls().items()})
        result.update(
            {
                f"compare_trace_{name}_wall_s": wall
                for name, wall in compare_whole_trace(trace_budget_s).items()
            }
        )
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=float, default=1.0, help="fraction of the trace")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    parser.add_argument(
        "--no-compare", action="store_true", help="skip the policy comparison's timings"
    )
    parser.add_argument(
        "--trace-budget-s",
        type=float,
        default=120.0,
        help="wall seconds each compared policy may spend on the whole trace",
    )
    args = parser.parse_args()
    if args.trace_budget_s <= 0:
        parser.error("--trace-budget-s must be > 0")
    policies = tuple(p for p in args.policies.split(",") if p)
    main(args.sample, policies, not args.no_compare, args.trace_budget_s)
