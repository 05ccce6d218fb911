"""An FfDL user's migration, end to end: FfDL-shaped manifests submitted as they are, their
data in a real S3 server, FfDL-style code that reads FfDL's learner environment, and the API
driven the way FfDL's clients drive it.

One live server and one S3 server (moto, on 127.0.0.1) serve the whole module. The operator
configures what a migrating FfDL installation needs: a runtime for ``tensorflow`` (and
``caffe``) on the platform's environment, the in-cluster endpoint FfDL's manifests name
(``http://s3.default.svc.cluster.local``) aliased to the S3 server, that server listed in
``object_store_endpoints``, and a password an admin sets for the FfDL user. The manifests in
``manifests/`` are submitted byte for byte, except that the HMAC keys a user pastes into
``user_name``/``password`` are the S3 server's (``ACCESS_KEY_ID``/``SECRET_ACCESS_KEY`` in
the files). Every request carries what FfDL's CLI sends: HTTP Basic, ``X-Watson-Userinfo``
and a ``version`` query.
"""

from __future__ import annotations

import base64
import functools
import gzip
import io
import json
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ffdl.core.manifest import parse_manifest
from ffdl.server.services.learner_env import learner_name_prefix
from tests.integration.live import FAST_CONFIG, LiveServer, code_zip, serving, wait_for
from tests.s3server import S3Server, s3_server

HERE = Path(__file__).parent
MANIFESTS = HERE / "manifests"
CODE = HERE / "ffdl_code"
IN_CLUSTER = "http://s3.default.svc.cluster.local"
DATA_BUCKET = "mnist_training_data"
RESULTS_BUCKET = "mnist_trained_model"
USER = "test-user"
PASSWORD = "ffdl-migrates-unchanged"
MODELS_VERSION = {"version": "2017-02-13"}
LOGS_VERSION = {"version": "2017-10-01"}
# Pixels of the stand-in MNIST images: their mean (here 37.5) shows up in the results.
PIXELS = bytes([0, 25, 50, 75] * 4 * 10)


def _idx(magic: int, body: bytes, count: int, *dims: int) -> bytes:
    header = struct.pack(">II", magic, count) + b"".join(struct.pack(">I", d) for d in dims)
    return gzip.compress(header + body)


TRAINING_DATA = {
    "train-images-idx3-ubyte.gz": _idx(2051, PIXELS, 10, 4, 4),
    "train-labels-idx1-ubyte.gz": _idx(2049, bytes(range(10)), 10),
    "t10k-images-idx3-ubyte.gz": _idx(2051, PIXELS[:32], 2, 4, 4),
    "t10k-labels-idx1-ubyte.gz": _idx(2049, bytes([3, 4]), 2),
    # Two learners' shards for the distributed job: means 2.0 and 6.0.
    "shards/shard-0.txt": b"1 2 3\n",
    "shards/shard-1.txt": b"5 6 7\n",
}


class FfdlClient:
    """Requests as FfDL's CLI makes them: Basic, X-Watson-Userinfo, a ``version`` query."""

    def __init__(self, url: str, user: str, password: str) -> None:
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.http = httpx.Client(
            base_url=url,
            headers={
                "Authorization": f"Basic {pair}",
                "X-Watson-Userinfo": f"bluemix-instance-id={user}",
            },
            timeout=30,
        )

    def get(self, path: str, **params: Any) -> httpx.Response:
        version = LOGS_VERSION if path.startswith("/v1/logs") else MODELS_VERSION
        return self.http.get(path, params={**version, **params})

    def submit(self, manifest: str, code: dict[str, str]) -> httpx.Response:
        return self.http.post(
            "/v1/models",
            params=MODELS_VERSION,
            files={
                "manifest": ("manifest.yml", manifest.encode(), "application/octet-stream"),
                "model_definition": ("model.zip", code_zip(code), "application/octet-stream"),
            },
        )

    def status(self, job_id: str) -> str:
        response = self.get(f"/v1/models/{job_id}")
        assert response.status_code == 200, response.text
        return str(response.json()["training"]["training_status"]["status"])

    def models(self, path: str, **params: Any) -> list[dict[str, Any]]:
        response = self.get(path, **params)
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["models"]
        return items


