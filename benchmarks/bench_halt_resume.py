"""Halt → HALTED and resume → PROCESSING latency on the local backend.

The job checks ``should_stop()`` every 10 ms and keeps no state, so the figures are the
platform's own path (signal, controller, reports, loops, redeploy), not a checkpoint's cost.
Each cycle halts a PROCESSING job and resumes it; times come from the server's events.
"""

from __future__ import annotations

import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from _server import LiveServer, manifest_yaml, median, percentile

CYCLES = 10
LOOP = """
import sys, time
from ffdl.sdk.api import should_stop
while not should_stop():
    time.sleep(0.01)
sys.exit(0)
"""


def _event_times(model: dict[str, Any], target: str) -> list[datetime]:
    return [
        datetime.fromisoformat(e["time"])
        for e in model["events"]
        if e["learner"] is None and e["to"] == target
    ]


def main() -> dict[str, float]:
    halts: list[float] = []
    resumes: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = LiveServer(home=Path(tmp) / "home")
        server.start()
        try:
            job_id = server.submit_ok(manifest_yaml("python loop.py"), {"loop.py": LOOP})
            server.wait_status(job_id, {"PROCESSING"})
            for _ in range(CYCLES):
                server.client.patch(f"/v1/models/{job_id}", json={"status": "halt"})
                server.wait_status(job_id, {"HALTED"})
                server.client.patch(f"/v1/models/{job_id}", json={"status": "resume"})
                server.wait_status(job_id, {"PROCESSING"})
            model = server.model(job_id)
            server.client.delete(f"/v1/models/{job_id}")
        finally:
            server.stop()
            server.kill_learners()
    halting, halted = _event_times(model, "HALTING"), _event_times(model, "HALTED")
    queued, processing = _event_times(model, "QUEUED")[1:], _event_times(model, "PROCESSING")[1:]
    halts = [(b - a).total_seconds() for a, b in zip(halting, halted, strict=True)]
    resumes = [(b - a).total_seconds() for a, b in zip(queued, processing, strict=True)]
    result = {
        "halt_median_s": median(halts),
        "halt_p95_s": percentile(halts, 95),
        "resume_median_s": median(resumes),
        "resume_p95_s": percentile(resumes, 95),
    }
    print(f"halt/resume latency over {CYCLES} cycles (server events, no checkpoint cost)")
    print(
        f"  halt   → HALTED      median {result['halt_median_s']:.3f} s   "
        f"p95 {result['halt_p95_s']:.3f} s"
    )
    print(
        f"  resume → PROCESSING  median {result['resume_median_s']:.3f} s   "
        f"p95 {result['resume_p95_s']:.3f} s"
    )
    return result


if __name__ == "__main__":
    main()
