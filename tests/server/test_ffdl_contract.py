"""FfDL's REST contract, checked on a real server over real HTTP and real websockets.

Every FfDL path is called as FfDL's clients call it (``?version=...``, FfDL's query
parameters, ``Accept: application/octet-stream`` for downloads) and each answer is validated
against JSON Schemas transcribed here from FfDL's published spec
(``restapi/api_v1/swagger/swagger.yml`` of IBM/FfDL): FfDL's field names and types, where
ffdl may add fields but never rename or drop one. FfDL's spec marks no field as required;
the schemas below require the fields FfDL's server always sent and its clients read (its
CLI dereferences ``framework``, ``training.memory_unit`` and ``training.training_status``),
so a missing one fails. Two facts of the wire differ from the spec's text and are written
as FfDL's server really sent them: ``meta.time``/``meta.rindex`` are JSON integers (the
generated Go types are ``int64``), and ``submitted``/``completed`` are epoch milliseconds in
a string (FfDL's trainer wrote ``CurrentTimestampAsString``).

Error answers of every kind are validated against FfDL's ``Error`` (``code`` the HTTP
status as an integer), with ffdl's own code in ``ffdl_code``.
"""

from __future__ import annotations

import io
import json
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import websocket
import yaml

from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    code_zip,
    job_pids,
    manifest_yaml,
    serving,
    wait_for,
)

MODELS_VERSION = {"version": "2017-02-13"}
LOGS_VERSION = {"version": "2017-10-01"}

# -- FfDL's definitions, transcribed ------------------------------------------------------

_EPOCH_MILLIS = {"type": "string", "pattern": "^[0-9]+$"}
_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
_INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
_STRINGS = {"type": "array", "items": {"type": "string"}}

DEFINITIONS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "properties": {
            "code": _INT32,
            "error": {"type": "string"},
            "description": {"type": "string"},
        },
        "required": ["code", "error", "description"],
    },
    "BasicModel": {
        "type": "object",
        "properties": {"model_id": {"type": "string", "minLength": 1}},
        "required": ["model_id"],
    },
    "BasicNewModel": {
        "allOf": [
            {"$ref": "#/$defs/BasicModel"},
            {"properties": {"location": {"type": "string"}}, "required": ["location"]},
        ]
    },
    "Model": {
        "allOf": [
            {"$ref": "#/$defs/BasicNewModel"},
            {
                "properties": {
                    "name": {"type": "string"},
                    "description": {"type": "string"},
                    "framework": {"$ref": "#/$defs/Framework"},
                    "training": {"$ref": "#/$defs/Training"},
                    "data_stores": {"type": "array", "items": {"$ref": "#/$defs/Datastore"}},
                    "metrics": {"type": "array", "items": {"$ref": "#/$defs/MetricData"}},
                },
                "required": ["name", "framework", "training", "data_stores"],
            },
        ]
    },
    "Framework": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "version": {"type": "string"}},
        "required": ["name", "version"],
    },
    "Training": {
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "size": {"type": "string"},
            "cpus": {"type": "number"},
            "gpus": {"type": "number"},
            "memory": {"type": "number"},
            "memory_unit": {"type": "string", "enum": ["MiB", "MB", "GiB", "GB"]},
            "learners": _INT32,
            "input_data": _STRINGS,
            "output_data": _STRINGS,
            "training_status": {"$ref": "#/$defs/TrainingStatus"},
            "events": {"type": "object"},
        },
        "required": [
            "command",
            "cpus",
            "gpus",
            "memory",
            "memory_unit",
            "learners",
            "input_data",
            "output_data",
            "training_status",
        ],
    },
    "Datastore": {
        "type": "object",
        "properties": {
            "data_store_id": {"type": "string"},
            "type": {"type": "string"},
            "connection": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["data_store_id", "type", "connection"],
    },
    "ModelList": {
        "type": "object",
        "properties": {"models": {"type": "array", "items": {"$ref": "#/$defs/Model"}}},
        "required": ["models"],
    },
    "TrainingStatus": {
        "type": "object",
        "properties": {
            "status": {"type": "string"},
            "status_description": {"type": "string"},
            "submitted": _EPOCH_MILLIS,
            "completed": _EPOCH_MILLIS,
            "status_message": {"type": "string"},
            "error_code": {"type": "string"},
        },
        "required": ["status", "status_description", "status_message", "submitted"],
    },
    "MetricData": {
        "type": "object",
        "properties": {
            "type": {"type": "string"},
            "timestamp": {
                "type": "string",
                "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$",
            },
            "iteration": _INT32,
            "Values": {"type": "object"},
        },
        "required": ["type", "timestamp", "Values"],
    },
    "AnyDataType": {"type": "string", "enum": ["STRING", "JSONSTRING", "INT", "FLOAT"]},
    "v1Any": {
        "type": "object",
        "properties": {"type": {"$ref": "#/$defs/AnyDataType"}, "value": {"type": "string"}},
        "required": ["type", "value"],
    },
    "v1MetaInfo": {
        "type": "object",
        "properties": {
            "training_id": {"type": "string"},
            "user_id": {"type": "string"},
            "time": _INT64,
            "rindex": _INT64,
        },
        "required": ["training_id", "user_id", "time", "rindex"],
    },
    "v1LogLine": {
        "type": "object",
        "properties": {"meta": {"$ref": "#/$defs/v1MetaInfo"}, "line": {"type": "string"}},
        "required": ["meta", "line"],
    },
    "v1LogLinesList": {
        "type": "object",
        "properties": {"models": {"type": "array", "items": {"$ref": "#/$defs/v1LogLine"}}},
        "required": ["models"],
    },
    "v1EMetrics": {
        "type": "object",
        "properties": {
            "meta": {"$ref": "#/$defs/v1MetaInfo"},
            "etimes": {"type": "object", "additionalProperties": {"$ref": "#/$defs/v1Any"}},
            "grouplabel": {"type": "string"},
            "values": {"type": "object", "additionalProperties": {"$ref": "#/$defs/v1Any"}},
        },
        "required": ["meta", "etimes", "grouplabel", "values"],
    },
    "v1EMetricsList": {
        "type": "object",
        "properties": {"models": {"type": "array", "items": {"$ref": "#/$defs/v1EMetrics"}}},
        "required": ["models"],
    },
}


