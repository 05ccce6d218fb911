"""The learner side of object stores: progress lines while data downloads, checkpoints
restored only into an empty directory and never through a link, and the spec that carries
the store's credentials, which the controller erases from disk once read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ffdl.learner import staging
from ffdl.learner.spec import (
    DataMount,
    LearnerSpec,
    ObjectLocation,
    SpecError,
    dump_spec,
    erase_spec_secrets,
    load_spec,
    spec_from_dict,
    spec_to_dict,
)
from ffdl.storage.fsspec_store import FsspecStore
from ffdl.storage.memory import memory_store


def _filled(files: dict[str, bytes]) -> FsspecStore:
    store = memory_store("bucket")
    for key, data in files.items():
        store.fs.pipe(store.path(key), data)
    return store


def test_download_tells_files_and_bytes_then_skips_them_next_time(tmp_path: Path) -> None:
    store = _filled({"a.bin": b"x" * 2_000_000, "b/c.txt": b"hello"})
    lines: list[str] = []
    staging.download_objects(
        store, "", str(tmp_path), label="downloading data", progress=lines.append
    )
    assert lines[-1] == "[ffdl] downloading data: 2/2 files, 2.0/2.0 MB"
    lines.clear()
    stats = staging.download_objects(
        store, "", str(tmp_path), label="downloading data", progress=lines.append
    )
    assert stats.files_skipped == 2
    assert "[ffdl] downloading data: 2 files already in place, not copied again" in lines


def test_a_store_failure_becomes_a_staging_error_naming_the_store(tmp_path: Path) -> None:
    store = memory_store("bucket")
    store.fs.rm("/bucket", recursive=True)
    with pytest.raises(staging.StagingError, match="memory://bucket"):
        staging.download_objects(store, "", str(tmp_path), label="downloading data", progress=print)


def test_checkpoints_are_restored_into_an_empty_directory(tmp_path: Path) -> None:
    store = _filled({"ckpt/epoch-3.pt": b"state", "ckpt/sub/opt.pt": b"opt"})
    target = tmp_path / "checkpoints"
    target.mkdir()
    stats = staging.restore_tree(
        store, "ckpt", str(target), str(tmp_path / "scratch"), None, label="restore", progress=print
    )
    assert stats is not None and stats.files_total == 2
    assert (target / "epoch-3.pt").read_bytes() == b"state"
    assert (target / "sub" / "opt.pt").read_bytes() == b"opt"
    assert os.listdir(tmp_path / "scratch") == []


def test_a_local_copy_is_never_replaced_by_the_stored_one(tmp_path: Path) -> None:
    store = _filled({"ckpt/epoch-3.pt": b"old"})
    target = tmp_path / "checkpoints"
    target.mkdir()
    (target / "epoch-5.pt").write_bytes(b"newer")
    assert (
        staging.restore_tree(
            store, "ckpt", str(target), str(tmp_path / "s"), None, label="r", progress=print
        )
        is None
    )
    assert os.listdir(target) == ["epoch-5.pt"]


def test_nothing_stored_restores_nothing(tmp_path: Path) -> None:
    target = tmp_path / "checkpoints"
    result = staging.restore_tree(
        memory_store("b"), "ckpt", str(target), str(tmp_path / "s"), None, label="r", progress=print
    )
    assert result is None and target.is_dir()


def _spec(tmp_path: Path) -> LearnerSpec:
    connection = {"endpoint": "http://127.0.0.1:9", "access_key": "AKID", "secret_key": "SEKRIT"}
    return LearnerSpec(
        training_id="training-x",
        learner=1,
        num_learners=1,
        attempt=0,
        api_url="http://127.0.0.1:1",
        job_token="t",
        command="true",
        workdir=str(tmp_path),
        env={},
        data=[
            DataMount(
                kind="s3",
                source="s3://in",
                target=str(tmp_path / "data"),
                store=ObjectLocation("in", dict(connection)),
            )
        ],
        results_source=str(tmp_path / "results"),
        results_target=None,
        emetrics_file=None,
        metric_groups={},
        state_dir=str(tmp_path / "state"),
        results_store=ObjectLocation("out/training-x", dict(connection)),
        checkpoint_dir=str(tmp_path / "checkpoints"),
        code_archive=str(tmp_path / "model.zip"),
    )


def test_the_spec_carries_object_stores_and_erases_their_secrets(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    dump_spec(_spec(tmp_path), path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    loaded = load_spec(path)
    assert loaded == _spec(tmp_path)
    assert erase_spec_secrets(path)
    text = path.read_text()
    assert "SEKRIT" not in text and "AKID" not in text
    erased = load_spec(path)
    assert erased.results_store is not None
    assert erased.results_store.connection["secret_key"] == "erased"
    assert erased.results_store.connection["endpoint"] == "http://127.0.0.1:9"
    assert not erase_spec_secrets(path)


def test_an_s3_data_mount_without_its_store_is_refused(tmp_path: Path) -> None:
    document = spec_to_dict(_spec(tmp_path))
    document["data"][0]["store"] = None
    with pytest.raises(SpecError, match="store"):
        spec_from_dict(json.loads(json.dumps(document)))
