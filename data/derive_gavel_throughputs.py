"""Builds ``gavel-throughputs.csv`` from the measured throughputs of Gavel's simulator.

    python data/derive_gavel_throughputs.py GAVEL/scheduler/simulation_throughputs.json \
        > data/gavel-throughputs.csv

``GAVEL`` is a checkout of stanford-futuredata/gavel. Its JSON maps a GPU type to a job type
``('<model>', <scale factor>)`` to the throughputs of that job alone (``"null"``) and beside
each other job (space sharing). Kept: the throughput alone, on the three types (``k80``,
``p100``, ``v100``), for each model and GPU count, in steps per second where a step is one
iteration of one worker at the model's batch. Dropped: the co-located pairs (not modelled
here), the ``*_unconsolidated`` types (a gang spread over servers; Gavel's default
simulation uses the consolidated figures) and the points measured as 0 (the model did not
run at that size). Throughputs are kept to six significant figures.
"""

from __future__ import annotations

import ast
import csv
import json
import sys
from pathlib import Path

GPU_TYPES = ("k80", "p100", "v100")


def main(source: Path) -> None:
    table = json.loads(source.read_text())
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["model", "gpu_type", "gpus", "steps_per_s"])
    rows = []
    for gpu_type in GPU_TYPES:
        for key, measured in table[gpu_type].items():
            model, gpus = ast.literal_eval(key)
            alone = measured["null"]
            if alone > 0:
                rows.append((model, gpu_type, int(gpus), f"{alone:.6g}"))
    out.writerows(sorted(rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
