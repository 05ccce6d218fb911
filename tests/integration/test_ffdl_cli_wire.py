"""FfDL's own command-line client, as it speaks on the wire, against a running ffdl.

FfDL's Go CLI cannot be shipped or built here, so these tests send exactly what it sends:
``Authorization: Basic`` with the user's password and ``X-Watson-Userinfo:
bluemix-instance-id=USER`` on every call, ``?version=2017-02-13`` on the models paths and
``?version=2017-10-01`` on the logs paths, ``Accept: application/octet-stream`` for
downloads, and a websocket with the ``ws`` sub-protocol for ``logs --follow``. Every error
body must decode as FfDL's ``Error`` (``code`` an int), since the client decodes nothing else.
"""

from __future__ import annotations

import base64
import io
import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import websocket

from tests.integration.live import (
    LiveServer,
    code_zip,
    manifest_yaml,
    serving,
    socket_lines,
    wait_for,
)

USER = "test-user"
PASSWORD = "migrated from FfDL"
MODELS_VERSION = {"version": "2017-02-13"}
LOGS_VERSION = {"version": "2017-10-01"}
# FfDL's swagger ``Error``: what the CLI decodes every 4xx/5xx body into.
FFDL_ERROR = {
    "type": "object",
    "required": ["code", "error", "description"],
    "properties": {
        "code": {"type": "integer"},
        "error": {"type": "string"},
        "description": {"type": "string"},
    },
}
TRAIN = """
import json, os, pathlib
print("gpu count", int(float(os.environ["GPU_COUNT"])), flush=True)
for step in (1, 2, 3):
    print(f"step {step}", flush=True)
    with open(os.path.join(os.environ["LOG_DIR"], "emetrics.jsonl"), "a") as out:
        out.write(json.dumps({"step": step, "accuracy": step / 4}) + "\\n")
pathlib.Path(os.environ["RESULT_DIR"], "model.txt").write_text("weights")
"""
PACED = """
import os, pathlib, time
go = pathlib.Path(os.environ["RESULT_DIR"], "go")
print("waiting", flush=True)
while not go.exists():
    time.sleep(0.05)
for i in range(4):
    print(f"paced {i}", flush=True)
"""
LOOP = """
import time
print("looping", flush=True)
while True:
    time.sleep(0.1)
"""


def cli_headers(user: str = USER, password: str = PASSWORD) -> dict[str, str]:
    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {
        "Authorization": f"Basic {basic}",
        "X-Watson-Userinfo": f"bluemix-instance-id={user}",
    }


@dataclass
class Wire:
    server: LiveServer
    cli: httpx.Client
    done: str

    def train(self, command: str, files: dict[str, str]) -> str:
        response = self.cli.post(
            "/v1/models",
            params=MODELS_VERSION,
            files={
                "manifest": ("manifest.yml", manifest_yaml(command, gpus=0).encode()),
                "model_definition": ("model.zip", code_zip(files)),
            },
        )
        assert response.status_code == 201, response.text
        assert response.headers["location"].endswith(response.json()["model_id"])
        return str(response.json()["model_id"])

    def status(self, job_id: str) -> str:
        response = self.cli.get(f"/v1/models/{job_id}", params=MODELS_VERSION)
        assert response.status_code == 200, response.text
        return str(response.json()["training"]["training_status"]["status"])


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wire]:
    home: Path = tmp_path_factory.mktemp("ffdl-cli") / "home"
    with serving(LiveServer(home=home)) as server:
        admin = server.client
        added = admin.post("/v1/tenants/default/users", json={"name": USER})
        assert added.status_code == 201, added.text
        user_id = added.json()["user"]
        set_password = admin.put(f"/v1/users/{user_id}/password", json={"password": PASSWORD})
        assert set_password.status_code == 200, set_password.text
        with httpx.Client(base_url=server.url, headers=cli_headers(), timeout=30) as cli:
            ready = Wire(server=server, cli=cli, done="")
            ready.done = ready.train("python train.py", {"train.py": TRAIN})
            wait_for(lambda: ready.status(ready.done) == "COMPLETED", timeout=90, what="done")
            yield ready


def ffdl_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    jsonschema.validate(body, FFDL_ERROR)
    assert body["code"] == status
    return body


def test_a_wrong_password_gets_ffdls_bad_username_or_password(wire: Wire) -> None:
    for user, password in ((USER, "not it"), ("nobody", PASSWORD)):
        response = httpx.get(
            f"{wire.server.url}/v1/models",
            params=MODELS_VERSION,
            headers=cli_headers(user, password),
        )
        body = ffdl_error(response, 401)
        assert body["description"] == "Bad username or password."


