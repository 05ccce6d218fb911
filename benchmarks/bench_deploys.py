"""Job starts under a burst: one deploy at a time against several side by side.

``JOBS`` jobs, each with a code archive to unpack, wait while every node is drained; the
nodes are then undrained at once, so that one scheduling pass places them all and the
lifecycle manager has them all to deploy. Run once with ``deploy_concurrency: 1`` and once
with the default, 4. Printed per setting: the time from the undrain until every job was
PROCESSING, and each job's undrain → PROCESSING (by the server's events), p50 and p99,
with the ratio of the second setting to the first.
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from _server import FAST_CONFIG, LiveServer, manifest_yaml, median, percentile, wait_for

JOBS = 40
SETTINGS = (1, 4)
# About 2 MB to unpack per job (a data file shipped with the code).
ARCHIVE_FILES = {"train.py": "print('trained')\n", "data.txt": os.urandom(1_000_000).hex()}
NODES = [
    {"name": f"node-{n}", "gpus": 16, "cpus": 64, "memory": "256GiB", "gpu_type": "cpu"}
    for n in range(4)
]


def _burst(concurrency: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        config = {**FAST_CONFIG, "nodes": NODES, "deploy_concurrency": concurrency}
        server = LiveServer(home=Path(tmp) / "home", config=config)
        server.start()
        try:
            manifest = manifest_yaml("python train.py", memory="128MiB")
            for node in NODES:
                server.client.post(f"/v1/nodes/{node['name']}/drain").raise_for_status()
            ids = [server.submit_ok(manifest, ARCHIVE_FILES) for _ in range(JOBS)]
            wait_for(
                lambda: all(server.status(job_id) == "QUEUED" for job_id in ids),
                timeout=60,
                interval=0.05,
            )
            opened = time.perf_counter()
            opened_at = datetime.now(UTC).replace(tzinfo=None)
            for node in NODES:
                server.client.post(f"/v1/nodes/{node['name']}/undrain").raise_for_status()

            def all_started() -> bool:
                return all(
                    server.status(job_id) in {"PROCESSING", "STORING", "COMPLETED"}
                    for job_id in ids
                )

            wait_for(all_started, timeout=300, interval=0.05)
            burst_s = time.perf_counter() - opened
            waits = []
            for job_id in ids:
                model = server.wait_status(job_id, {"COMPLETED"}, timeout=120)
                times = {e["to"]: e["time"] for e in model["events"] if e["learner"] is None}
                running = datetime.fromisoformat(times["PROCESSING"]).replace(tzinfo=None)
                waits.append((running - opened_at).total_seconds())
        finally:
            server.stop()
            server.kill_learners()
    return {
        "burst_s": burst_s,
        "p50_s": median(waits),
        "p99_s": percentile(waits, 99),
    }


def main() -> dict[int, dict[str, float]]:
    results = {concurrency: _burst(concurrency) for concurrency in SETTINGS}
    first = results[SETTINGS[0]]
    print(f"{JOBS} queued jobs released at once, each unpacking about 2 MB of code")
    print(f"{'deploy_concurrency':>20}{'all PROCESSING s':>18}{'p50 s':>14}{'p99 s':>14}")
    for concurrency, figures in results.items():
        cells = [
            f"{figures[key]:.2f} ({figures[key] / first[key]:.2f}×)"
            for key in ("burst_s", "p50_s", "p99_s")
        ]
        print(f"{concurrency:>20}{cells[0]:>18}{cells[1]:>14}{cells[2]:>14}")
    return results


if __name__ == "__main__":
    main()
