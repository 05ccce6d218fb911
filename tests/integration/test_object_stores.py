"""FfDL's object-store data stores on a live server, against a real S3 server on 127.0.0.1:
a ``mount_cos`` manifest as FfDL users wrote it runs with its data from the bucket and leaves
its results and logs under ``<results bucket>/<training id>/``; the store is checked at
submit (C103 with the reason, nothing created); FfDL's Swift types are refused by name; and
the store's secret shows nowhere and is erased when the job ends."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.live import FAST_CONFIG, LiveServer, serving
from tests.s3server import S3Server, s3_server

# FfDL's own bucket names (from its PyTorch example), underscores and all.
DATA_BUCKET = "pytorch_training_data"
RESULTS_BUCKET = "pytorch_trained_model"
TRAIN = """
import json, os, pathlib
data = pathlib.Path(os.environ["DATA_DIR"])
print("data files:", sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file()))
total = sum(int(n) for n in (data / "numbers.txt").read_text().split())
print("sum:", total)
out = pathlib.Path(os.environ["RESULT_DIR"])
(out / "model").mkdir(exist_ok=True)
(out / "model" / "total.txt").write_text(str(total))
(out / "environ.json").write_text(json.dumps(dict(os.environ)))
(pathlib.Path(os.environ["CHECKPOINT_DIR"]) / "epoch-1.ckpt").write_text("weights")
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        server.make_bucket(
            DATA_BUCKET, {"numbers.txt": b"1 2 3 4\n", "mnist/train.bin": b"\x07" * 1_200_000}
        )
        server.make_bucket(RESULTS_BUCKET)
        yield server


