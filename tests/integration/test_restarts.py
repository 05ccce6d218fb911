"""Automatic restarts from the last checkpoint, through a real server and real controllers.

A job with ``max_restarts`` left goes back through the queue after a crash or a lost
controller, waits out its back-off and resumes from its checkpoint; without restarts left it
fails with the last cause; a FAILED job resumes by hand; halts and cancellations are never
retried.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from datetime import datetime
from typing import Any

from rich.console import Console

from ffdl.cli.render import model_panel
from ffdl.server.services.restarts import BACKOFF_FIRST_S
from tests.integration import views
from tests.integration.live import LiveServer, manifest_yaml, wait_for

# Checkpoints every step with the SDK; crashes once after step CRASH_AT unless the marker in
# JOB_STATE_DIR says it already has (the marker outlives the attempt, like the checkpoints).
CRASH_ONCE = """
import os, pathlib, sys, time
from ffdl.sdk.api import load_checkpoint, save_checkpoint

CRASH_AT, LAST = 4, 8
restored = load_checkpoint()
step = 0 if restored is None else restored[1]["step"]
print(f"start at step {step}", flush=True)
marker = pathlib.Path(os.environ["JOB_STATE_DIR"], "crashed")
while step < LAST:
    step += 1
    print(f"step {step}", flush=True)
    save_checkpoint({"step": step}, step, keep=2)
    if step == CRASH_AT and not marker.exists():
        marker.write_text("once")
        print("crashing on purpose", flush=True)
        sys.exit(1)
    time.sleep(0.05)
print("finished", flush=True)
"""

ALWAYS_CRASH = """
import sys
print("bad input: cannot go on", flush=True)
sys.exit(2)
"""

# Runs until released through a file in JOB_STATE_DIR; checkpoints every step.
UNTIL_RELEASED = """
import os, pathlib, time
from ffdl.sdk.api import load_checkpoint, save_checkpoint

restored = load_checkpoint()
step = 0 if restored is None else restored[1]["step"]
print(f"start at step {step}", flush=True)
release = pathlib.Path(os.environ["JOB_STATE_DIR"], "release")
while not release.exists():
    step += 1
    print(f"step {step}", flush=True)
    save_checkpoint({"step": step}, step, keep=2)
    time.sleep(0.1)
print("finished", flush=True)
"""

# No SDK: a halt or a cancel ends it by signal, with a non-zero exit, which is no crash.
LOOP = """
import time
print("looping", flush=True)
while True:
    time.sleep(0.1)
