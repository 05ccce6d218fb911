"""Choosing a job's framework runtime from the operator's declarations (pure resolution),
and the checks of what they declare."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from ffdl.core.errors import ManifestError
from ffdl.server.services.runtimes import (
    RuntimeConfig,
    effective_runtimes,
    platform_runtimes,
    resolve,
    runtime_digest,
    unsandboxed_paths,
    version_matches,
)
from ffdl.server.settings import Settings

TF_OLD = RuntimeConfig(framework="tensorflow", version="1.15", requirements=["tensorflow==1.15"])
TF_TWO = RuntimeConfig(
    framework="TensorFlow", version="2.*", default=True, requirements=["tensorflow-cpu"]
)
TORCH = RuntimeConfig(framework="pytorch", version="2.13", name="torch-platform")


@pytest.mark.parametrize(
    ("pattern", "version", "matches"),
    [
        ("*", "anything", True),
        ("2.13", "2.13", True),
        ("2.13", "2.13.1", True),
        ("2.13", "2.1", False),
        ("2.1", "2.13", False),
        ("2.*", "2.5.0", True),
        ("2.*", "1.5", False),
        ("1.5.0", "1.5", False),
        ("1.?", "1.4", True),
    ],
)
def test_version_patterns_match_leading_parts(pattern: str, version: str, matches: bool) -> None:
    assert version_matches(pattern, version) is matches


def test_an_exact_version_wins_and_names_are_case_blind() -> None:
    runtimes = [TF_TWO, TF_OLD]
    chosen = resolve(runtimes, "Tensorflow", "1.15")
    assert chosen.runtime is TF_OLD and chosen.warning is None
    assert resolve(runtimes, "tensorflow", "2.4").runtime is TF_TWO


def test_an_unknown_version_falls_back_to_the_default_with_a_warning() -> None:
    chosen = resolve([TF_OLD, TF_TWO], "tensorflow", "0.12")
    assert chosen.runtime is TF_TWO
    assert chosen.warning is not None
    assert "tensorflow version 0.12 has no runtime" in chosen.warning
    assert "tensorflow-2.*" in chosen.warning and "default" in chosen.warning


def test_without_a_marked_default_the_first_declared_serves_and_no_version_is_silent() -> None:
    chosen = resolve([TF_OLD, TORCH], "tensorflow", "3.0")
    assert chosen.runtime is TF_OLD and chosen.warning is not None
    assert resolve([TF_OLD, TF_TWO], "tensorflow", "").runtime is TF_TWO
    assert resolve([TF_OLD, TF_TWO], "tensorflow", "").warning is None


def test_a_framework_without_runtimes_is_refused_with_the_list_of_what_exists() -> None:
    with pytest.raises(ManifestError) as caught:
        resolve([TF_OLD, TF_TWO, TORCH], "caffe", "1.0")
    error = caught.value
    assert error.field == "framework.name" and error.code == "C101"
    assert "'caffe' has no runtime" in error.message
    assert "pytorch (2.13)" in error.message and "tensorflow (1.15, 2.*)" in error.message


def test_declared_frameworks_replace_only_their_own_defaults() -> None:
    defaults = {r.framework for r in platform_runtimes()}
    assert {"pytorch", "custom", "python", "scikit-learn"} <= defaults
    merged = effective_runtimes([TF_OLD, TORCH])
    assert [r for r in merged if r.framework == "pytorch"] == [TORCH]
    assert any(r.framework == "custom" for r in merged)
    assert all(not r.built for r in platform_runtimes())


def test_the_platform_pytorch_runtime_carries_the_installed_version() -> None:
    from importlib.metadata import version

    installed = ".".join(version("torch").split("+")[0].split(".")[:2])
    (torch_runtime,) = [r for r in platform_runtimes() if r.framework == "pytorch"]
    assert torch_runtime.version == installed and torch_runtime.default
    assert resolve(list(platform_runtimes()), "pytorch", installed).warning is None
    assert resolve(list(platform_runtimes()), "pytorch", "0.4").warning is not None
    assert resolve(list(platform_runtimes()), "custom", "whatever").warning is None


def test_the_environment_follows_from_requirements_and_bad_declarations_are_refused() -> None:
    assert TF_OLD.built and not TORCH.built
    assert RuntimeConfig(framework="python", environment="python").built
    with pytest.raises(ValidationError, match="platform environment takes no requirements"):
        RuntimeConfig(framework="x", environment="platform", requirements=["a"])
    with pytest.raises(ValidationError, match="must name a package"):
        RuntimeConfig(framework="x", requirements=["--index-url=http://x"])
    with pytest.raises(ValidationError, match="absolute path or a URL"):
        RuntimeConfig(framework="x", requirements=["a"], find_links=["wheels"])
    with pytest.raises(ValidationError):
        RuntimeConfig.model_validate({"framework": "x", "requirments": ["a"]})


def test_the_digest_changes_with_what_is_installed_but_not_with_the_name() -> None:
    base = RuntimeConfig(framework="x", requirements=["a==1"], no_index=True)
    renamed = base.model_copy(update={"name": "other"})
    assert runtime_digest(base) == runtime_digest(renamed)
    assert runtime_digest(base) != runtime_digest(base.model_copy(update={"requirements": ["a"]}))
    assert runtime_digest(base) != runtime_digest(base.model_copy(update={"no_index": False}))
    assert runtime_digest(base, "/usr/bin/python3") != runtime_digest(base, "/opt/py/bin/python")


def test_settings_read_runtimes_from_config_and_refuse_two_defaults(tmp_path: Path) -> None:
    runtimes = [
        {"framework": "tensorflow", "version": "1.15", "requirements": ["tensorflow==1.15"]},
        {"framework": "tensorflow", "version": "2.*", "default": True},
    ]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"runtimes": runtimes}))
    settings = Settings.load(tmp_path)
    assert [r.label for r in settings.runtimes] == ["tensorflow-1.15", "tensorflow-2.*"]
    assert settings.runtimes_dir == tmp_path.resolve() / "runtimes"
    runtimes[0]["default"] = True
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"runtimes": runtimes}))
    with pytest.raises(ValidationError, match="more than one default"):
        Settings.load(tmp_path)


PLATFORM_BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("inside", "name", "message"),
    [
        ("opt/conda/bin/python", "python", "must be an absolute path"),
        ("/opt/conda/../bin/python", "python", "must be an absolute path"),
        ("/opt/conda/bin/", "python", "must be an absolute path"),
        ("/", "python", "must be an absolute path"),
        ("/usr/bin/python", "python", "collides with /usr"),
        ("/bin/python", "python", "collides with /bin"),
        ("/lib64/ld.so", "python", "collides with /lib64"),
        ("/etc/python", "python", "collides with /etc"),
        ("/proc/python", "python", "collides with /proc"),
        ("/dev/shm/python", "python", "collides with /dev"),
        ("/tmp/python", "python", "collides with /tmp"),
        ("/sys/python", "python", "collides with /sys"),
        ("/opt", "python", "collides with /opt"),
        ("/opt/conda/bin/python", "bin/python", "must name an executable"),
        ("/opt/conda/bin/python", "", "must name an executable"),
    ],
)
def test_a_runtime_path_the_sandbox_cannot_provide_is_refused_naming_the_entry(
    inside: str, name: str, message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        RuntimeConfig(framework="pytorch", paths={inside: name})
    text = str(caught.value)
    assert f"runtime 'pytorch': paths entry {inside!r}" in text and message in text


def test_runtime_paths_may_not_nest_and_do_not_change_the_digest() -> None:
    with pytest.raises(ValidationError, match="'/opt/conda/bin/x' lies under the entry '/opt/c"):
        RuntimeConfig(framework="x", paths={"/opt/conda": "python", "/opt/conda/bin/x": "pip"})
    base = RuntimeConfig(framework="x", requirements=["a==1"])
    placed = base.model_copy(update={"paths": {"/opt/conda/bin/python": "python"}})
    assert runtime_digest(base) == runtime_digest(placed)


def test_settings_accept_runtime_paths_and_check_them_against_the_home_and_the_platform(
    tmp_path: Path,
) -> None:
    paths = {"/opt/conda/bin/python": "python", "/opt/conda/bin/pip": "pip"}
    runtimes: list[dict[str, object]] = [
        {"framework": "pytorch", "environment": "platform", "paths": paths},
        # A built environment's executables are known once it is built.
        {"framework": "tf", "requirements": ["a"], "paths": {"/opt/tf/bin/tool": "tool"}},
    ]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"runtimes": runtimes}))
    settings = Settings.load(tmp_path)
    assert settings.runtimes[0].paths == paths

    runtimes[0]["paths"] = {"/opt/conda/bin/conda": "conda-of-nobody"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"runtimes": runtimes}))
    with pytest.raises(ValidationError) as caught:
        Settings.load(tmp_path)
    assert (
        "runtime pytorch: paths entry /opt/conda/bin/conda: the platform's environment has no "
        f"executable 'conda-of-nobody' (no {PLATFORM_BIN / 'conda-of-nobody'})" in str(caught.value)
    )

    # The jobs' own directories are in the home: a path there, or holding it, is refused.
    for inside in ("/srv/ffdl/jobs/python", "/srv"):
        placed = RuntimeConfig(framework="pytorch", paths={inside: "python"})
        with pytest.raises(ValidationError) as caught:
            Settings(home=Path("/srv/ffdl"), runtimes=[placed])
        assert f"paths entry {inside!r}: collides with the platform home /srv/ffdl" in str(
            caught.value
        )


def test_without_the_sandbox_the_operator_is_told_which_paths_are_not_provided() -> None:
    placed = RuntimeConfig(framework="pytorch", paths={"/opt/conda/bin/python": "python"})
    assert unsandboxed_paths([TF_OLD, TORCH]) is None
    warning = unsandboxed_paths([TF_OLD, placed])
    assert warning is not None
    assert "--no-sandbox" in warning and "pytorch: /opt/conda/bin/python" in warning