def test_list_and_show_with_basic_and_watson_headers(wire: Wire) -> None:
    listed = wire.cli.get("/v1/models", params=MODELS_VERSION)
    assert listed.status_code == 200, listed.text
    assert wire.done in [model["model_id"] for model in listed.json()["models"]]
    shown = wire.cli.get(f"/v1/models/{wire.done}", params=MODELS_VERSION).json()
    assert shown["training"]["command"] == "python train.py"
    assert shown["training"]["training_status"]["status"] == "COMPLETED"
    unknown = wire.cli.get("/v1/models/training-unknown", params=MODELS_VERSION)
    assert "Model not found" in ffdl_error(unknown, 404)["description"]


def test_loglines_pagesize_and_emetrics_come_as_models(wire: Wire) -> None:
    page = wire.cli.get(f"/v1/logs/{wire.done}/loglines", params={**LOGS_VERSION, "pagesize": 2})
    assert page.status_code == 200, page.text
    assert len(page.json()["models"]) == 2
    everything = wire.cli.get(
        f"/v1/logs/{wire.done}/loglines", params={**LOGS_VERSION, "pagesize": 1000}
    ).json()["models"]
    assert "gpu count 0" in [line["line"] for line in everything]
    metrics = wire.cli.get(f"/v1/logs/{wire.done}/emetrics", params=LOGS_VERSION)
    assert metrics.status_code == 200, metrics.text
    accuracies = [record["values"]["accuracy"]["value"] for record in metrics.json()["models"]]
    assert [float(value) for value in accuracies] == [0.25, 0.5, 0.75]


def test_logs_and_logs_metrics_read_the_models_paths(wire: Wire) -> None:
    logs = wire.cli.get(f"/v1/models/{wire.done}/logs", params=MODELS_VERSION)
    assert logs.status_code == 200, logs.text
    assert "step 3" in logs.text.splitlines()
    metrics = wire.cli.get(f"/v1/models/{wire.done}/metrics", params=MODELS_VERSION)
    assert metrics.status_code == 200, metrics.text
    records = [json.loads(line) for line in metrics.text.splitlines() if line.strip()]
    assert [record["iteration"] for record in records] == [1, 2, 3]


def test_downloads_are_octet_streams_holding_the_zips(wire: Wire) -> None:
    accept = {"Accept": "application/octet-stream"}
    for path, member in (("definition", "train.py"), ("trained_model", "model.txt")):
        response = wire.cli.get(
            f"/v1/models/{wire.done}/{path}", params=MODELS_VERSION, headers=accept
        )
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/octet-stream"
        names = zipfile.ZipFile(io.BytesIO(response.content)).namelist()
        assert any(name.endswith(member) for name in names), names


def test_logs_follow_streams_live_lines_over_a_websocket_until_the_job_ends(wire: Wire) -> None:
    job_id = wire.train("python paced.py", {"paced.py": PACED})
    wait_for(lambda: wire.status(job_id) == "PROCESSING", timeout=60, what="the job to run")
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{wire.server.port}/v1/models/{job_id}/logs?version=2017-02-13",
        header=[f"{name}: {value}" for name, value in cli_headers().items()],
        subprotocols=["ws"],
        timeout=60,
    )
    results = Path(wire.server.model(job_id)["results"]["location"])
    (results / "go").write_text("")  # the job prints its lines only now, while followed
    lines = socket_lines(ws)
    ws.close()
    assert [line for line in lines if line.startswith("paced")] == [f"paced {i}" for i in range(4)]
    assert wire.status(job_id) == "COMPLETED"


def test_halt_then_delete(wire: Wire) -> None:
    job_id = wire.train("python loop.py", {"loop.py": LOOP})
    wait_for(lambda: wire.status(job_id) == "PROCESSING", timeout=60, what="the job to run")
    halted = wire.cli.patch(f"/v1/models/{job_id}", params=MODELS_VERSION, json={"status": "halt"})
    assert halted.status_code == 202, halted.text
    wait_for(lambda: wire.status(job_id) == "HALTED", timeout=60, what="the halt")
    deleted = wire.cli.delete(f"/v1/models/{job_id}", params=MODELS_VERSION)
    assert deleted.status_code == 200, deleted.text
    gone = wire.cli.get(f"/v1/models/{job_id}", params=MODELS_VERSION)
    ffdl_error(gone, 404)
