"""How far the queue's start-time ETAs and running jobs' time-left estimates are from what
happens, on a Philly-derived workload: from declared durations vs from the jobs' progress
(``ffdl.sim.eta_accuracy``).

    python benchmarks/eta_accuracy.py [--days 3] [--sample 0.2] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ffdl.sim.eta_accuracy import (  # noqa: E402
    DECLARED_SIGMA,
    MODES,
    measure,
    philly_workload,
    report,
    with_guessed_durations,
)
from ffdl.sim.experiments import cluster  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--sample", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = time.perf_counter()
    jobs = with_guessed_durations(philly_workload(args.days, args.sample), args.seed)
    nodes = cluster(8, 8, 64.0, 512, prefix="p64")
    results = [measure(nodes, jobs, mode) for mode in MODES]
    print(
        f"{len(jobs)} Philly jobs ({args.days} days from 2017-10-16, sample {args.sample:g}) "
        f"on 64 GPUs; declared durations = true x lognormal(sigma {DECLARED_SIGMA}), "
        f"seed {args.seed}"
    )
    print(report(results))
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