def check(definition: str, document: Any) -> None:
    """Fail unless ``document`` is valid as FfDL's ``definition``."""
    schema = {"$defs": DEFINITIONS, "$ref": f"#/$defs/{definition}"}
    jsonschema.Draft202012Validator(schema).validate(document)


def check_error(response: httpx.Response, status: int, ffdl_code: str | None = None) -> str:
    """An error answer in FfDL's shape with ``status``; its description."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    check("Error", body)
    assert body["code"] == status
    assert body["description"], body
    if ffdl_code is not None:
        assert body["ffdl_code"] == ffdl_code, body
    return str(body["description"])


def test_the_transcribed_schemas_refuse_what_ffdl_clients_cannot_read() -> None:
    # The checks must be able to fail: ffdl's former shapes are refused.
    with pytest.raises(jsonschema.ValidationError):
        check("Error", {"error": "no such model", "code": "C404", "detail": None})
    with pytest.raises(jsonschema.ValidationError):
        check("v1LogLinesList", {"lines": []})
    with pytest.raises(jsonschema.ValidationError):
        check("TrainingStatus", {"status": "QUEUED", "submitted": "2026-01-01T00:00:00+00:00"})
    with pytest.raises(jsonschema.ValidationError):
        check("Datastore", {"data_store_id": "s", "type": "s3", "connection": {"port": 9000}})


# -- a server with finished and live jobs -------------------------------------------------

TRAIN = """
import json, os, pathlib
for step in range(1, 4):
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    with open(os.path.join(os.environ["LOG_DIR"], "emetrics.jsonl"), "a") as fh:
        fh.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
print("data:", sorted(os.listdir(os.environ["DATA_DIR"])))
pathlib.Path(os.environ["RESULT_DIR"], "model.txt").write_text("weights")
"""
# Prints a line every 0.1 s until the file ``go`` appears in the results directory, then
# prints a few more and ends.
PACED = """
import os, pathlib, time
go = pathlib.Path(os.environ["RESULT_DIR"], "go")
print("waiting", flush=True)
while not go.exists():
    time.sleep(0.05)
for i in range(5):
    print(f"paced {i}", flush=True)
    time.sleep(0.1)
"""
LOOP = """
import time
print("looping", flush=True)
while True:
    time.sleep(0.1)
