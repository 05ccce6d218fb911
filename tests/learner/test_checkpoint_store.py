"""A job's checkpoint store as a shared directory (``file://``): files appear whole or not at
all, a store that is not there is an error rather than an empty store, and a store that
holds checkpoints only takes neither results nor logs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ffdl.learner.spec import ObjectLocation
from ffdl.learner.staging import (
    STORE_CHECKPOINTS_DIR,
    JobStore,
    StagingError,
    StagingStopped,
    object_store,
    upload_objects,
)


def test_an_upload_stopped_mid_file_leaves_no_file_in_the_store(tmp_path: Path) -> None:
    source = tmp_path / "checkpoints"
    source.mkdir()
    (source / "ckpt-000000001.pt").write_bytes(os.urandom(3 * 1024 * 1024))
    (tmp_path / "store").mkdir()
    store = object_store(ObjectLocation(f"file://{tmp_path / 'store'}/job", {}))
    asked = 0

    def stop_once_bytes_flow() -> bool:
        nonlocal asked
        asked += 1
        return asked > 2  # past the start and the first chunk

    with pytest.raises(StagingStopped):
        upload_objects(
            str(source),
            store,
            "ckpt",
            label="saving checkpoints",
            progress=lambda line: None,
            should_stop=stop_once_bytes_flow,
        )

    written = [p.name for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert written == []


def test_a_whole_upload_lands_under_its_name_and_comes_back(tmp_path: Path) -> None:
    source = tmp_path / "checkpoints"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "ckpt.pt").write_bytes(b"weights")
    (tmp_path / "store").mkdir()
    location = ObjectLocation(f"file://{tmp_path / 'store'}/job", {})
    store = object_store(location)

    upload_objects(str(source), store, "ckpt", label="saving", progress=lambda line: None)

    assert [p.name for p in (tmp_path / "store" / "job" / "ckpt").rglob("*")] == [
        "sub",
        "ckpt.pt",
    ]
    assert store.url == location.root
    assert [obj.key for obj in store.list("ckpt")] == ["sub/ckpt.pt"]


def test_a_store_whose_directory_is_missing_is_an_error_not_an_empty_store(
    tmp_path: Path,
) -> None:
    # The shared filesystem is not mounted on this node: /shared does not exist.
    location = ObjectLocation(f"file://{tmp_path / 'shared'}/job", {})
    job_store = JobStore(location, 1, lambda line: None, str(tmp_path / "scratch"))
    target = tmp_path / "checkpoints"

    with pytest.raises(StagingError, match="not found"):
        job_store.restore_checkpoints(str(target), None, lambda: False)


def test_a_checkpoint_store_takes_checkpoints_only(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    location = ObjectLocation(f"file://{tmp_path / 'store'}/job", {})
    told: list[str] = []
    job_store = JobStore(location, 1, told.append, str(tmp_path / "scratch"), checkpoints_only=True)
    for name in ("results", "logs", "checkpoints"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.txt").write_text(name)
    archive = tmp_path / "model.zip"
    archive.write_bytes(b"PK")

    job_store.store_results(str(tmp_path / "results"), lambda: False)
    job_store.store_logs_and_code(str(tmp_path / "logs"), str(archive), lambda: False)
    job_store.save_checkpoints(str(tmp_path / "checkpoints"), lambda: False)

    stored = sorted(
        str(p.relative_to(tmp_path / "store" / "job"))
        for p in (tmp_path / "store").rglob("*")
        if p.is_file()
    )
    assert stored == [f"{STORE_CHECKPOINTS_DIR}/checkpoints.txt"]
    assert job_store.url == location.root
