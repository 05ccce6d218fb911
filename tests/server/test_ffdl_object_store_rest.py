"""FfDL's REST paths for a job whose data store is an object store (a real S3 server on
127.0.0.1): the trained model downloads as FfDL's client wants it, and DELETE removes the job
but leaves what it stored in the user's results bucket, as FfDL did."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator

import pytest
import yaml

from tests.integration.live import FAST_CONFIG, LiveServer, code_zip, serving
from tests.s3server import S3Server, s3_server

DATA_BUCKET = "training-data"
RESULTS_BUCKET = "trained-models"
TRAIN = """
import os, pathlib
out = pathlib.Path(os.environ["RESULT_DIR"], "model")
out.mkdir(exist_ok=True)
data = pathlib.Path(os.environ["DATA_DIR"], "x.txt").read_text()
(out / "weights.txt").write_text("trained " + data)
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        server.make_bucket(DATA_BUCKET, {"x.txt": b"on data"})
        server.make_bucket(RESULTS_BUCKET)
        yield server


@pytest.fixture(scope="module")
def live(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    config = {**FAST_CONFIG, "object_store_endpoints": [s3.endpoint]}
    with serving(LiveServer(home=tmp_path_factory.mktemp("home"), config=config)) as server:
        yield server


def _manifest(s3: S3Server) -> str:
    store = {
        "id": "cos",
        "type": "s3_datastore",
        "training_data": {"container": DATA_BUCKET},
        "training_results": {"container": RESULTS_BUCKET},
        "connection": s3.connection(),
    }
    doc = {
        "name": "cos-job",
        "version": "1.0",
        "gpus": 0,
        "cpus": 1,
        "memory": "512MiB",
        "learners": 1,
        "data_stores": [store],
        "framework": {"name": "custom", "version": "1", "command": "python train.py"},
    }
    return yaml.safe_dump(doc)


def test_trained_model_downloads_and_delete_keeps_the_bucket(
    live: LiveServer, s3: S3Server
) -> None:
    response = live.client.post(
        "/v1/models",
        params={"version": "2017-02-13"},
        files={
            "manifest": ("manifest.yml", _manifest(s3).encode()),
            "model_definition": ("model.zip", code_zip({"train.py": TRAIN}), "application/zip"),
        },
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["model_id"]
    model = live.wait_status(job_id, {"COMPLETED"}, timeout=120)
    (store,) = model["data_stores"]
    assert (store["data_store_id"], store["type"]) == ("cos", "s3_datastore")
    assert model["training"]["input_data"] == model["training"]["output_data"] == ["cos"]

    download = live.client.get(
        f"/v1/models/{job_id}/trained_model",
        params={"version": "2017-02-13"},
        headers={"Accept": "application/octet-stream"},
    )
    assert download.status_code == 200, download.text
    assert download.headers["content-type"] == "application/octet-stream"
    archive = zipfile.ZipFile(io.BytesIO(download.content))
    (name,) = [n for n in archive.namelist() if n.endswith("weights.txt")]
    assert archive.read(name) == b"trained on data"

    stored = s3.objects(RESULTS_BUCKET, f"{job_id}/")
    assert stored[f"{job_id}/model/weights.txt"] == b"trained on data"
    deleted = live.client.delete(f"/v1/models/{job_id}", params={"version": "2017-02-13"})
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert live.client.get(f"/v1/models/{job_id}").status_code == 404
    assert not (live.home / "jobs" / job_id).exists()
    assert s3.objects(RESULTS_BUCKET, f"{job_id}/") == stored
