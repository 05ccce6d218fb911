"""Output a killed controller had read but not delivered is recovered, once, in order.

The server is stopped (SIGSTOP) while the job prints, so the lines pile up in the
controller's queue; the controller is then SIGKILLed and the server resumed. The monitor
finds the controller gone and stores the lines from its private output record.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
from pathlib import Path

import pytest

from ffdl.learner.output import OUTPUT_RECORD
from ffdl.server.services.salvage import read_record
from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for

LINES = 20_000
# Prints "ready", waits for the test's "go" file, then prints LINES numbered lines and "done".
PRINT_ON_GO = f"""
import os, sys, time
print("ready", flush=True)
go = os.path.join(os.environ["JOB_STATE_DIR"], "go")
while not os.path.exists(go):
    time.sleep(0.02)
sys.stdout.writelines(f"{{n}}\\n" for n in range({LINES}))
print("done", flush=True)
"""


def stored_lines(home: Path, job_id: str, stream: str) -> list[str]:
    with sqlite3.connect(home / "ffdl.db") as db:
        rows = db.execute(
            "SELECT text FROM log_lines WHERE job_id = ? AND stream = ? ORDER BY attempt, seq",
            (job_id, stream),
        ).fetchall()
    return [text for (text,) in rows]


@pytest.mark.timeout(180)
def test_lines_of_a_killed_controller_are_recovered_once_in_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = LiveServer(home=home, config=dict(FAST_CONFIG))
    with serving(server):
        job_id = server.submit_ok(
            manifest_yaml("python job.py", gpus=0, max_restarts=0), {"job.py": PRINT_ON_GO}
        )
        wait_for(lambda: "ready" in stored_lines(home, job_id, "stdout"), timeout=60, what="ready")
        attempt_dir = home / "jobs" / job_id / "learners" / "1" / "attempt-1"
        record = attempt_dir / OUTPUT_RECORD
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        try:
            (home / "jobs" / job_id / "state" / "go").touch()
            # Everything the job printed has been read, and none of it can be delivered.
            wait_for(
                lambda: [r.text for r in read_record(record)[-1:]] == ["done"],
                timeout=60,
                what="the job's last line in the output record",
            )
            os.kill(int((attempt_dir / "launched.pid").read_text()), signal.SIGKILL)
        finally:
            server.proc.send_signal(signal.SIGCONT)
        model = server.wait_status(job_id, {"FAILED"}, timeout=60)

        expected = ["ready", *(str(n) for n in range(LINES)), "done"]
        assert stored_lines(home, job_id, "stdout") == expected
        notes = stored_lines(home, job_id, "ffdl")
        recovered = [note for note in notes if "after its controller was lost" in note]
        assert len(recovered) == 1, notes
        # The server was stopped before the job printed its numbered lines; a batch already
        # sent may still be stored once it resumes, the rest is recovered.
        found = re.fullmatch(
            r"\[ffdl\] recovered (\d+) lines of output from learner 1 "
            r"after its controller was lost",
            recovered[0],
        )
        assert found is not None and 0 < int(found.group(1)) <= LINES + 1, recovered
        assert "S201" in json.dumps(model), model
