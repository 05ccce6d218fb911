"""The controller with an object store (a real S3 server on 127.0.0.1): training data
downloaded with progress, results, logs and the code archive stored under the job's prefix as
FfDL laid them out, checkpoints saved when an attempt ends and restored on another machine,
and the store's credentials kept out of the command's environment and off the disk."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ffdl.learner.spec import DataMount, ObjectLocation
from ffdl.storage.connection import S3Connection
from tests.learner.test_controller import launch, make_spec
from tests.learner.test_recording_api import RecordingApi, api
from tests.s3server import S3Server, s3_server

__all__ = ["api", "launch"]

DATA = {"numbers.txt": b"1 2 3 4\n", "images/blob.bin": b"\x01" * 1_500_000}
PRINT_DATA = (
    'cat "$DATA_DIR/numbers.txt"; wc -c < "$DATA_DIR/images/blob.bin"; '
    'echo trained > "$RESULT_DIR/model.txt"; env > "$RESULT_DIR/environ.txt"'
)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        server.make_bucket("training-data", DATA)
        server.make_bucket("results")
        yield server


def _location(s3: S3Server, root: str) -> ObjectLocation:
    connection = S3Connection(
        access_key=s3.access_key, secret_key=s3.secret_key, endpoint=s3.endpoint
    )
    return ObjectLocation(root, connection.to_fields())


def _spec(tmp_path: Path, s3: S3Server, api: RecordingApi, command: str, job: str) -> Any:
    spec = make_spec(tmp_path, api.url, command)
    data_dir = spec.env["DATA_DIR"]
    archive = tmp_path / "model.zip"
    archive.write_bytes(b"PK fake archive")
    return dataclasses.replace(
        spec,
        data=[
            DataMount(
                kind="s3",
                source="s3://training-data",
                target=data_dir,
                store=_location(s3, "training-data"),
            )
        ],
        results_store=_location(s3, f"results/{job}"),
        checkpoint_dir=spec.env["CHECKPOINT_DIR"],
        code_archive=str(archive),
    )


def test_data_comes_in_and_results_logs_and_code_go_out(
    tmp_path: Path, s3: S3Server, api: RecordingApi, launch: Any
) -> None:
    spec = _spec(tmp_path, s3, api, PRINT_DATA, "training-one")
    run = launch(spec)
    assert run.wait(60) == 0
    assert api.statuses() == ["DOWNLOADING", "PROCESSING", "STORING", "COMPLETED"]
    assert api.log_texts("stdout") == ["1 2 3 4", "1500000"]
    ffdl_lines = api.log_texts("ffdl")
    assert (
        "[ffdl] downloading data from s3://training-data to " + spec.env["DATA_DIR"] in ffdl_lines
    )
    assert "[ffdl] downloading data: 2/2 files, 1.5/1.5 MB" in ffdl_lines
    stored = s3.objects("results", "training-one/")
    assert stored["training-one/model.txt"] == b"trained\n"
    assert stored["training-one/_submitted_code/model.zip"] == b"PK fake archive"
    assert b"1 2 3 4" in stored["training-one/learner-1/training-log.txt"]
    environ = stored["training-one/environ.txt"].decode()
    assert s3.secret_key not in environ and s3.access_key not in environ
    everything = "\n".join(str(item) for item in api.items())
    assert s3.secret_key not in everything
    spec_file = (tmp_path / "spec-0.json").read_text()
    assert s3.secret_key not in spec_file and s3.access_key not in spec_file
    assert '"secret_key": "erased"' in spec_file


def test_checkpoints_follow_the_job_to_another_machine(
    tmp_path: Path, s3: S3Server, api: RecordingApi, launch: Any
) -> None:
    command = (
        'if [ -f "$CHECKPOINT_DIR/epoch-1.ckpt" ]; then '
        'echo "resumed from $(cat "$CHECKPOINT_DIR/epoch-1.ckpt")"; '
        'else echo weights-1 > "$CHECKPOINT_DIR/epoch-1.ckpt"; echo crashed; exit 3; fi'
    )
    first = _spec(tmp_path, s3, api, command, "training-two")
    assert launch(first).wait(60) == 0
    failed = api.final_status()
    assert failed is not None and failed["status"] == "FAILED"
    saved = s3.objects("results", "training-two/_wml_checkpoints/")
    assert saved == {"training-two/_wml_checkpoints/epoch-1.ckpt": b"weights-1\n"}
    # The failed attempt's logs are stored too, as FfDL did.
    assert "training-two/learner-1/training-log.txt" in s3.objects("results", "training-two/")

    # Another machine: no checkpoint, no staged data.
    checkpoints = Path(first.checkpoint_dir)
    shutil.rmtree(checkpoints)
    checkpoints.mkdir()
    shutil.rmtree(first.env["DATA_DIR"])
    second = dataclasses.replace(first, attempt=1, state_dir=str(tmp_path / "state" / "a1"))
    assert launch(second).wait(60) == 0
    completed = api.final_status()
    assert completed is not None and completed["status"] == "COMPLETED"
    assert "resumed from weights-1" in api.log_texts("stdout")
    assert any(
        line.startswith("[ffdl] restored 1 checkpoint files from s3://results/training-two")
        for line in api.log_texts("ffdl")
    )


def test_a_store_that_refuses_the_credentials_fails_the_download_with_s302(
    tmp_path: Path, s3: S3Server, api: RecordingApi, launch: Any
) -> None:
    spec = _spec(tmp_path, s3, api, "echo never", "training-three")
    wrong = dict(spec.data[0].store.connection, secret_key="not-the-secret")
    mount = dataclasses.replace(spec.data[0], store=ObjectLocation("training-data", wrong))
    run = launch(dataclasses.replace(spec, data=[mount]))
    assert run.wait(60) == 0
    final = api.final_status()
    assert final is not None and (final["status"], final["error_code"]) == ("FAILED", "S302")
    assert "refused the credentials" in final["reason"]
    assert "not-the-secret" not in final["reason"]
    assert api.log_texts("stdout") == []
