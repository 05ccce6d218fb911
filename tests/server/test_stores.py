"""Path-based data stores stay under the operator's allowed directories: at submit and again
at every deploy, through symbolic links planted before or after submit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ffdl.core.manifest import Manifest, parse_manifest
from ffdl.server.services.stores import (
    StoreError,
    check_store_paths,
    results_path,
    training_data_path,
)
from ffdl.server.settings import Settings


@pytest.fixture
def stores(tmp_path: Path) -> Path:
    root = tmp_path / "stores"
    (root / "team" / "data").mkdir(parents=True)
    (root / "team" / "results").mkdir()
    return root


def settings_for(tmp_path: Path, *allowed: Path) -> Settings:
    return Settings(home=tmp_path / "home", store_paths=list(allowed))


def manifest(path: str, data: str = "data", results: str | None = "results") -> Manifest:
    store: dict[str, object] = {
        "id": "s",
        "type": "local",
        "training_data": {"container": data},
        "connection": {"path": path},
    }
    if results is not None:
        store["training_results"] = {"container": results}
    return parse_manifest(
        {"name": "j", "framework": {"name": "c", "command": "true"}, "data_stores": [store]}
    )


def refusal(settings: Settings, job: Manifest) -> StoreError:
    with pytest.raises(StoreError) as caught:
        check_store_paths(settings, job)
    assert caught.value.code == "C103"
    assert caught.value.http_status == 400
    return caught.value


def test_a_store_under_an_allowed_directory_is_used_resolved(tmp_path: Path, stores: Path) -> None:
    settings = settings_for(tmp_path, tmp_path / "elsewhere", stores)
    job = manifest(str(stores / "team"))
    check_store_paths(settings, job)
    assert training_data_path(settings, job) == (stores / "team" / "data").resolve()
    assert results_path(settings, job, "training-a") == (
        (stores / "team" / "results" / "training-a").resolve()
    )


def test_the_default_allowed_directory_is_home_stores(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    (tmp_path / "home" / "stores" / "s" / "data").mkdir(parents=True)
    check_store_paths(settings, manifest(str(tmp_path / "home" / "stores" / "s")))
    error = refusal(settings, manifest(str(tmp_path / "outside")))
    assert str(tmp_path / "outside") in error.message


def test_a_path_outside_the_allow_list_is_refused_naming_it(tmp_path: Path, stores: Path) -> None:
    settings = settings_for(tmp_path, stores)
    error = refusal(settings, manifest("/etc"))
    assert error.field == "data_stores[0].connection.path"
    assert "'/etc' is outside the allowed store paths" in error.message
    assert str(stores) in error.message
    # Climbing out with '..' is judged after resolving.
    error = refusal(settings, manifest(f"{stores}/team/../../.."))
    assert error.field == "data_stores[0].connection.path"
    assert refusal(settings, manifest("team")).reason.startswith("must be an absolute host path")


def test_a_symlinked_store_or_container_leading_out_is_refused(
    tmp_path: Path, stores: Path
) -> None:
    settings = settings_for(tmp_path, stores)
    outside = tmp_path / "outside"
    outside.mkdir()
    (stores / "escape").symlink_to(outside)
    error = refusal(settings, manifest(str(stores / "escape")))
    assert error.field == "data_stores[0].connection.path"
    (stores / "team" / "leak").symlink_to("/etc")
    error = refusal(settings, manifest(str(stores / "team"), data="leak"))
    assert error.field == "data_stores[0].training_data.container"
    assert "'leak' leads out of the allowed store paths" in error.message
    error = refusal(settings, manifest(str(stores / "team"), results="leak"))
    assert error.field == "data_stores[0].training_results.container"


def test_a_link_inside_the_allowed_directory_is_fine(tmp_path: Path, stores: Path) -> None:
    settings = settings_for(tmp_path, stores)
    (stores / "shared").mkdir()
    (stores / "team" / "common").symlink_to(stores / "shared")
    job = manifest(str(stores / "team"), data="common")
    check_store_paths(settings, job)
    assert training_data_path(settings, job) == (stores / "shared").resolve()


def test_deploy_checks_again_for_links_planted_after_submit(tmp_path: Path, stores: Path) -> None:
    settings = settings_for(tmp_path, stores)
    job = manifest(str(stores / "team"))
    check_store_paths(settings, job)
    os.rmdir(stores / "team" / "data")
    (stores / "team" / "data").symlink_to("/etc")
    with pytest.raises(StoreError) as caught:
        training_data_path(settings, job)
    assert caught.value.code == "C103"
    (stores / "team" / "results" / "training-b").symlink_to(tmp_path)
    with pytest.raises(StoreError):
        results_path(settings, job, "training-b")
    assert results_path(settings, job, "training-c") is not None


def test_link_loops_are_refused_not_crashed_on(tmp_path: Path, stores: Path) -> None:
    settings = settings_for(tmp_path, stores)
    (stores / "team" / "loop").symlink_to(stores / "team" / "loop")
    error = refusal(settings, manifest(str(stores / "team"), data="loop"))
    assert error.field == "data_stores[0].training_data.container"


def test_stores_without_paths_or_containers_give_none(tmp_path: Path, stores: Path) -> None:
    settings = settings_for(tmp_path, stores)
    job = manifest(str(stores / "team"), results=None)
    assert results_path(settings, job, "training-a") is None
    bare = parse_manifest({"name": "j", "framework": {"name": "c", "command": "true"}})
    assert training_data_path(settings, bare) is None
    assert results_path(settings, bare, "training-a") is None
