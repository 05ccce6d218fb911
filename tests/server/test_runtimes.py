"""Choosing a job's framework runtime from the operator's declarations (pure resolution)."""

from __future__ import annotations

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
