"""A running job's progress and time left, from what it reports, through the API and the
CLI; a queued job's ETA taken from it; and how far that ETA was from the real start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.live import ffdl_output, manifest_yaml, running_server, wait_for

STEPS = 100
# 100 steps at 5 steps/s: about 20 s, reporting its total as it goes; long enough that it
# still runs, and the second job still waits, while two CLI commands start on a busy
# machine after its first estimate.
TRAIN = (
    "import time\n"
    "from ffdl.sdk.api import report\n"
    f"for step in range(1, {STEPS} + 1):\n"
    "    time.sleep(0.2)\n"
    f"    report(step, samples=step * 32, total_steps={STEPS}, loss=1.0 / step)\n"
)


def test_progress_time_left_and_the_queue_eta_that_follows_them(tmp_path: Path) -> None:
    with running_server(tmp_path / "home") as server:
        # Both take the node's 4 GPUs: the second waits for the first.
        first = server.submit_ok(manifest_yaml("python train.py", gpus=4), {"train.py": TRAIN})

        def estimated() -> dict[str, Any] | None:
            progress = server.model(first).get("progress") or {}
            return progress if progress.get("remaining_s") is not None else None

        progress = wait_for(estimated, timeout=60, what="a time-left estimate")
        assert progress["total_steps"] == STEPS and 0 < progress["fraction"] < 1
        assert progress["unit"] == "step" and 2.5 < progress["rate"] < 7.0
        assert progress["samples_per_s"] > 0 and progress["estimated_end_at"]
        assert 0 < progress["remaining_s"] < STEPS / 2.0

        second = server.submit_ok(manifest_yaml("python train.py", gpus=4), {"train.py": "pass"})

        def queued_with_eta() -> dict[str, Any] | None:
            model = server.model(second)
            queue = model.get("queue") or {}
            return model if queue.get("eta_s") is not None else None

        queued = wait_for(queued_with_eta, timeout=30, what="the queued job's ETA")
        running = server.model(first)["progress"]
        # Its ETA is the first job's estimated end (the job declared no duration).
        assert abs(queued["queue"]["eta_s"] - running["remaining_s"]) < 3.0

        listing = ffdl_output(server, "list")
        assert "…" not in listing
        assert "% " in listing and " left" in listing and "#1 ETA" in listing
        top = ffdl_output(server, "top", "--once")
        assert first in top and second in top and "…" not in top

        server.wait_status(second, {"COMPLETED"}, timeout=90)
        done = server.model(second)
        estimate = done["start_estimate"]
        assert estimate is not None and estimate["first_eta_at"] and estimate["started_at"]
        assert abs(estimate["error_s"]) < 10.0
        shown = ffdl_output(server, "show", second)
        assert "than first estimated" in shown
        finished = server.model(first)["progress"]
        assert finished["fraction"] == 1.0 and finished["remaining_s"] is None
