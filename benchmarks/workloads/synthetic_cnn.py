"""A training workload for ``bench_gpu_overhead``: a small CNN on synthetic images.

Runs the same way bare (``python synthetic_cnn.py``) and as an ffdl job. It trains on the
GPU when torch sees one (bf16 autocast), else on the CPU with a smaller configuration;
with ``BENCH_DEVICE=cuda`` a GPU it cannot use is an error (CUDA's own), never a quiet
fall-back to the CPU. It reports through the SDK every ``REPORT_EVERY`` steps as a real
job would, and prints one ``RESULT {json}`` line with its own timing of the training loop.
"""

from __future__ import annotations

import json
import os
import time

import torch
from torch import nn

from ffdl.sdk.api import report

REPORT_EVERY = 20
WARMUP_STEPS = 10


def model(width: int) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )

    return nn.Sequential(
        block(3, width),
        block(width, width * 2),
        block(width * 2, width * 4),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width * 4, 10),
    )


def main() -> None:
    cuda = torch.cuda.is_available()
    if os.environ.get("BENCH_DEVICE") == "cuda" and not cuda:
        # is_available() hides why; initialising says it (out of memory, no driver, ...).
        torch.cuda.init()
        raise SystemExit("BENCH_DEVICE=cuda, but torch sees no usable CUDA device")
    device = torch.device("cuda" if cuda else "cpu")
    steps = int(os.environ.get("BENCH_STEPS", "2000" if cuda else "40"))
    batch = int(os.environ.get("BENCH_BATCH", "256" if cuda else "32"))
    torch.manual_seed(0)
    net = model(128 if cuda else 16).to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    # A fixed pool of synthetic batches on the device: the figure is training, not loading.
    images = [
        torch.randn(batch, 3, 32, 32, device=device).to(memory_format=torch.channels_last)
        for _ in range(8)
    ]
    labels = [torch.randint(0, 10, (batch,), device=device) for _ in range(8)]

    def step(i: int) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = loss_fn(net(images[i % 8]), labels[i % 8])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    for i in range(WARMUP_STEPS):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(1, steps + 1):
        loss = step(i)
        if i % REPORT_EVERY == 0:
            report(step=i, samples=i * batch, loss=float(loss))
    if cuda:
        torch.cuda.synchronize()
    train_s = time.perf_counter() - started
    result = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "steps": steps,
        "batch": batch,
        "train_s": train_s,
        "samples_per_s": steps * batch / train_s,
        "loss": float(loss),
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