def ffdl_manifest(name: str, s3: S3Server, **store_changes: Any) -> str:
    """The manifest file with the user's HMAC keys pasted in (nothing else changes unless
    ``store_changes`` replace parts of its data store, for the refusal cases)."""
    text = (MANIFESTS / name).read_text()
    text = text.replace("ACCESS_KEY_ID", s3.access_key).replace("SECRET_ACCESS_KEY", s3.secret_key)
    if not store_changes:
        return text
    document = yaml.safe_load(text)
    document["data_stores"][0].update(store_changes)
    return str(yaml.safe_dump(document, sort_keys=False))


def code(*names: str) -> dict[str, str]:
    return {name: (CODE / name).read_text() for name in names}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        server.make_bucket(DATA_BUCKET, TRAINING_DATA)
        server.make_bucket(RESULTS_BUCKET)
        yield server


@pytest.fixture(scope="module")
def live(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    config = {
        **FAST_CONFIG,
        "runtimes": [
            {"framework": "tensorflow", "version": "1.5", "environment": "platform"},
            {"framework": "caffe", "environment": "platform"},
        ],
        "object_store_endpoints": [s3.endpoint],
        "object_store_endpoint_aliases": {IN_CLUSTER: s3.endpoint},
    }
    home = tmp_path_factory.mktemp("ffdl-migration") / "home"
    with serving(LiveServer(home=home, config=config)) as server:
        created = server.client.post("/v1/tenants/default/users", json={"name": USER})
        assert created.status_code == 201, created.text
        user_id = created.json()["user"]
        password = server.client.put(f"/v1/users/{user_id}/password", json={"password": PASSWORD})
        assert password.status_code in (200, 204), password.text
        yield server


@pytest.fixture(scope="module")
def ffdl(live: LiveServer) -> Iterator[FfdlClient]:
    client = FfdlClient(live.url, USER, PASSWORD)
    yield client
    client.http.close()


@pytest.fixture(scope="module")
def jobs(live: LiveServer, s3: S3Server, ffdl: FfdlClient) -> dict[str, dict[str, Any]]:
    """Both manifests submitted unchanged, run together to the end: the submit answers."""
    submitted: dict[str, dict[str, Any]] = {}
    for key, manifest, files in (
        ("tf", "tf-convolutional.yml", code("convolutional_network.py")),
        ("dist", "pytorch-two-learners.yml", code("train_dist.py")),
    ):
        response = ffdl.submit(ffdl_manifest(manifest, s3), files)
        assert response.status_code == 201, response.text
        submitted[key] = {**response.json(), "location": response.headers.get("Location")}
    for key, answer in submitted.items():
        training_id = str(answer["model_id"])
        final = wait_for(
            functools.partial(ended, ffdl, training_id),
            timeout=150,
            interval=0.3,
            what=f"{key} job {training_id} to end",
        )
        if final != "COMPLETED":
            lines = "\n".join(item["line"] for item in live.loglines(training_id)[-40:])
            raise AssertionError(f"{key} job {training_id} ended {final}:\n{lines}")
    return submitted


def ended(ffdl: FfdlClient, training_id: str) -> str | None:
    status = ffdl.status(training_id)
    return status if status in {"COMPLETED", "FAILED", "CANCELLED"} else None


def job_id(jobs: dict[str, dict[str, Any]], key: str) -> str:
    return str(jobs[key]["model_id"])


def log_lines(ffdl: FfdlClient, training_id: str) -> list[str]:
    return [
        str(item["line"])
        for item in ffdl.models(f"/v1/logs/{training_id}/loglines", pagesize=10000)
    ]


# -- submit and the model view ----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(path.name for path in MANIFESTS.glob("*.yml")))
def test_folded_commands_are_one_line_as_ffdl_ran_them(name: str) -> None:
    manifest = parse_manifest((MANIFESTS / name).read_text())
    assert manifest.framework.command.startswith("python")
    assert "\n" not in manifest.framework.command
    assert manifest.data_stores[0].connection["auth_url"] == IN_CLUSTER


def test_a_literal_command_keeps_its_lines() -> None:
    literal = "name: script\nframework:\n  name: custom\n  command: |\n    echo a\n      echo b\n"
    folded = literal.replace("command: |", "command: >")
    assert parse_manifest(literal).framework.command == "echo a\n  echo b"
    assert parse_manifest(folded).framework.command == "echo a   echo b"


def test_a_framework_without_runtime_is_refused_naming_those_that_exist(
    ffdl: FfdlClient, s3: S3Server
) -> None:
    document = yaml.safe_load(ffdl_manifest("tf-convolutional.yml", s3))
    document["framework"]["name"] = "caffe2"
    response = ffdl.submit(yaml.safe_dump(document), code("convolutional_network.py"))
    assert response.status_code == 400, response.text
    body = response.json()
    assert (body["code"], body["ffdl_code"]) == (400, "C101")
    assert "framework 'caffe2' has no runtime" in body["description"]
    assert "caffe (any version)" in body["description"]
    assert "tensorflow (1.5)" in body["description"]


def test_submit_answers_as_ffdl_and_warns_about_a_version_without_runtime(
    jobs: dict[str, dict[str, Any]],
) -> None:
    tf = jobs["tf"]
    assert tf["model_id"].startswith("training-")
    assert tf["location"] and tf["location"].endswith(f"/v1/models/{tf['model_id']}")
    assert tf["warnings"] == []
    # pytorch "latest" has no runtime of its own: it runs on pytorch's default, and says so.
    warnings = " ".join(jobs["dist"]["warnings"])
    assert "framework pytorch version latest has no runtime" in warnings


def test_the_model_view_has_ffdl_fields_and_no_secret(
    jobs: dict[str, dict[str, Any]], ffdl: FfdlClient, s3: S3Server
) -> None:
    training_id = job_id(jobs, "tf")
    response = ffdl.get(f"/v1/models/{training_id}")
    assert response.status_code == 200, response.text
    model = response.json()
    assert model["model_id"] == training_id
    assert model["framework"]["name"] == "tensorflow"
    assert model["framework"]["version"] == "1.5.0-py3"
    training = model["training"]
    assert training["command"].startswith("python3 convolutional_network.py --trainImagesFile")
    assert training["input_data"] == ["sl-internal-os"]
    assert training["output_data"] == ["sl-internal-os"]
    status = training["training_status"]
    assert status["status"] == "COMPLETED"
    assert int(status["submitted"]) > 1_600_000_000_000  # epoch milliseconds, as FfDL sent
    assert int(status["completed"]) >= int(status["submitted"])
    store = model["data_stores"][0]
    assert store["data_store_id"] == "sl-internal-os"
    assert store["type"] == "mount_cos"
    # The endpoint as the user wrote it; the secret never.
    assert store["connection"]["auth_url"] == IN_CLUSTER
    assert store["connection"]["password"] == "***"
    assert s3.secret_key not in response.text
    assert f"s3://{RESULTS_BUCKET}/{training_id}" in response.text


def test_models_list_holds_both_jobs(jobs: dict[str, dict[str, Any]], ffdl: FfdlClient) -> None:
    listed = {m["model_id"]: m for m in ffdl.models("/v1/models")}
    for key in ("tf", "dist"):
        model = listed[job_id(jobs, key)]
        assert model["training"]["training_status"]["status"] == "COMPLETED"


# -- what the jobs saw and left in the store --------------------------------------------


def test_ffdl_code_reads_the_ffdl_environment_and_its_bucket(
    jobs: dict[str, dict[str, Any]], ffdl: FfdlClient, s3: S3Server
) -> None:
    training_id = job_id(jobs, "tf")
    lines = log_lines(ffdl, training_id)
    assert "GPU_COUNT=1.000000 -> 1 gpus" in lines
    assert "train images: 160 pixels, mean 37.50; labels [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]" in lines
    assert "Optimization Finished!" in lines

    stored = s3.objects(RESULTS_BUCKET, f"{training_id}/")
    weights = json.loads(stored[f"{training_id}/model/weights.json"])
    assert weights == {"mean_pixel": 37.5, "labels": list(range(10)), "lr": 0.001}
    seen = json.loads(stored[f"{training_id}/environment.json"])
    assert seen["GPU_COUNT"] == "1.000000"
    assert seen["LOG_DIR"] == f"{seen['JOB_STATE_DIR']}/logs"
    assert seen["TRAINING_COMMAND"].startswith("python3 convolutional_network.py")
    assert "\n" not in seen["TRAINING_COMMAND"]
    assert seen["TRAINING_ID"] == training_id
    assert seen["results_under_bucket"] is True
    assert seen["hostname"] == f"{learner_name_prefix(training_id)}-0"
    # The log and the TensorBoard files went with the results, as FfDL stored them.
    assert b"Optimization Finished!" in stored[f"{training_id}/learner-1/training-log.txt"]
    board = [key for key in stored if key.startswith(f"{training_id}/learner-1/tb/train/")]
    assert board and all("events.out.tfevents" in key for key in board), sorted(stored)


def test_two_learners_find_each_other_by_ffdl_host_names(
    jobs: dict[str, dict[str, Any]], ffdl: FfdlClient, s3: S3Server
) -> None:
    training_id = job_id(jobs, "dist")
    prefix = learner_name_prefix(training_id)
    lines = log_lines(ffdl, training_id)
    assert f"learner 1 of 2 done on {prefix}-0" in lines
    assert f"learner 2 of 2 done on {prefix}-1" in lines
    stored = s3.objects(RESULTS_BUCKET, f"{training_id}/")
    model = json.loads(stored[f"{training_id}/model.json"])
    # Both shards counted: the averaged "gradient" is (2 + 6) / 2 at each step from 0.
    assert model["learners"] == 2
    assert model["weight"] == pytest.approx(4.0 * (1 - 0.5**3))
    for learner in (1, 2):
        log = stored[f"{training_id}/learner-{learner}/training-log.txt"]
        assert f"rank {learner - 1} loss=".encode() in log


# -- metrics ----------------------------------------------------------------------------


def test_tensorboard_scalars_come_back_as_emetrics(
    jobs: dict[str, dict[str, Any]], ffdl: FfdlClient
) -> None:
    training_id = job_id(jobs, "tf")
    records = ffdl.models(f"/v1/logs/{training_id}/emetrics", pagesize=100)
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        assert record["meta"]["training_id"] == training_id
        groups.setdefault(record["grouplabel"], []).append(record)
    assert sorted(groups) == ["test", "train"]
    assert [r["etimes"]["iteration"]["value"] for r in groups["train"]] == ["1", "2", "3", "4", "5"]
    fifth = groups["train"][4]["values"]
    assert fifth["accuracy"]["type"] == "FLOAT"
    assert float(fifth["accuracy"]["value"]) == pytest.approx(1.0)
    assert float(fifth["loss"]["value"]) == pytest.approx(37.5 / 500)
    assert [r["etimes"]["iteration"]["value"] for r in groups["test"]] == ["2", "4"]


def test_regex_extractor_typed_scalars_come_back_as_emetrics(
    jobs: dict[str, dict[str, Any]], ffdl: FfdlClient
) -> None:
    training_id = job_id(jobs, "dist")
    records = ffdl.models(f"/v1/logs/{training_id}/emetrics", pagesize=100)
    assert [r["grouplabel"] for r in records] == ["train"] * 3
    assert [r["etimes"]["iteration"]["value"] for r in records] == ["1", "2", "3"]
    assert [float(r["values"]["accuracy"]["value"]) for r in records] == pytest.approx(
        [1 / 3, 2 / 3, 1.0], abs=1e-4
    )
    # The all-reduced "gradient" of the two shards (means 2 and 6) halves each epoch.
    assert [float(r["values"]["loss"]["value"]) for r in records] == [4.0, 2.0, 1.0]
    # FfDL's MetricData lines on /v1/models/{id}/metrics: the same records.
    response = ffdl.get(f"/v1/models/{training_id}/metrics")
    assert response.status_code == 200, response.text
    data = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    assert [d["iteration"] for d in data] == [1, 2, 3]
    assert data[2]["Values"]["accuracy"] == pytest.approx(1.0)


# -- logs and downloads -----------------------------------------------------------------


def test_logs_as_ffdl_clients_read_them(jobs: dict[str, dict[str, Any]], ffdl: FfdlClient) -> None:
    training_id = job_id(jobs, "tf")
    text = ffdl.get(f"/v1/models/{training_id}/logs")
    assert text.status_code == 200, text.text
    assert "Optimization Finished!" in text.text
    page = ffdl.models(f"/v1/logs/{training_id}/loglines")
    assert len(page) == 10  # FfDL's default page size
    first = page[0]["meta"]
    assert first["training_id"] == training_id
    assert first["user_id"] and USER in first["user_id"]
    assert int(first["time"]) > 1_600_000_000_000
    last = ffdl.models(f"/v1/logs/{training_id}/loglines", pos=-1, pagesize=3)
    assert [line["line"] for line in last][-1] == log_lines(ffdl, training_id)[-1]


def test_trained_model_downloads_as_octet_stream(
    jobs: dict[str, dict[str, Any]], ffdl: FfdlClient
) -> None:
    training_id = job_id(jobs, "tf")
    response = ffdl.http.get(
        f"/v1/models/{training_id}/trained_model",
        params=MODELS_VERSION,
        headers={"Accept": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text[:200]
    assert response.headers["content-type"].startswith("application/octet-stream")
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        names = archive.namelist()
        weights = next(name for name in names if name.endswith("model/weights.json"))
        assert json.loads(archive.read(weights))["mean_pixel"] == 37.5


# -- refusals in FfDL's words -----------------------------------------------------------


def test_a_wrong_password_gets_ffdls_answer(live: LiveServer) -> None:
    wrong = FfdlClient(live.url, USER, PASSWORD + "x")
    try:
        response = wrong.get("/v1/models")
    finally:
        wrong.http.close()
    assert response.status_code == 401
    body = response.json()
    assert body["code"] == 401
    assert body["description"] == "Bad username or password."
    # The X-Watson-Userinfo header alone names nobody (no trusted proxy here).
    alone = httpx.get(
        f"{live.url}/v1/models",
        params=MODELS_VERSION,
        headers={"X-Watson-Userinfo": f"bluemix-instance-id={USER}"},
    )
    assert alone.status_code == 401
    assert "use `logs --follow`" in alone.json()["description"]


def test_an_unknown_model_is_ffdls_404(ffdl: FfdlClient) -> None:
    response = ffdl.get("/v1/models/training-nosuchjob")
    assert response.status_code == 404
    body = response.json()
    assert body["code"] == 404
    assert isinstance(body["error"], str)
    assert "Model not found" in body["description"]


def test_the_store_is_checked_at_submit_as_ffdl_did(
    jobs: dict[str, dict[str, Any]], ffdl: FfdlClient, s3: S3Server
) -> None:
    before = {m["model_id"] for m in ffdl.models("/v1/models")}
    missing = ffdl_manifest(
        "tf-convolutional.yml", s3, training_data={"container": "no_such_bucket"}
    )
    response = ffdl.submit(missing, code("convolutional_network.py"))
    assert response.status_code == 400, response.text
    body = response.json()
    assert (body["code"], body["ffdl_code"]) == (400, "C103")
    assert "bucket 'no_such_bucket' does not exist" in body["description"]

    connection = {"auth_url": IN_CLUSTER, "user_name": s3.access_key, "password": "not-it"}
    refused = ffdl.submit(
        ffdl_manifest("tf-convolutional.yml", s3, connection=connection),
        code("convolutional_network.py"),
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["ffdl_code"] == "C103"
    assert "refused the credentials" in refused.json()["description"]
    assert "not-it" not in refused.text
    assert {m["model_id"] for m in ffdl.models("/v1/models")} == before


def test_the_secret_shows_nowhere(
    jobs: dict[str, dict[str, Any]], ffdl: FfdlClient, live: LiveServer, s3: S3Server
) -> None:
    seen = [ffdl.get("/v1/models").text]
    for key in ("tf", "dist"):
        training_id = job_id(jobs, key)
        seen.append(ffdl.get(f"/v1/models/{training_id}").text)
        seen.append(ffdl.get(f"/v1/models/{training_id}/logs").text)
        seen.append(
            json.dumps(s3.objects(RESULTS_BUCKET, f"{training_id}/learner-1/"), default=repr)
        )
    assert not any(s3.secret_key in text for text in seen)
    assert s3.secret_key not in live.log_tail(100_000)


def test_delete_removes_the_job_and_keeps_the_bucket(
    jobs: dict[str, dict[str, Any]], ffdl: FfdlClient, s3: S3Server
) -> None:
    training_id = job_id(jobs, "tf")
    response = ffdl.http.delete(f"/v1/models/{training_id}", params=MODELS_VERSION)
    assert response.status_code == 200, response.text
    assert ffdl.get(f"/v1/models/{training_id}").status_code == 404
    assert training_id not in {m["model_id"] for m in ffdl.models("/v1/models")}
    # As FfDL left trained models in the user's bucket.
    assert f"{training_id}/model/weights.json" in s3.objects(RESULTS_BUCKET, f"{training_id}/")