"""


@dataclass
class Contract:
    server: LiveServer
    stores: Path
    done: str
    manifest: dict[str, Any]

    def get(self, path: str, **params: Any) -> httpx.Response:
        return self.server.client.get(path, params=params)


def _manifest(command: str, stores: Path, **extra: Any) -> str:
    store = {
        "id": "team",
        "type": "local",
        "training_data": {"container": "digits"},
        "training_results": {"container": "results"},
        "connection": {"path": str(stores), "user_name": "bob", "password": "pw-never-shown"},
    }
    return manifest_yaml(command, gpus=0, data_stores=[store], **extra)


def _submit(server: LiveServer, manifest: str, files: dict[str, str]) -> httpx.Response:
    return server.client.post(
        "/v1/models",
        params=MODELS_VERSION,
        files={
            "manifest": ("manifest.yml", manifest.encode()),
            "model_definition": ("model.zip", code_zip(files), "application/zip"),
        },
    )


def _submitted(server: LiveServer, manifest: str, files: dict[str, str]) -> str:
    response = _submit(server, manifest, files)
    assert response.status_code == 201, response.text
    return str(response.json()["model_id"])


def _status(server: LiveServer, job_id: str) -> str:
    model = server.client.get(f"/v1/models/{job_id}").json()
    return str(model["training"]["training_status"]["status"])


@pytest.fixture(scope="module")
def contract(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    root = tmp_path_factory.mktemp("contract")
    stores = root / "stores"
    (stores / "digits").mkdir(parents=True)
    (stores / "digits" / "train.csv").write_text("1,2,3\n")
    (stores / "results").mkdir()
    config = {**FAST_CONFIG, "store_paths": [str(stores)]}
    with serving(LiveServer(home=root / "home", config=config)) as server:
        text = _manifest("python train.py", stores, evaluation_metrics={"type": "emetrics"})
        done = _submitted(server, text, {"train.py": TRAIN})
        server.wait_status(done, {"COMPLETED"})
        yield Contract(server=server, stores=stores, done=done, manifest=yaml.safe_load(text))


# -- the models resource ------------------------------------------------------------------


def test_submit_answers_a_basic_new_model_with_its_location(contract: Contract) -> None:
    response = _submit(contract.server, _manifest("true", contract.stores), {"x.py": ""})
    assert response.status_code == 201, response.text
    body = response.json()
    check("BasicNewModel", body)
    assert response.headers["location"] == body["location"] == f"/v1/models/{body['model_id']}"


def test_models_list_and_model_have_ffdl_fields(contract: Contract) -> None:
    listed = contract.get("/v1/models", **MODELS_VERSION)
    assert listed.status_code == 200, listed.text
    check("ModelList", listed.json())
    assert contract.done in [m["model_id"] for m in listed.json()["models"]]

    response = contract.get(f"/v1/models/{contract.done}", **MODELS_VERSION)
    assert response.status_code == 200, response.text
    model = response.json()
    check("Model", model)
    training = model["training"]
    assert training["command"] == "python train.py"
    assert (training["input_data"], training["output_data"]) == (["team"], ["team"])
    status = training["training_status"]
    assert status["status"] == status["status_description"] == "COMPLETED"
    assert status["status_message"]
    submitted, completed = int(status["submitted"]), int(status["completed"])
    assert abs(submitted / 1000 - time.time()) < 600 and submitted <= completed
    (store,) = model["data_stores"]
    assert (store["data_store_id"], store["type"]) == ("team", "local")
    assert store["connection"]["password"] == "***"
    assert "pw-never-shown" not in response.text
    (latest,) = model["metrics"]
    assert latest["iteration"] == 3 and latest["Values"]["loss"] == pytest.approx(1 / 3)


def test_downloads_are_octet_streams_with_the_zip(contract: Contract) -> None:
    headers = {"Accept": "application/octet-stream"}
    for suffix, member in (("definition", "train.py"), ("trained_model", "model.txt")):
        response = contract.server.client.get(
            f"/v1/models/{contract.done}/{suffix}", params=MODELS_VERSION, headers=headers
        )
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/octet-stream"
        assert response.headers["content-disposition"].startswith("attachment; filename=")
        names = zipfile.ZipFile(io.BytesIO(response.content)).namelist()
        assert any(name.endswith(member) for name in names), names


def test_patch_halts_and_delete_cancels_then_removes_a_live_job(contract: Contract) -> None:
    server = contract.server
    halted = _submitted(server, _manifest("python loop.py", contract.stores), {"loop.py": LOOP})
    live = _submitted(server, _manifest("python loop.py", contract.stores), {"loop.py": LOOP})
    for job_id in (halted, live):
        server.wait_status(job_id, {"PROCESSING"})
    patched = server.client.patch(
        f"/v1/models/{halted}", params=MODELS_VERSION, json={"status": "halt"}
    )
    assert patched.status_code == 202, patched.text
    check("BasicModel", patched.json())
    check_error(
        server.client.patch(f"/v1/models/{halted}", params=MODELS_VERSION, json={"status": "x"}),
        400,
    )

    wait_for(lambda: job_pids(live), what="the live job's processes")
    deleted = server.client.delete(f"/v1/models/{live}", params=MODELS_VERSION)
    assert deleted.status_code == 200, deleted.text
    check("BasicModel", deleted.json())
    assert deleted.json()["deleted"] is True
    check_error(contract.get(f"/v1/models/{live}", **MODELS_VERSION), 404, "C404")
    assert not (server.home / "jobs" / live).exists()
    wait_for(lambda: not job_pids(live), timeout=10, what="the deleted job's processes to end")
    server.wait_status(halted, {"HALTED"})
    assert server.client.delete(f"/v1/models/{halted}").json()["deleted"] is True


def test_delete_keeps_the_results_in_the_users_data_store(contract: Contract) -> None:
    server = contract.server
    job_id = _submitted(server, _manifest("python train.py", contract.stores), {"train.py": TRAIN})
    server.wait_status(job_id, {"COMPLETED"})
    results = contract.stores / "results" / job_id
    assert (results / "model.txt").read_text() == "weights"
    response = server.client.delete(f"/v1/models/{job_id}", params=MODELS_VERSION)
    assert response.status_code == 200 and response.json()["deleted"] is True
    assert not (server.home / "jobs" / job_id).exists()
    assert (results / "model.txt").read_text() == "weights"
    check_error(server.client.delete(f"/v1/models/{job_id}"), 404, "C404")


# -- log lines and metrics ----------------------------------------------------------------


def test_loglines_and_emetrics_pages_in_ffdl_shape(contract: Contract) -> None:
    query = {**LOGS_VERSION, "searchType": "TERM", "pos": 0, "since_time": ""}
    response = contract.get(f"/v1/logs/{contract.done}/loglines", pagesize=3, **query)
    assert response.status_code == 200, response.text
    check("v1LogLinesList", response.json())
    lines = response.json()["models"]
    assert len(lines) == 3
    assert {line["meta"]["training_id"] for line in lines} == {contract.done}
    assert {line["meta"]["user_id"] for line in lines} == {"admin"}

    everything = contract.get(f"/v1/logs/{contract.done}/loglines", pagesize=1000).json()
    assert len(contract.get(f"/v1/logs/{contract.done}/loglines").json()["models"]) == min(
        10, len(everything["models"])
    )
    # FfDL's client pages on with since_time = the last line's time + 1.
    after = lines[-1]["meta"]["time"] + 1
    later = contract.get(f"/v1/logs/{contract.done}/loglines", since_time=str(after), pagesize=1000)
    assert all(line["meta"]["time"] >= after for line in later.json()["models"])

    response = contract.get(f"/v1/logs/{contract.done}/emetrics", **query)
    assert response.status_code == 200, response.text
    check("v1EMetricsList", response.json())
    records = response.json()["models"]
    assert [r["etimes"]["iteration"]["value"] for r in records] == ["1", "2", "3"]
    assert records[0]["values"]["loss"] == {"type": "FLOAT", "value": "1.0"}


def test_logs_and_metrics_paths_serve_the_recorded_job(contract: Contract) -> None:
    lines = contract.get(f"/v1/logs/{contract.done}/loglines", pagesize=1000).json()["models"]
    response = contract.get(f"/v1/models/{contract.done}/logs", **MODELS_VERSION)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.text == "".join(f"{line['line']}\n" for line in lines)
    tail = contract.get(f"/v1/models/{contract.done}/logs", since_time="-2").text
    assert tail == "".join(f"{line['line']}\n" for line in lines[-2:])

    response = contract.get(f"/v1/models/{contract.done}/metrics", **MODELS_VERSION)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    records = [json.loads(text) for text in response.text.splitlines()]
    for record in records:
        check("MetricData", record)
    assert [r["iteration"] for r in records] == [1, 2, 3]


# -- websockets ---------------------------------------------------------------------------


def _socket(server: LiveServer, path: str, token: str | None = None) -> websocket.WebSocket:
    headers = [f"Authorization: Bearer {token or server.token}"]
    return websocket.create_connection(
        f"ws://127.0.0.1:{server.port}{path}?version=2017-03-17",
        header=headers,
        subprotocols=["ws"],
        timeout=60,
    )


def _received(ws: websocket.WebSocket) -> tuple[list[str], int]:
    """Every text message until the server closes, and its close code."""
    messages: list[str] = []
    while True:
        opcode, frame = ws.recv_data(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            code = int.from_bytes(frame[:2], "big") if len(frame) >= 2 else 1005
            ws.close()
            return messages, code
        if opcode == websocket.ABNF.OPCODE_TEXT:
            messages.append(frame.decode())


def test_websocket_follows_live_lines_until_the_job_ends(contract: Contract) -> None:
    server = contract.server
    # No data store: the results directory is the platform's, shared with the job as it runs.
    job_id = _submitted(server, manifest_yaml("python paced.py", gpus=0), {"paced.py": PACED})
    wait_for(lambda: _status(server, job_id) == "PROCESSING", what="the job to run")
    ws = _socket(server, f"/v1/models/{job_id}/logs")
    assert ws.subprotocol == "ws"
    results = Path(server.model(job_id)["results"]["location"])
    (results / "go").write_text("")  # the job prints its paced lines only now: live
    messages, code = _received(ws)
    assert code == 1000
    assert _status(server, job_id) == "COMPLETED"
    text = "".join(messages)
    assert all(message.endswith("\n") for message in messages)
    lines = server.loglines(job_id)
    assert text == "".join(f"{line['line']}\n" for line in lines)
    assert [f"paced {i}" for i in range(5)] == [t for t in text.splitlines() if "paced" in t]

    ws = _socket(server, f"/v1/models/{contract.done}/metrics")
    messages, code = _received(ws)
    assert code == 1000
    for message in messages:
        check("MetricData", json.loads(message))
    assert [json.loads(m)["iteration"] for m in messages] == [1, 2, 3]


def test_websocket_refusals_are_ffdl_errors(contract: Contract) -> None:
    for path, token, status in (
        ("/v1/models/training-none/logs", None, 404),
        (f"/v1/models/{contract.done}/logs", "not-a-token", 401),
    ):
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            _socket(contract.server, path, token)
        assert refused.value.status_code == status
        body = json.loads(refused.value.resp_body)
        check("Error", body)
        assert body["code"] == status


# -- errors ---------------------------------------------------------------------------------


def test_every_kind_of_error_has_ffdl_error_body(contract: Contract) -> None:
    server = contract.server
    unknown = "training-unknown"
    description = check_error(contract.get(f"/v1/models/{unknown}", **MODELS_VERSION), 404)
    assert description.startswith("Model not found") and unknown in description
    for path in (
        f"/v1/models/{unknown}/definition",
        f"/v1/models/{unknown}/trained_model",
        f"/v1/models/{unknown}/logs",
        f"/v1/models/{unknown}/metrics",
        f"/v1/logs/{unknown}/loglines",
        f"/v1/logs/{unknown}/emetrics",
    ):
        check_error(contract.get(path, **LOGS_VERSION), 404, "C404")
    check_error(server.client.delete(f"/v1/models/{unknown}"), 404, "C404")
    check_error(httpx.get(f"{server.url}/v1/models", params=MODELS_VERSION), 401, "C103")
    bad_page = contract.get(f"/v1/logs/{contract.done}/loglines", pagesize=0)
    assert "pagesize" in check_error(bad_page, 400, "C100")
    bad_since = contract.get(f"/v1/logs/{contract.done}/emetrics", since_time="yesterday-ish")
    assert "since_time" in check_error(bad_since, 400)
    check_error(contract.get("/v1/models", limit="many"), 400, "C100")
    check_error(server.client.put("/v1/models"), 405, "H405")
    check_error(contract.get("/v1/no-such-path"), 404, "H404")
    refused = _submit(server, "name: [unclosed", {"x.py": ""})
    check_error(refused, 400, "C101")
