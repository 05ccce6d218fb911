"""Choosing and configuring the backend: ``Settings.backend_config``, the advertised API
address, and the ``ffdl up`` / ``python -m ffdl.server.main`` options (real subprocesses)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from ffdl.backends.local import LocalConfig
from ffdl.backends.ray_config import RayConfig
from ffdl.core.resources import Node
from ffdl.server.settings import NodeConfig, Settings


def test_the_local_backend_gets_its_own_config(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path,
        sandbox=False,
        cpu_slots=3,
        learner_path="/opt/bin:/usr/bin",
        nodes=[NodeConfig(name="node-a", gpus=2, cpus=8, memory="2GiB", labels={"rack": "r1"})],
    )
    assert settings.backend == "local"
    assert settings.backend_config() == LocalConfig(
        home=str(tmp_path),
        learner_path="/opt/bin:/usr/bin",
        sandbox=False,
        nodes=(Node(name="node-a", gpus=2, cpus=8, memory_mb=2048, labels={"rack": "r1"}),),
        cpu_slots=3,
    )


def test_the_ray_backend_gets_its_own_config(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path,
        backend="ray",
        ray_address="10.0.0.1:6379",
        advertise_url="http://10.0.0.2:8080/",
        ray_namespace="team",
        ray_work_root="/scratch/ffdl",
        checkpoint_store="s3://ckpt/ffdl",
        checkpoint_store_options={"endpoint": "http://10.0.0.3:9000"},
        checkpoint_sync_s=2.5,
        ray_launch_timeout_s=60,
        learner_path="/opt/bin",
    )
    assert settings.backend_config() == RayConfig(
        address="10.0.0.1:6379",
        home=str(tmp_path),
        api_url="http://10.0.0.2:8080",
        namespace="team",
        work_root="/scratch/ffdl",
        checkpoint_store="s3://ckpt/ffdl",
        checkpoint_store_options={"endpoint": "http://10.0.0.3:9000"},
        checkpoint_sync_s=2.5,
        launch_timeout_s=60.0,
        learner_path="/opt/bin",
    )


@pytest.mark.parametrize("address", [None, "", "  "])
def test_the_ray_backend_without_an_address_is_a_clear_error(
    tmp_path: Path, address: str | None
) -> None:
    settings = Settings(home=tmp_path, backend="ray", ray_address=address)
    with pytest.raises(ValueError, match="ray_address") as caught:
        settings.backend_config()
    assert "--ray-address" in str(caught.value)


def test_learners_report_to_the_advertised_url_or_the_api_url(tmp_path: Path) -> None:
    assert Settings(home=tmp_path, port=9123).learner_api_url == "http://127.0.0.1:9123"
    advertised = Settings(home=tmp_path, advertise_url="https://ffdl.example.com/")
    assert advertised.learner_api_url == "https://ffdl.example.com"
    # Set but empty (``FFDL_ADVERTISE_URL=``) is unset.
    assert Settings(home=tmp_path, port=9123, advertise_url=" ").advertise_url is None


@pytest.mark.parametrize("url", ["ftp://host", "10.0.0.1:8080", "http://"])
def test_the_advertised_url_must_be_http(tmp_path: Path, url: str) -> None:
    with pytest.raises(ValidationError, match="advertise_url"):
        Settings(home=tmp_path, advertise_url=url)


@pytest.mark.parametrize("field", ["checkpoint_sync_s", "ray_launch_timeout_s"])
def test_ray_timings_must_be_positive(tmp_path: Path, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Settings.model_validate({"home": tmp_path, field: 0})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("elastic_objective", "fastest"),
        ("restart_cost_s", -1),
        ("restart_penalty", -0.1),
        ("admit_after_s", -5),
        ("tenant_fairness", "fair"),
    ],
)
def test_elastic_policy_settings_out_of_range_are_refused_by_name(
    tmp_path: Path, field: str, value: object
) -> None:
    with pytest.raises(ValidationError, match=field):
        Settings.model_validate({"home": tmp_path, field: value})


@pytest.mark.parametrize("speed", [0, -2, float("nan"), float("inf")])
def test_a_gpu_speed_must_be_a_finite_positive_number(tmp_path: Path, speed: float) -> None:
    with pytest.raises(ValidationError, match="gpu_speeds") as caught:
        Settings.model_validate({"home": tmp_path, "gpu_speeds": {"h100": 3.0, "v100": speed}})
    assert "not for v100" in str(caught.value)


def test_the_elastic_policy_defaults(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    assert settings.elastic_objective == "proportional"
    assert settings.tenant_fairness == "none" and settings.gpu_speeds == {}
    assert (settings.restart_cost_s, settings.admit_after_s) == (30.0, 60.0)
    assert Settings(home=tmp_path, restart_cost_s=None).restart_cost_s is None


def test_the_backend_is_read_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FFDL_BACKEND", "ray")
    monkeypatch.setenv("FFDL_RAY_ADDRESS", "10.0.0.1:6379")
    config = Settings.load(tmp_path).backend_config()
    assert isinstance(config, RayConfig) and config.address == "10.0.0.1:6379"


def _run(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "FFDL_HOME": str(home / "ffdl"),
        "COLUMNS": "200",
        "LANG": "C.UTF-8",
    }
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_ffdl_up_lists_the_backend_options(tmp_path: Path) -> None:
    done = _run("ffdl.cli.main", "up", "--help", home=tmp_path)
    assert done.returncode == 0, done.stderr
    for option in ("--backend", "--ray-address", "--advertise-url"):
        assert option in done.stdout
    assert "local|ray" in done.stdout


def test_ffdl_up_with_ray_but_no_address_exits_with_the_reason(tmp_path: Path) -> None:
    done = _run("ffdl.cli.main", "up", "--backend", "ray", "--port", "1", home=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("ffdl: ") and "--ray-address" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_server_module_rejects_a_bad_advertised_url(tmp_path: Path) -> None:
    done = _run(
        "ffdl.server.main",
        "--home",
        str(tmp_path / "h"),
        "--port",
        "1",
        "--advertise-url",
        "ftp://x",
        home=tmp_path,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("ffdl: invalid settings: advertise_url: ")
    assert "http(s)://" in done.stderr
    assert "Traceback" not in done.stderr


def test_ffdl_up_api_only_on_sqlite_exits_with_the_reason_and_makes_nothing(
    tmp_path: Path,
) -> None:
    done = _run("ffdl.cli.main", "up", "--api-only", "--port", "1", home=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("ffdl: invalid settings: ")
    assert "run_loops" in done.stderr and "PostgreSQL" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "ffdl" / "ffdl.db").exists()


def test_api_only_on_postgresql_is_accepted(tmp_path: Path) -> None:
    url = "postgresql+psycopg://ffdl@127.0.0.1:5432/ffdl"
    settings = Settings(home=tmp_path, database_url=url, run_loops=False)
    assert settings.run_loops is False
    with pytest.raises(ValidationError, match="run_loops is false"):
        Settings(home=tmp_path, run_loops=False)
