"""At deploy: the runtime is resolved again from the config in force, recorded on the job,
and turned into the learner's PATH, pip settings, sandbox paths and programs, and FfDL
variables."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from ffdl.backends.fake import FakeBackend
from ffdl.core.errors import ManifestError
from ffdl.core.jobdirs import JobDirs
from ffdl.core.manifest import parse_manifest
from ffdl.core.resources import Node
from ffdl.learner.sandbox import NETWORK_HOST, SandboxSpec
from ffdl.server.auth import JobTokens
from ffdl.server.credentials import CredentialVault
from ffdl.server.platform import Platform
from ffdl.server.services.learner_env import (
    ffdl_variables,
    host_entries,
    job_runtime,
    pip_settings,
    runtime_path,
    runtime_programs,
    runtime_read_only,
)
from ffdl.server.services.runtimes import RuntimeConfig
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job
from tests.server.factories import make_job, make_store

SECRET = b"s" * 32
TF = {"framework": "tensorflow", "version": "1.15", "requirements": ["tensorflow==1.15"]}


def platform_with(tmp_path: Path, store: Store, runtimes: list[dict[str, Any]]) -> Platform:
    settings = Settings(
        home=tmp_path / "home", runtimes=[RuntimeConfig.model_validate(r) for r in runtimes]
    )
    return Platform(
        settings=settings,
        store=store,
        backend=FakeBackend([Node(name="n", gpus=1, cpus=4, memory_mb=1024)]),
        job_tokens=JobTokens(SECRET),
        credentials=CredentialVault(SECRET),
    )


@pytest.fixture
def platform(tmp_path: Path) -> Platform:
    made = platform_with(tmp_path, make_store(tmp_path), [TF])
    make_job(made.store, "training-tf")
    return made


def manifest(name: str, version: str, command: str = "python train.py") -> Any:
    framework = {"name": name, "version": version, "command": command}
    return parse_manifest({"name": "j", "gpus": 3, "framework": framework})


def runtime_of(platform: Platform, job_id: str) -> str | None:
    with platform.store.read() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.runtime


def test_a_built_runtime_is_described_and_recorded(platform: Platform) -> None:
    spec = job_runtime(platform, "training-tf", manifest("tensorflow", "1.15"))
    assert spec.built and spec.name == "tensorflow-1.15"
    assert Path(spec.path).parent == platform.settings.runtimes_dir
    assert spec.python == sys.executable and spec.requirements == ["tensorflow==1.15"]
    assert runtime_of(platform, "training-tf") == "tensorflow-1.15"
    path = runtime_path(spec, platform.settings.learner_path).split(os.pathsep)
    assert path[0] == str(spec.bin_dir)
    assert str(Path(sys.executable).parent) not in path
    read_only = runtime_read_only(spec, platform.settings.home)
    assert read_only is not None and read_only[0] == spec.path
    assert not any(p.startswith(sys.prefix + "/") or p == sys.prefix for p in read_only[1:])


def test_the_platform_runtime_keeps_the_platform_path(platform: Platform) -> None:
    spec = job_runtime(platform, "training-tf", manifest("pytorch", ""))
    assert not spec.built and runtime_of(platform, "training-tf") == spec.name
    assert runtime_path(spec, "/a:/b") == "/a:/b"
    assert runtime_read_only(spec, platform.settings.home) is None


def test_the_runtimes_paths_become_sandbox_programs(platform: Platform, tmp_path: Path) -> None:
    placed = {"/opt/conda/bin/python": "python", "/opt/conda/bin/pip": "pip"}
    torch = {"framework": "pytorch", "environment": "platform", "paths": placed}
    changed = platform_with(tmp_path, platform.store, [{**TF, "paths": placed}, torch])
    built = job_runtime(changed, "training-tf", manifest("tensorflow", "1.15"))
    assert runtime_programs(built) == [
        [str(built.bin_dir / "python"), "/opt/conda/bin/python"],
        [str(built.bin_dir / "pip"), "/opt/conda/bin/pip"],
    ]
    own = job_runtime(changed, "training-tf", manifest("pytorch", "2"))
    assert runtime_programs(own) == [
        [sys.executable, "/opt/conda/bin/python"],
        [str(Path(sys.executable).parent / "pip"), "/opt/conda/bin/pip"],
    ]
    assert runtime_programs(job_runtime(platform, "training-tf", manifest("custom", ""))) == []


def test_the_jobs_pip_gets_the_runtimes_options_and_no_index_without_a_network(
    platform: Platform, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    options = {
        "find_links": [str(wheels), "https://u:secret@mirror.example/wheels"],
        "index_url": "https://mirror.example/simple",
        "extra_index_urls": ["https://u:secret@private.example/simple"],
    }
    changed = platform_with(tmp_path, platform.store, [{**TF, **options}])
    built = job_runtime(changed, "training-tf", manifest("tensorflow", "1.15"))
    online = pip_settings(built, None)
    # The operator's index credentials never reach the job.
    assert online == {
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_FIND_LINKS": str(wheels.resolve()),
        "PIP_INDEX_URL": "https://mirror.example/simple",
    }
    assert pip_settings(built, SandboxSpec(uid=5, gid=5, network=NETWORK_HOST)) == online
    assert pip_settings(built, SandboxSpec(uid=5, gid=5)) == {**online, "PIP_NO_INDEX": "1"}
    read_only = runtime_read_only(built, changed.settings.home)
    assert read_only is not None and str(wheels.resolve()) in read_only
    own = job_runtime(platform, "training-tf", manifest("pytorch", ""))
    assert pip_settings(own, None) == {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    assert pip_settings(own, SandboxSpec(uid=5, gid=5))["PIP_NO_INDEX"] == "1"


def test_a_framework_whose_runtime_was_removed_fails_at_deploy(
    platform: Platform, tmp_path: Path
) -> None:
    changed = platform_with(tmp_path, platform.store, [{**TF, "framework": "tensorflow2"}])
    with pytest.raises(ManifestError, match="'tensorflow' has no runtime"):
        job_runtime(changed, "training-tf", manifest("tensorflow", "1.15"))


def test_ffdl_variables_use_ffdl_formats(tmp_path: Path) -> None:
    dirs = JobDirs.of(tmp_path / "jobs", "training-abc")
    dirs.create(2)
    job = manifest("custom", "", "echo a\r\npython b.py")
    variables = ffdl_variables("training-abc", job, 2, 2, dirs, sandboxed=True)
    assert variables["GPU_COUNT"] == "3.000000"
    assert int(float(variables["GPU_COUNT"])) == 3
    assert variables["TRAINING_COMMAND"] == "echo a python b.py"
    assert variables["LEARNER_NAME_PREFIX"] == "learner-abc"
    assert variables["DOWNWARD_API_POD_NAME"] == "learner-abc-1"
    assert variables["LOG_DIR"] == str(dirs.state / "logs")
    assert (dirs.result_bucket / "training-abc").resolve() == dirs.results.resolve()
    bare = ffdl_variables("training-abc", job, 2, 2, dirs, sandboxed=False)
    assert bare["LOG_DIR"] == str(dirs.logs(2))
    assert host_entries("training-abc", 2) == [
        ["127.1.0.1", "learner-abc-0", "learner-abc-0.learner-abc"],
        ["127.1.0.2", "learner-abc-1", "learner-abc-1.learner-abc"],
    ]


def test_without_a_sandbox_a_single_learner_still_has_log_dir_under_job_state(
    tmp_path: Path,
) -> None:
    dirs = JobDirs.of(tmp_path / "jobs", "training-one")
    dirs.create(1)
    variables = ffdl_variables("training-one", manifest("custom", ""), 1, 1, dirs, sandboxed=False)
    assert variables["LOG_DIR"] == str(dirs.state / "logs")
    assert dirs.state_logs.resolve() == dirs.logs(1).resolve()
