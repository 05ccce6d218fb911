"""A job's whole life through a real server, real controllers and real user processes.

The tests share one server (``shared_server``), each looking at its own job only; the one
that kills and restarts the server has a server of its own (``server``).
"""

from __future__ import annotations

import io
import signal
import zipfile
from pathlib import Path

from tests.integration.live import LiveServer, job_pids, manifest_yaml, pid_alive, wait_for

TRAIN_OK = """
import json, os, pathlib
for step in range(1, 6):
    print(f"step {step} loss {1.0 / step:.4f}")
    with open(os.path.join(os.environ["LOG_DIR"], "emetrics.jsonl"), "a") as fh:
        fh.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
pathlib.Path(os.environ["RESULT_DIR"], "model.txt").write_text("weights")
print("done training")
"""

LONG_RUNNING = """
import os, pathlib, signal, sys, time
pathlib.Path(os.environ["RESULT_DIR"], "pid").write_text(str(os.getpid()))
print("started", flush=True)
while True:
    time.sleep(0.1)
"""


def test_job_completes_with_logs_metrics_and_trained_model(shared_server: LiveServer) -> None:
    job_id = shared_server.submit_ok(
        manifest_yaml("python train.py", evaluation_metrics={"type": "emetrics"}),
        {"train.py": TRAIN_OK},
    )
    model = shared_server.wait_status(job_id, {"COMPLETED"})
    assert model["training"]["training_status"]["exit_code"] == 0
    path = [e["to"] for e in model["events"] if e["learner"] is None]
    assert path == ["QUEUED", "PENDING", "DOWNLOADING", "PROCESSING", "STORING", "COMPLETED"]

    lines = [item["line"] for item in shared_server.loglines(job_id)]
    user_lines = [line for line in lines if line.startswith(("step", "done"))]
    assert user_lines == [f"step {i} loss {1.0 / i:.4f}" for i in range(1, 6)] + ["done training"]

    records = shared_server.client.get(f"/v1/logs/{job_id}/emetrics").json()["models"]
    assert [r["etimes"]["iteration"]["value"] for r in records] == ["1", "2", "3", "4", "5"]
    assert float(records[-1]["values"]["loss"]["value"]) == 0.2

    response = shared_server.client.get(f"/v1/models/{job_id}/trained_model")
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        assert archive.read("model.txt") == b"weights"
    definition = shared_server.client.get(f"/v1/models/{job_id}/definition")
    with zipfile.ZipFile(io.BytesIO(definition.content)) as archive:
        assert "train.py" in archive.namelist()


def test_failing_command_fails_job_with_exit_code_and_last_lines(shared_server: LiveServer) -> None:
    script = "import sys\nprint('loading data')\nprint('boom: bad tensor shape')\nsys.exit(3)\n"
    job_id = shared_server.submit_ok(manifest_yaml("python fail.py"), {"fail.py": script})
    model = shared_server.wait_status(job_id, {"FAILED"})
    status = model["training"]["training_status"]
    assert status["error_code"] == "C201"
    assert status["exit_code"] == 3
    assert "boom: bad tensor shape" in status["status_message"]


def test_delete_while_processing_cancels_then_removes_the_job(shared_server: LiveServer) -> None:
    job_id = shared_server.submit_ok(manifest_yaml("python loop.py"), {"loop.py": LONG_RUNNING})
    shared_server.wait_status(job_id, {"PROCESSING"})
    results = Path(shared_server.model(job_id)["results"]["location"])
    wait_for(lambda: (results / "pid").exists(), what="the command to start")
    pids = job_pids(job_id)
    assert pids
    job_dir = shared_server.home / "jobs" / job_id
    controllers = [int(p.read_text()) for p in (job_dir / "learners").rglob("launched.pid")]
    assert controllers

    response = shared_server.client.delete(f"/v1/models/{job_id}")
    assert response.status_code == 200, response.text
    assert response.json() == {"model_id": job_id, "status": "CANCELLED", "deleted": True}
    assert shared_server.client.get(f"/v1/models/{job_id}").status_code == 404
    assert shared_server.client.get(f"/v1/logs/{job_id}/loglines").status_code == 404
    # No data store: the results were the platform's, in the job's directory, and go too.
    assert not job_dir.exists() and not results.exists()
    wait_for(lambda: not job_pids(job_id), timeout=10, what="the job's processes to be gone")
    wait_for(
        lambda: not any(pid_alive(pid) for pid in controllers),
        timeout=10,
        what="controllers to be gone",
    )


def test_halt_stops_the_job_as_halted(shared_server: LiveServer) -> None:
    job_id = shared_server.submit_ok(manifest_yaml("python loop.py"), {"loop.py": LONG_RUNNING})
    shared_server.wait_status(job_id, {"PROCESSING"})
    results = Path(shared_server.model(job_id)["results"]["location"])
    wait_for(lambda: (results / "pid").exists(), what="the command to start")
    assert job_pids(job_id)
    response = shared_server.client.patch(f"/v1/models/{job_id}", json={"status": "halt"})
    assert response.status_code == 202, response.text
    model = shared_server.wait_status(job_id, {"HALTED"}, timeout=30)
    assert model["learners"][0]["status"] == "HALTED"
    assert not job_pids(job_id)


def test_restarting_the_server_loses_and_duplicates_no_log_line(
    server: LiveServer,
) -> None:
    script = """
    import time
    for i in range(1, 121):
        print(f"line {i}", flush=True)
        time.sleep(0.05)
    """
    job_id = server.submit_ok(manifest_yaml("python count.py"), {"count.py": script})
    server.wait_status(job_id, {"PROCESSING"})
    wait_for(lambda: len(server.loglines(job_id)) >= 10, what="first lines")

    server.stop(signal.SIGKILL)
    server.start()
    server.wait_status(job_id, {"COMPLETED"}, timeout=90)
    lines = [i["line"] for i in server.loglines(job_id) if i["line"].startswith("line ")]
    assert lines == [f"line {i}" for i in range(1, 121)]


def test_multi_learner_job_gets_distributed_environment(shared_server: LiveServer) -> None:
    script = (
        "import os\n"
        "print('env', os.environ['LEARNER_ID'], os.environ['RANK'], os.environ['WORLD_SIZE'],"
        " os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'], os.environ['NUM_LEARNERS'])\n"
    )
    job_id = shared_server.submit_ok(manifest_yaml("python env.py", learners=2), {"env.py": script})
    model = shared_server.wait_status(job_id, {"COMPLETED"})
    assert len(model["learners"]) == 2
    envs = sorted(
        tuple(item["line"].split()[1:])
        for item in shared_server.loglines(job_id)
        if item["line"].startswith("env ")
    )
    assert [e[:3] for e in envs] == [("1", "0", "2"), ("2", "1", "2")]
    assert {e[3] for e in envs} == {"127.0.0.1"}
    assert len({e[4] for e in envs}) == 1
