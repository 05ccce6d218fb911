"""FfDL's learner environment, as FfDL code reads it, through a live server.

The jobs below are FfDL-style code: they read every variable FfDL's learners set (with
FfDL's own idioms, e.g. ``int(float(os.environ["GPU_COUNT"]))``), build peer host names from
``LEARNER_NAME_PREFIX`` as FfDL's distributed examples do, write TensorBoard-style files under
``$JOB_STATE_DIR/logs/tb``, and report what they saw in their results.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ffdl.server.services.learner_env import learner_host_name
from tests.integration.live import LiveServer, manifest_yaml, serving

READ_ENVIRONMENT = """
import json, os, socket

learner = int(os.environ["LEARNER_ID"])
prefix = os.environ["LEARNER_NAME_PREFIX"]
seen = {
    "env": dict(os.environ),
    "gpus": int(float(os.environ["GPU_COUNT"])),
    "hostname": socket.gethostname(),
    "own_address": socket.gethostbyname(socket.gethostname()),
    "peers": {
        f"{prefix}-{i}.{prefix}": socket.gethostbyname(f"{prefix}-{i}.{prefix}")
        for i in range(int(os.environ["NUM_LEARNERS"]))
    },
    "bucket_is_results": os.path.samefile(
        os.path.join(os.environ["RESULT_BUCKET_DIR"], os.environ["TRAINING_ID"]),
        os.environ["RESULT_DIR"],
    ),
}
tb = os.path.join(os.environ["JOB_STATE_DIR"], "logs", "tb")
os.makedirs(tb, exist_ok=True)
with open(os.path.join(tb, f"events.out.learner{learner}"), "w") as handle:
    handle.write(f"scalars of learner {learner}\\n")
with open(os.path.join(os.environ["RESULT_DIR"], f"env-{learner}.json"), "w") as handle:
    json.dump(seen, handle)
"""

# Learner 1 listens on its own name's address; learner 2 reaches it by FfDL's host name.
TALK_BY_NAME = """
import os, socket, time

prefix = os.environ["LEARNER_NAME_PREFIX"]
port = int(os.environ["MASTER_PORT"])
if os.environ["LEARNER_ID"] == "1":
    server = socket.create_server((socket.gethostbyname(socket.gethostname()), port))
    connection, _ = server.accept()
    greeting = connection.recv(100).decode()
    print("learner 1 heard:", greeting, flush=True)
    with open(os.path.join(os.environ["RESULT_DIR"], "heard.txt"), "w") as handle:
        handle.write(greeting)
else:
    deadline = time.time() + 60
    while True:
        try:
            connection = socket.create_connection((f"{prefix}-0.{prefix}", port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    connection.sendall(f"hello from {socket.gethostname()}".encode())
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path_factory.mktemp("ffdl-env") / "home")) as live:
        yield live


def results_of(server: LiveServer, job_id: str) -> dict[str, bytes]:
    response = server.client.get(f"/v1/models/{job_id}/trained_model")
    assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def run_job(server: LiveServer, command: str, code: str, **extra: Any) -> str:
    manifest = manifest_yaml(command, **extra)
    job_id = server.submit_ok(manifest, {"job.py": code})
    server.wait_status(job_id, {"COMPLETED"}, timeout=120)
    return job_id


def test_ffdl_code_reads_every_variable_ffdl_set(server: LiveServer) -> None:
    command = "echo reading\npython job.py"
    job_id = run_job(server, command, READ_ENVIRONMENT, gpus=2)
    seen = json.loads(results_of(server, job_id)["env-1.json"])
    env = seen["env"]
    job_dir = server.home.resolve() / "jobs" / job_id
    assert seen["gpus"] == 2 and env["GPU_COUNT"] == "2.000000"
    # FfDL's form of the command: its lines joined with spaces.
    assert env["TRAINING_COMMAND"] == "echo reading python job.py"
    assert env["TRAINING_ID"] == job_id and env["LEARNER_ID"] == "1"
    assert env["NUM_LEARNERS"] == "1"
    prefix = env["LEARNER_NAME_PREFIX"]
    assert prefix.startswith("learner-") and env["DOWNWARD_API_POD_NAME"] == f"{prefix}-0"
    # FfDL's pod-name idiom gives the learner id back.
    assert int(env["DOWNWARD_API_POD_NAME"].rsplit("-", 1)[1]) + 1 == 1
    assert env["LOG_DIR"] == env["JOB_STATE_DIR"] + "/logs"
    assert seen["bucket_is_results"] is True
    for name in ("DATA_DIR", "RESULT_DIR", "MODEL_DIR", "CHECKPOINT_DIR", "JOB_STATE_DIR"):
        assert Path(env[name]).is_relative_to(job_dir), name
    assert seen["hostname"] == f"{prefix}-0"
    assert seen["own_address"] == seen["peers"][f"{prefix}-0.{prefix}"]
    # What the code wrote under $JOB_STATE_DIR/logs is the learner's own log directory.
    tb_file = job_dir / "logs" / "learner-1" / "tb" / "events.out.learner1"
    assert tb_file.read_text() == "scalars of learner 1\n"
    assert (job_dir / "logs" / "learner-1" / "training-log.txt").exists()


def test_no_control_plane_variable_reaches_user_code(server: LiveServer) -> None:
    job_id = run_job(server, "python job.py", READ_ENVIRONMENT)
    env: dict[str, str] = json.loads(results_of(server, job_id)["env-1.json"])["env"]
    text = json.dumps(env)
    assert server.token not in text and str(server.port) not in text
    assert not any("TOKEN" in key or "SECRET" in key or "PASSWORD" in key for key in env)
    assert {key for key in env if key.startswith(("FFDL_", "DLAAS"))} <= {
        "FFDL_GPUS",
        "FFDL_ATTEMPT",
    }
    assert "spec.json" not in text and "ffdl.db" not in text


def test_distributed_learners_have_their_own_logs_and_reach_each_other_by_name(
    server: LiveServer,
) -> None:
    job_id = run_job(server, "python job.py", READ_ENVIRONMENT, learners=2, gpus=1)
    results = results_of(server, job_id)
    first, second = (json.loads(results[f"env-{n}.json"]) for n in (1, 2))
    prefix = first["env"]["LEARNER_NAME_PREFIX"]
    assert second["env"]["LEARNER_NAME_PREFIX"] == prefix
    assert (first["hostname"], second["hostname"]) == (f"{prefix}-0", f"{prefix}-1")
    assert first["peers"] == second["peers"] and len(set(first["peers"].values())) == 2
    # Both see LOG_DIR at $JOB_STATE_DIR/logs, and each wrote into its own directory.
    assert first["env"]["LOG_DIR"] == second["env"]["LOG_DIR"]
    logs = server.home / "jobs" / job_id / "logs"
    for learner in (1, 2):
        written = sorted(p.name for p in (logs / f"learner-{learner}" / "tb").iterdir())
        assert written == [f"events.out.learner{learner}"]

    talk = run_job(server, "python job.py", TALK_BY_NAME, learners=2, gpus=1)
    heard = results_of(server, talk)["heard.txt"].decode()
    assert heard == f"hello from {learner_host_name(talk, 2)}"