"""


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def _lines(server: LiveServer, job_id: str) -> list[str]:
    return [str(item["line"]) for item in server.loglines(job_id)]


def _restart_events(model: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        ev
        for ev in model["events"]
        if ev["learner"] is None and ev["to"] == "QUEUED" and ev["reason"].startswith("restart ")
    ]


def _printed(server: LiveServer, job_id: str, line: str) -> Callable[[], bool]:
    return lambda: line in _lines(server, job_id)


def _state_file(server: LiveServer, job_id: str, name: str) -> None:
    (server.home / "jobs" / job_id / "state" / name).touch()


def test_a_crash_restarts_the_job_from_its_checkpoint(server: LiveServer) -> None:
    restarts_before = views.metric(server, "ffdl_restarts_total")
    job_id = server.submit_ok(
        manifest_yaml("python train.py", max_restarts=2, gpus=0), {"train.py": CRASH_ONCE}
    )
    model = server.wait_status(job_id, {"COMPLETED"}, timeout=90)
    assert views.metric(server, "ffdl_restarts_total") == restarts_before + 1
    assert views.metric(server, "ffdl_restarts_total", tenant=model["tenant"]) >= 1

    lines = _lines(server, job_id)
    assert "crashing on purpose" in lines
    assert lines.count("start at step 0") == 1
    assert "start at step 4" in lines, "the second attempt resumes from the step-4 checkpoint"
    assert lines[-1] == "finished"
    assert [line for line in lines if line.startswith("step ")] == [
        f"step {i}" for i in (1, 2, 3, 4, 5, 6, 7, 8)
    ]

    restarts = _restart_events(model)
    assert len(restarts) == 1
    assert restarts[0]["reason"].startswith("restart 1 of 2 after learner 1 exited with code 1")
    assert "crashing on purpose" in restarts[0]["reason"]
    attempts = model["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[0]["status"] == "FAILED"
    assert attempts[0]["reason"] == restarts[0]["reason"]
    assert attempts[1]["status"] == "COMPLETED" and attempts[1]["ended"] is not None
    assert model["restarts"] == {"taken": 1, "max": 2}
    waited = (_when(attempts[1]["started"]) - _when(restarts[0]["time"])).total_seconds()
    assert waited >= BACKOFF_FIRST_S - 0.01


def test_without_restarts_left_the_job_fails_with_the_last_cause(server: LiveServer) -> None:
    job_id = server.submit_ok(
        manifest_yaml("python crash.py", max_restarts=1, gpus=0), {"crash.py": ALWAYS_CRASH}
    )

    def backing_off() -> dict[str, Any] | None:
        model = server.model(job_id)
        return model if _restart_events(model) else None

    waiting = wait_for(backing_off, timeout=60, what="the first restart")
    if waiting["training"]["training_status"]["status"] == "QUEUED":
        queue = waiting["queue"]
        assert queue["reason"].startswith("restarting after learner 1 exited with code 2")
        assert "back-off until" in queue["reason"]

    model = server.wait_status(job_id, {"FAILED"}, timeout=60)
    status = model["training"]["training_status"]
    assert status["error_code"] == "C201" and status["exit_code"] == 2
    assert status["status_message"].startswith("learner 1 exited with code 2")
    assert "bad input: cannot go on" in status["status_message"]

    restarts = _restart_events(model)
    assert len(restarts) == 1 and restarts[0]["reason"].startswith("restart 1 of 1 after")
    attempts = model["attempts"]
    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, "FAILED"), (2, "FAILED")]
    assert model["restarts"] == {"taken": 1, "max": 1}
    waited = (_when(attempts[1]["started"]) - _when(attempts[0]["ended"])).total_seconds()
    assert waited >= BACKOFF_FIRST_S - 0.01, "the second attempt started before its back-off"
    assert _lines(server, job_id).count("bad input: cannot go on") == 2

    # ``ffdl show`` lists both attempts, how each ended and why.
    console = Console(record=True, width=200)
    console.print(model_panel(model))
    shown = console.export_text()
    assert "Attempts (automatic restarts 1 of 1)" in shown
    rows = [line for line in shown.splitlines() if re.match(r"│ +[12] +\d\d:\d\d", line)]
    assert len(rows) == 2 and all(" FAILED " in row for row in rows), shown
    assert "restart 1 of 1 after learner 1 exited with code 2" in rows[0]
    assert " learner 1 exited with code 2" in rows[1]


def test_a_failed_job_resumed_by_hand_continues_from_its_checkpoint(server: LiveServer) -> None:
    job_id = server.submit_ok(manifest_yaml("python train.py", gpus=0), {"train.py": CRASH_ONCE})
    server.wait_status(job_id, {"FAILED"})
    assert not _restart_events(server.model(job_id)), "max_restarts 0 restarts nothing"

    response = server.client.patch(f"/v1/models/{job_id}", json={"status": "resume"})
    assert response.status_code == 202, response.text
    model = server.wait_status(job_id, {"COMPLETED"}, timeout=60)
    lines = _lines(server, job_id)
    assert lines.count("start at step 0") == 1 and "start at step 4" in lines
    assert [a["status"] for a in model["attempts"]] == ["FAILED", "COMPLETED"]
    resumed = [ev for ev in model["events"] if ev["from"] == "FAILED" and ev["to"] == "QUEUED"]
    assert len(resumed) == 1 and "resumed by user" in resumed[0]["reason"]

    again = server.client.patch(f"/v1/models/{job_id}", json={"status": "resume"})
    assert again.status_code == 409, "a COMPLETED job does not resume"


def test_halt_and_cancel_are_never_restarted(server: LiveServer) -> None:
    manifest = manifest_yaml("python loop.py", max_restarts=3, gpus=0)
    halted = server.submit_ok(manifest, {"loop.py": LOOP})
    cancelled = server.submit_ok(manifest, {"loop.py": LOOP})
    for job_id in (halted, cancelled):
        server.wait_status(job_id, {"PROCESSING"})
        wait_for(_printed(server, job_id, "looping"), what="the loop to start")

    response = server.client.patch(f"/v1/models/{halted}", json={"status": "halt"})
    assert response.status_code == 202, response.text
    response = server.client.patch(f"/v1/models/{cancelled}", json={"status": "cancel"})
    assert response.status_code == 202, response.text
    server.wait_status(halted, {"HALTED"}, timeout=30)
    server.wait_status(cancelled, {"CANCELLED"}, timeout=30)

    for job_id in (halted, cancelled):
        model = server.model(job_id)
        assert not _restart_events(model)
        assert model["restarts"]["taken"] == 0
        assert len(model["attempts"]) == 1
    assert server.model(halted)["attempts"][0]["status"] == "HALTED"
    assert server.model(cancelled)["attempts"][0]["status"] == "CANCELLED"


def test_a_killed_controller_restarts_the_job(server: LiveServer) -> None:
    job_id = server.submit_ok(
        manifest_yaml("python train.py", max_restarts=1, gpus=0), {"train.py": UNTIL_RELEASED}
    )
    server.wait_status(job_id, {"PROCESSING"})
    wait_for(lambda: "step 3" in _lines(server, job_id), what="step 3")
    pid_file = server.home / "jobs" / job_id / "learners" / "1" / "attempt-1" / "launched.pid"
    os.kill(int(pid_file.read_text()), signal.SIGKILL)

    def restarted() -> list[dict[str, Any]]:
        return _restart_events(server.model(job_id))

    events = wait_for(restarted, timeout=30, what="the restart")
    assert events[0]["reason"].startswith("restart 1 of 1 after controller of learner 1")
    wait_for(
        lambda: any(
            re.fullmatch(r"start at step [1-9]\d*", line) for line in _lines(server, job_id)
        ),
        timeout=60,
        what="the second attempt to start from a checkpoint",
    )
    _state_file(server, job_id, "release")
    model = server.wait_status(job_id, {"COMPLETED"}, timeout=60)
    assert [a["status"] for a in model["attempts"]] == ["FAILED", "COMPLETED"]
    resumed_at = next(
        int(m.group(1))
        for line in _lines(server, job_id)
        if (m := re.fullmatch(r"start at step (\d+)", line)) and m.group(1) != "0"
    )
    assert resumed_at >= 3
