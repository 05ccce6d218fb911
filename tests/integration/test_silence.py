"""Silence is measured from when the platform could hear: a control plane that was down
longer than the heartbeat timeout does not kill the healthy jobs it finds on its return."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for

HEARTBEAT_TIMEOUT_S = 4.0
DOWN_S = 8.0  # twice the heartbeat timeout

COUNT = """
import time
for i in range(1, 301):
    print(f"line {i}", flush=True)
    time.sleep(0.05)
"""


def test_a_server_down_past_the_heartbeat_timeout_kills_no_job(tmp_path: Path) -> None:
    config = {**FAST_CONFIG, "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S}
    with serving(LiveServer(home=tmp_path / "home", config=config)) as server:
        job_id = server.submit_ok(manifest_yaml("python count.py", gpus=0), {"count.py": COUNT})
        server.wait_status(job_id, {"PROCESSING"})
        wait_for(lambda: len(server.loglines(job_id)) >= 10, what="the first lines")

        server.stop(signal.SIGKILL)
        # The outage itself is what is tested: the controllers must outlast it, buffering.
        time.sleep(DOWN_S)
        server.start()

        model = server.wait_status(job_id, {"COMPLETED"}, timeout=90)
        lines = [i["line"] for i in server.loglines(job_id) if i["line"].startswith("line ")]
        assert lines == [f"line {i}" for i in range(1, 301)]
        assert not [ev for ev in model["events"] if "silent" in ev["reason"]]
        assert [a["status"] for a in model["attempts"]] == ["COMPLETED"]
