"""Builds ``pollux-profiles.csv`` from the measured profiles of Pollux's published simulator.

    python data/derive_pollux_profiles.py ADAPTDL/simulator/traces > data/pollux-profiles.csv

``ADAPTDL`` is a checkout of petuum/adaptdl at branch ``osdi21-artifact``. For each of the six
families, every row of ``placements.csv`` (a placement such as ``1123``: four nodes holding
1, 1, 2 and 3 GPUs) and of ``scalability.csv`` (node and GPU counts given as numbers)
becomes a (nodes, GPUs, local batch) point; the step times of the points measured more than
once are averaged. Step times are kept to five significant figures.
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

FAMILIES = ("cifar10", "ncf", "deepspeech2", "bert", "yolov3", "imagenet")


def main(traces: Path) -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["family", "nodes", "gpus", "local_batch", "step_time_s"])
    for family in FAMILIES:
        times: dict[tuple[int, int, int], list[float]] = defaultdict(list)
        with (traces / family / "placements.csv").open() as placements:
            for row in csv.DictReader(placements):
                per_node = [int(c) for c in row["placement"]]
                key = (len(per_node), sum(per_node), int(row["local_bsz"]))
                times[key].append(float(row["step_time"]))
        with (traces / family / "scalability.csv").open() as scalability:
            for row in csv.DictReader(scalability):
                key = (int(row["num_nodes"]), int(row["num_replicas"]), int(row["local_bsz"]))
                times[key].append(float(row["step_time"]))
        for (nodes, gpus, local), values in sorted(times.items()):
            out.writerow([family, nodes, gpus, local, f"{sum(values) / len(values):.5g}"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
