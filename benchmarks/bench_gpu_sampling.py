"""What sampling a learner's GPUs costs its training throughput (goal: < 0.5 %).

The same CPU-bound training loop (a small torch MLP on synthetic data, a fixed number of
steps) runs as its own process, as a learner's command does, several times in alternation:
with the controller-side sampler reading NVML every 0.5 s (ten times the default rate,
through the stand-in NVML library the tests use, delivering each reading as the controller
does to its report queue) and without it. Prints steps per second each way and the ratio,
and the CPU the sampler itself used: the direct cost, since on a noisy machine the
throughput ratio moves by more than 0.5 % from run to run, sampling or not.

    python benchmarks/bench_gpu_sampling.py [--rounds 9] [--steps 3000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.gpu_sampling.standin import Gpu, build, set_figures  # noqa: E402

from ffdl.learner.gpu_sampler import GpuSampler  # noqa: E402

TRAIN = """
import sys, time, torch
torch.manual_seed(0)
torch.set_num_threads(1)  # one core for training, the other for the controller's threads
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))

def step():
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()

steps = int(sys.argv[1])
for _ in range(50):
    step()
started = time.perf_counter()
for _ in range(steps):
    step()
print(steps / (time.perf_counter() - started))
"""


def train(steps: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", TRAIN, str(steps)], capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        library = build(Path(tmp))
        set_figures(library, [Gpu(90, 30000), Gpu(85, 29000)])
        delivered: list[str] = []
        on: list[float] = []
        off: list[float] = []
        cpu_on = wall_on = 0.0
        for _ in range(args.rounds):
            off.append(train(args.steps))
            # This process does nothing but sample meanwhile: its CPU time is the sampler's.
            cpu_started, wall_started = time.process_time(), time.perf_counter()
            sampler = GpuSampler(
                [0, 1], 0.5, lambda g: delivered.append(json.dumps(g)), str(library)
            )
            assert sampler.start(), "the stand-in NVML did not load"
            try:
                on.append(train(args.steps))
            finally:
                sampler.stop()
            cpu_on += time.process_time() - cpu_started
            wall_on += time.perf_counter() - wall_started
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    print(f"training throughput, {args.rounds} alternating rounds of {args.steps} steps")
    print(f"  sampling off  {statistics.median(off):8.1f} steps/s (median)")
    print(f"  sampling on   {statistics.median(on):8.1f} steps/s (median), every 0.5 s")
    print(
        f"  on/off ratio  median {statistics.median(ratios):.4f}  "
        f"min {min(ratios):.4f}  max {max(ratios):.4f}   (goal: cost < 0.5 %)"
    )
    print(
        f"  sampler CPU: {cpu_on / max(len(delivered), 1) * 1000:.3f} ms per reading, "
        f"{cpu_on / wall_on * 100:.3f} % of one core at 2 readings/s "
        f"({len(delivered)} readings)"
    )


if __name__ == "__main__":
    main()