@pytest.fixture(scope="module")
def live(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    config = {**FAST_CONFIG, "object_store_endpoints": [s3.endpoint]}
    with serving(LiveServer(home=tmp_path_factory.mktemp("home"), config=config)) as server:
        yield server


def ffdl_manifest(connection: dict[str, str], **store: Any) -> str:
    """A manifest in FfDL's shape and field names (its PyTorch example's)."""
    data_store: dict[str, Any] = {
        "id": "sl-internal-os",
        "type": "mount_cos",
        "training_data": {"container": DATA_BUCKET},
        "training_results": {"container": RESULTS_BUCKET},
        "connection": connection,
    }
    data_store.update(store)
    return yaml.safe_dump(
        {
            "name": "mnist-pytorch-model",
            "description": "PyTorch model with its data in object storage",
            "version": "1.0",
            "gpus": 0,
            "cpus": 1,
            "memory": "1Gb",
            "learners": 1,
            "data_stores": [data_store],
            "framework": {"name": "pytorch", "version": "latest", "command": "python train.py"},
        },
        sort_keys=False,
    )


def _error(response: httpx.Response) -> tuple[str, str]:
    body: dict[str, Any] = response.json()
    code = body.get("ffdl_code") or body.get("code")
    text = body.get("description") or body.get("error")
    return str(code), str(text)


def _jobs_on_disk(server: LiveServer) -> list[str]:
    jobs = server.home / "jobs"
    return sorted(path.name for path in jobs.iterdir()) if jobs.exists() else []


def _database_text(home: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(home.glob("ffdl.db*")))


def _stored_connection(home: Path, job_id: str) -> dict[str, str]:
    with sqlite3.connect(home / "ffdl.db") as connection:
        row = connection.execute("SELECT manifest FROM jobs WHERE id = ?", (job_id,)).fetchone()
    stored: dict[str, str] = json.loads(row[0])["data_stores"][0]["connection"]
    return stored


def test_the_store_listens_on_loopback(s3: S3Server) -> None:
    assert s3.endpoint.startswith("http://127.0.0.1:")


def test_an_ffdl_job_reads_its_bucket_and_leaves_results_under_its_training_id(
    live: LiveServer, s3: S3Server
) -> None:
    job_id = live.submit_ok(ffdl_manifest(s3.connection()), {"train.py": TRAIN})
    shown = live.model(job_id)
    assert shown["data_stores"][0]["type"] == "mount_cos"
    assert shown["data_stores"][0]["connection"]["password"] == "***"

    live.wait_status(job_id, {"COMPLETED"}, timeout=120)
    lines = [line["line"] for line in live.loglines(job_id)]
    assert "data files: ['mnist/train.bin', 'numbers.txt']" in lines
    assert "sum: 10" in lines
    assert f"[ffdl] downloading data from s3://{DATA_BUCKET} to " in "\n".join(lines)
    assert "[ffdl] downloading data: 2/2 files, 1.2/1.2 MB" in lines
    assert any(line.startswith("[ffdl] storing results: 2/2 files") for line in lines)

    stored = s3.objects(RESULTS_BUCKET, f"{job_id}/")
    assert stored[f"{job_id}/model/total.txt"] == b"10"
    assert b"sum: 10" in stored[f"{job_id}/learner-1/training-log.txt"]
    assert f"{job_id}/_submitted_code/model.zip" in stored
    assert stored[f"{job_id}/_wml_checkpoints/epoch-1.ckpt"] == b"weights"
    assert f"s3://{RESULTS_BUCKET}/{job_id}" in json.dumps(live.model(job_id))

    # The secret is in none of what the platform shows, keeps or gave the job.
    environ = json.loads(stored[f"{job_id}/environ.json"])
    assert not any(s3.secret_key in value for value in environ.values())
    shown_everywhere = json.dumps(
        [live.model(job_id), live.client.get("/v1/models").json(), live.loglines(job_id)]
    )
    assert s3.secret_key not in shown_everywhere + live.log_tail(100_000)
    assert s3.secret_key.encode() not in _database_text(live.home)
    for spec in (live.home / "jobs" / job_id).glob("learners/*/*/spec.json"):
        assert s3.secret_key not in spec.read_text()
    erased = _stored_connection(live.home, job_id)
    assert erased["password"] == "erased"
    assert erased["auth_url"] == s3.endpoint


def test_refused_credentials_are_c103_and_create_nothing(live: LiveServer, s3: S3Server) -> None:
    before, buckets = _jobs_on_disk(live), s3.buckets()
    response = live.submit(ffdl_manifest(s3.connection(password="not-the-password")))
    assert response.status_code == 400, response.text
    code, text = _error(response)
    assert code == "C103"
    assert "refused the credentials" in text
    assert "not-the-password" not in response.text
    assert _jobs_on_disk(live) == before and s3.buckets() == buckets


@pytest.mark.parametrize("section", ["training_data", "training_results"])
def test_a_missing_bucket_is_c103_naming_it(live: LiveServer, s3: S3Server, section: str) -> None:
    before, buckets = _jobs_on_disk(live), s3.buckets()
    manifest = ffdl_manifest(s3.connection(), **{section: {"container": "no-such-bucket"}})
    response = live.submit(manifest)
    assert response.status_code == 400, response.text
    code, text = _error(response)
    assert code == "C103"
    assert "bucket 'no-such-bucket' does not exist" in text
    assert _jobs_on_disk(live) == before and s3.buckets() == buckets


def test_an_endpoint_the_operator_did_not_list_is_c103(live: LiveServer, s3: S3Server) -> None:
    response = live.submit(ffdl_manifest(s3.connection(auth_url="http://127.0.0.1:9")))
    assert response.status_code == 400, response.text
    code, text = _error(response)
    assert code == "C103"
    assert "object_store_endpoints" in text


@pytest.mark.parametrize("legacy", ["softlayer_objectstore", "bluemix_objectstore"])
def test_ffdl_swift_stores_are_refused_by_name(live: LiveServer, s3: S3Server, legacy: str) -> None:
    before = _jobs_on_disk(live)
    response = live.submit(ffdl_manifest(s3.connection(), type=legacy))
    assert response.status_code == 400, response.text
    code, text = _error(response)
    assert code == "C101"
    assert legacy in text and "s3_datastore" in text and "mount_cos" in text
    assert _jobs_on_disk(live) == before
