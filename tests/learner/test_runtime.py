"""Building a runtime's Python environment with uv, offline from a wheel directory."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ffdl.learner.runtime import (
    READY_FILE,
    RuntimeBuildError,
    RuntimeBuildStopped,
    RuntimeSpec,
    ensure,
    missing_program,
    runtime_from_dict,
)
from tests.wheels import make_wheel

# A distribution the platform has installed, at a version it does not have.
PINNED = "iniconfig"
PINNED_VERSION = "99.0.1"


def offline_spec(root: Path, wheels: Path, *requirements: str, name: str = "rt") -> RuntimeSpec:
    return RuntimeSpec(
        name=name,
        environment="python",
        path=str(root / "runtimes" / name),
        python=sys.executable,
        digest=f"digest-of-{name}",
        requirements=list(requirements),
        find_links=[str(wheels)],
        no_index=True,
    )


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    make_wheel(directory, PINNED, PINNED_VERSION)
    return directory


def test_an_environment_is_built_once_with_its_own_package_version(
    tmp_path: Path, wheels: Path
) -> None:
    spec = offline_spec(tmp_path, wheels, f"{PINNED}=={PINNED_VERSION}")
    lines: list[str] = []
    ensure(spec, lines.append)
    assert any("building a Python environment" in line for line in lines)
    assert any(f"+ {PINNED}=={PINNED_VERSION}" in line for line in lines), lines
    assert any("environment ready in" in line for line in lines)
    probe = "import iniconfig, ffdl.sdk.context as c; print(iniconfig.__version__, c.__name__)"
    done = subprocess.run(
        [str(spec.bin_dir / "python"), "-c", probe], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [PINNED_VERSION, "ffdl.sdk.context"]
    # Nothing else of the platform: its packages are not importable there.
    missing = subprocess.run(
        [str(spec.bin_dir / "python"), "-c", "import sqlalchemy"], capture_output=True
    )
    assert missing.returncode != 0
    again: list[str] = []
    ensure(spec, again.append)
    assert again == [f"[ffdl] runtime rt: using the cached environment {spec.path}"]


def test_a_built_environment_has_pip_which_finds_its_own_packages_offline(
    tmp_path: Path, wheels: Path
) -> None:
    # FfDL's keras-test runs `pip install keras && ...`: with the package in the runtime,
    # pip must find it there, with no index and no network.
    spec = offline_spec(tmp_path, wheels, f"{PINNED}=={PINNED_VERSION}", name="pip")
    lines: list[str] = []
    ensure(spec, lines.append)
    assert any("[ffdl] runtime pip: Successfully installed" in x and "pip-" in x for x in lines)
    pip = spec.bin_dir / "pip"
    env = {"PATH": f"{spec.bin_dir}:/usr/bin:/bin", "PIP_NO_INDEX": "1", "HOME": str(tmp_path)}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(
        [str(pip), "install", PINNED], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"Requirement already satisfied: {PINNED} in {spec.env_dir}" in done.stdout
    missing = subprocess.run(
        [str(pip), "install", "not-in-the-runtime"], capture_output=True, text=True, env=env
    )
    assert missing.returncode != 0
    assert "No matching distribution found for not-in-the-runtime" in missing.stderr
    assert "Retrying" not in missing.stderr


def test_a_runtime_names_the_executable_its_paths_lack(tmp_path: Path, wheels: Path) -> None:
    platform = RuntimeSpec(name="torch", python=sys.executable)
    platform.paths = {"/opt/conda/bin/python": "python", "/opt/conda/bin/pip": "pip"}
    assert platform.executable("python") == Path(sys.executable)
    assert missing_program(platform) is None
    platform.paths["/opt/conda/bin/conda"] = "conda-of-nobody"
    assert missing_program(platform) == (
        "runtime torch: paths entry /opt/conda/bin/conda: the platform's environment has no "
        f"executable 'conda-of-nobody' (no {Path(sys.executable).parent / 'conda-of-nobody'})"
    )
    built = offline_spec(tmp_path, wheels, name="built")
    built.paths = {"/opt/conda/bin/python": "python", "/opt/conda/bin/tool": "tool"}
    ensure(built, lambda line: None)
    assert missing_program(built) == (
        "runtime built: paths entry /opt/conda/bin/tool: its environment has no executable "
        f"'tool' (no {built.bin_dir / 'tool'})"
    )
    del built.paths["/opt/conda/bin/tool"]
    assert missing_program(built) is None


def test_a_failing_build_names_the_requirement_and_leaves_nothing(
    tmp_path: Path, wheels: Path
) -> None:
    spec = offline_spec(tmp_path, wheels, f"{PINNED}==99.0.2", name="broken")
    lines: list[str] = []
    with pytest.raises(RuntimeBuildError) as caught:
        ensure(spec, lines.append)
    message = str(caught.value)
    assert message.startswith("runtime broken: installing the requirements failed (exit")
    assert f"it names {PINNED}==99.0.2" in message and "last lines:" in message
    assert not Path(spec.path).exists()


def test_two_builders_at_once_build_once(tmp_path: Path, wheels: Path) -> None:
    spec = offline_spec(tmp_path, wheels, f"{PINNED}=={PINNED_VERSION}", name="shared")
    logs: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def build(index: int) -> None:
        try:
            ensure(spec, logs[index].append)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    builds = [log for log in logs if any("building a Python environment" in x for x in log)]
    reuses = [log for log in logs if any("using the cached environment" in x for x in log)]
    assert len(builds) == 1 and len(reuses) == 1
    assert (Path(spec.path) / READY_FILE).exists()


def test_a_stop_request_ends_the_build(tmp_path: Path, wheels: Path) -> None:
    spec = offline_spec(tmp_path, wheels, f"{PINNED}=={PINNED_VERSION}", name="stopped")
    with pytest.raises(RuntimeBuildStopped):
        ensure(spec, lambda line: None, should_stop=lambda: True)
    assert not Path(spec.path).exists()


def test_the_spec_field_is_validated() -> None:
    assert runtime_from_dict(None) is None
    platform = runtime_from_dict({"name": "pytorch-2.13", "environment": "platform"})
    assert platform is not None and not platform.built
    with pytest.raises(ValueError, match="path"):
        runtime_from_dict({"name": "x", "environment": "python", "python": "/usr/bin/python3"})
    with pytest.raises(ValueError, match="environment"):
        runtime_from_dict({"name": "x", "environment": "conda"})
    placed = {"name": "x", "paths": {"/opt/conda/bin/python": "python"}}
    with pytest.raises(ValueError, match="python must be an absolute path"):
        runtime_from_dict(placed)
    with pytest.raises(ValueError, match="paths must map absolute paths"):
        runtime_from_dict({**placed, "python": "/p", "paths": {"bin/python": "python"}})
    again = runtime_from_dict({**placed, "python": "/usr/bin/python3"})
    assert again is not None and again.executable("python") == Path("/usr/bin/python3")
    with pytest.raises(ValueError, match="requirements"):
        runtime_from_dict(
            {
                "name": "x",
                "environment": "python",
                "path": "/r",
                "python": "/p",
                "digest": "d",
                "requirements": "numpy",
            }
        )


def test_the_spec_carries_the_runtime_the_logs_and_the_learner_names() -> None:
    from ffdl.learner.sandbox import SandboxSpec
    from ffdl.learner.spec import (
        LearnerSpec,
        SpecError,
        host_path,
        learner_log_dir,
        spec_from_dict,
        spec_to_dict,
    )

    runtime = RuntimeSpec(
        name="tf", environment="python", path="/r/abc", python="/usr/bin/python3", digest="d"
    )
    sandbox = SandboxSpec(
        uid=1234,
        gid=1234,
        binds=[["/h/jobs/j/logs/learner-2", "/h/jobs/j/state/logs"]],
        hostname="learner-j-1",
        hosts=[["127.1.0.1", "learner-j-0", "learner-j-0.learner-j"]],
    )
    spec = LearnerSpec(
        training_id="j",
        learner=2,
        num_learners=2,
        attempt=1,
        api_url="http://127.0.0.1:1",
        job_token="t",
        command="true",
        workdir="/h/jobs/j/code",
        env={"LOG_DIR": "/h/jobs/j/state/logs"},
        data=[],
        results_source=None,
        results_target=None,
        emetrics_file=None,
        metric_groups={},
        state_dir="/h/jobs/j/learners/2/attempt-1",
        sandbox=sandbox,
        runtime=runtime,
        log_dir="/h/jobs/j/logs/learner-2",
    )
    again = spec_from_dict(spec_to_dict(spec))
    assert again.runtime == runtime and again.sandbox == sandbox
    assert learner_log_dir(again) == "/h/jobs/j/logs/learner-2"
    assert host_path(again, "/h/jobs/j/state/logs/tb") == "/h/jobs/j/logs/learner-2/tb"
    assert host_path(again, "/h/jobs/j/state/logsx") == "/h/jobs/j/state/logsx"
    document = spec_to_dict(spec)
    document["sandbox"]["hosts"] = [["127.1.0.1", "two names"]]
    with pytest.raises(SpecError, match="white space"):
        spec_from_dict(document)
    document = spec_to_dict(spec)
    document["runtime"]["environment"] = "conda"
    with pytest.raises(SpecError, match="runtime"):
        spec_from_dict(document)


def test_the_sandbox_names_the_learners_binds_its_logs_and_hides_platform_packages(
    tmp_path: Path,
) -> None:
    from ffdl.learner.sandbox import SandboxSpec, sandbox_argv, write_identity_files
    from ffdl.server.services.learner_env import hidden_platform_packages

    tmp_path.chmod(0o755)
    work, logs, shown = tmp_path / "job", tmp_path / "logs-2", tmp_path / "job" / "logs"
    for directory in (work, logs, shown):
        directory.mkdir()
    site_dir = Path(platform_site_packages())
    hidden = hidden_platform_packages([str(site_dir.parent)])
    assert hidden == [str(site_dir)]
    spec = SandboxSpec(
        uid=os.getuid() or 212347,
        gid=os.getgid() or 212347,
        read_only=[str(site_dir.parent)],
        read_write=[str(work)],
        binds=[[str(logs), str(shown)]],
        hostname="learner-x-1",
        hosts=[["127.1.0.1", "learner-x-0", "learner-x-0.learner-x"]],
        hidden=hidden,
        privileged=os.geteuid() == 0,
    )
    os.chown(work, spec.uid, spec.gid)
    os.chown(logs, spec.uid, spec.gid)
    probe = (
        f"hostname; getent hosts learner-x-0.learner-x | cut -d' ' -f1; "
        f"ls {site_dir} | wc -l; touch {shown}/mine && echo wrote"
    )
    identity = write_identity_files(tmp_path / "identity", spec, str(work))
    argv = sandbox_argv(spec, probe, str(work), identity)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["learner-x-1", "127.1.0.1", "0", "wrote"]
    assert (logs / "mine").exists()  # the learner's own directory got it


def platform_site_packages() -> str:
    import sqlalchemy

    return str(Path(sqlalchemy.__file__).resolve().parent.parent)
