"""Run every benchmark in this directory, one after another, each printing its own figures."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = [
    "bench_scheduler",
    "bench_optimizer",
    "bench_submit_latency",
    "bench_halt_resume",
    "bench_api",
    "bench_simulator",
]


def main() -> None:
    sys.path.insert(0, str(HERE))
    names = [n for n in ORDER if (HERE / f"{n}.py").exists()]
    names += sorted(p.stem for p in HERE.glob("bench_*.py") if p.stem not in ORDER)
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        started = time.perf_counter()
        importlib.import_module(name).main()
        print(f"({name} took {time.perf_counter() - started:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
