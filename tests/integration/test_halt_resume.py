"""Halt checkpoints a job and frees its resources; resume continues from the checkpoint."""

from __future__ import annotations

import re

from tests.integration.live import LiveServer, manifest_yaml, wait_for

COUNTER = """
import sys, time
from ffdl.sdk.api import load_checkpoint, report, save_checkpoint, should_stop

restored = load_checkpoint()
step, loss = (0, 10.0) if restored is None else (restored[1]["step"], restored[1]["loss"])
print(f"start at step {step} loss {loss:.6f}", flush=True)
while step < 40:
    step += 1
    loss *= 0.95
    print(f"step {step} loss {loss:.6f}", flush=True)
    report(step=step, loss=loss)
    save_checkpoint({"step": step, "loss": loss}, step, keep=2)
    if should_stop():
        print(f"halting after step {step}", flush=True)
        sys.exit(0)
    time.sleep(0.1)
print("finished", flush=True)
"""


def test_halt_then_resume_continues_step_and_loss(server: LiveServer) -> None:
    job_id = server.submit_ok(manifest_yaml("python counter.py"), {"counter.py": COUNTER})
    server.wait_status(job_id, {"PROCESSING"})
    wait_for(
        lambda: any(i["line"].startswith("step 5 ") for i in server.loglines(job_id)),
        timeout=60,
        what="step 5",
    )
    halted = server.client.patch(f"/v1/models/{job_id}", json={"status": "halt"})
    assert halted.status_code == 202
    model = server.wait_status(job_id, {"HALTED"}, timeout=30)
    assert model["placement"] is None or model["placement"] == []
    nodes = server.client.get("/v1/nodes").json()["nodes"]
    assert all(node["used"]["gpus"] == 0 for node in nodes), "halted job still holds GPUs"

    before = [i["line"] for i in server.loglines(job_id)]
    halted_at = next(
        int(m.group(1)) for line in before if (m := re.match(r"halting after step (\d+)", line))
    )
    loss_at_halt = next(
        line.split()[-1] for line in before if line.startswith(f"step {halted_at} ")
    )

    resumed = server.client.patch(f"/v1/models/{job_id}", json={"status": "resume"})
    assert resumed.status_code == 202, resumed.text
    server.wait_status(job_id, {"COMPLETED"}, timeout=90)

    lines = [i["line"] for i in server.loglines(job_id)]
    assert f"start at step {halted_at} loss {loss_at_halt}" in lines
    steps = [int(line.split()[1]) for line in lines if re.match(r"step \d+ loss", line)]
    assert steps == list(range(1, 41)), "every step exactly once across halt and resume"
    assert lines[-1] == "finished" or "finished" in lines
    records = server.client.get(f"/v1/logs/{job_id}/emetrics", params={"pagesize": 1000})
    iterations = [int(r["etimes"]["iteration"]["value"]) for r in records.json()["models"]]
    assert iterations == list(range(1, 41))


def test_resume_of_a_running_job_is_refused(server: LiveServer) -> None:
    job_id = server.submit_ok(manifest_yaml("python -c 'import time; time.sleep(20)'"))
    server.wait_status(job_id, {"PROCESSING"})
    response = server.client.patch(f"/v1/models/{job_id}", json={"status": "resume"})
    assert response.status_code == 409
    assert "only HALTED jobs resume" in response.json()["description"]
    server.client.delete(f"/v1/models/{job_id}")
