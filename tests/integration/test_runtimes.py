"""Framework runtimes through a live server: resolution at submit, an environment built
offline on first use and reused, its own package versions, a build that fails, programs a
runtime places at paths of its own (FfDL's /opt/conda/bin/python), and `pip install` of
what a runtime has, without a network."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving
from tests.learner.test_runtime import PINNED, PINNED_VERSION
from tests.wheels import make_wheel

# Reports which iniconfig it sees and whether anything of the platform is visible.
PROBE = """
import importlib.metadata, importlib.util, json, os, sys
import iniconfig
from ffdl.sdk.context import context

installed = importlib.metadata.version("iniconfig")
print("iniconfig", installed, "from", iniconfig.__file__, flush=True)
seen = {
    "iniconfig": installed,
    "prefix": sys.prefix,
    "platform_site": os.path.exists(os.environ["PLATFORM_SITE"]),
    "sqlalchemy": importlib.util.find_spec("sqlalchemy") is not None,
    "ffdl_server": importlib.util.find_spec("ffdl.server") is not None,
    "training_id": context().training_id,
    "path": os.environ["PATH"],
}
with open(os.path.join(os.environ["RESULT_DIR"], "seen.json"), "w") as handle:
    json.dump(seen, handle)
"""


def platform_site() -> str:
    import iniconfig

    return str(Path(iniconfig.__file__).resolve().parent.parent)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("runtimes")
    wheels = root / "wheels"
    make_wheel(wheels, PINNED, PINNED_VERSION)
    offline = {"find_links": [str(wheels)], "no_index": True}
    pinned = {"requirements": [f"{PINNED}=={PINNED_VERSION}"], **offline}
    conda = {"/opt/conda/bin/python": "python"}
    runtimes = [
        {"framework": "inifw", "version": "1.0", "default": True, "paths": conda, **pinned},
        {"framework": "inifw", "version": "2.*", "environment": "platform", "paths": conda},
        {"framework": "brokenfw", "requirements": [f"{PINNED}==99.0.2"], **offline},
        # inifw-1.0's environment (the same digest), with a program it does not have.
        {"framework": "lackfw", "paths": {"/opt/conda/bin/conda": "conda"}, **pinned},
    ]
    config = {**FAST_CONFIG, "runtimes": runtimes}
    with serving(LiveServer(home=root / "home", config=config)) as live:
        yield live


def framework_manifest(command: str, framework: str, framework_version: str) -> str:
    document = yaml.safe_load(manifest_yaml(command, gpus=0))
    document["framework"].update(name=framework, version=framework_version)
    return str(yaml.safe_dump(document))


def probe_manifest(framework: str, framework_version: str) -> str:
    command = f"PLATFORM_SITE={platform_site()} python job.py"
    return framework_manifest(command, framework, framework_version)


def lines_of(server: LiveServer, job_id: str) -> list[str]:
    return [str(line["line"]) for line in server.loglines(job_id)]


def ffdl_lines(server: LiveServer, job_id: str) -> list[str]:
    return [line["line"] for line in server.loglines(job_id) if line["line"].startswith("[ffdl]")]


def seen_by(server: LiveServer, job_id: str) -> dict[str, object]:
    results = server.home / "jobs" / job_id / "results" / "seen.json"
    seen: dict[str, object] = json.loads(results.read_text())
    return seen


def test_a_job_runs_on_its_built_runtime_which_is_then_reused(server: LiveServer) -> None:
    manifest = probe_manifest("inifw", "1.0")
    response = server.submit(manifest, {"job.py": PROBE})
    assert response.status_code == 201, response.text
    assert response.json()["warnings"] == []
    job_id = response.json()["model_id"]
    model = server.wait_status(job_id, {"COMPLETED"}, timeout=180)
    assert model["framework"]["runtime"] == "inifw-1.0"
    seen = seen_by(server, job_id)
    assert seen["iniconfig"] == PINNED_VERSION != version(PINNED)
    assert seen["platform_site"] is False and seen["sqlalchemy"] is False
    assert seen["ffdl_server"] is False and seen["training_id"] == job_id
    assert str(seen["prefix"]).startswith(str(server.home.resolve() / "runtimes"))
    lines = ffdl_lines(server, job_id)
    assert any("[ffdl] runtime inifw-1.0: building a Python environment" in x for x in lines)
    assert any(f"+ {PINNED}=={PINNED_VERSION}" in x for x in lines), lines
    assert any("environment ready in" in x for x in lines)

    again = server.submit_ok(manifest, {"job.py": PROBE})
    server.wait_status(again, {"COMPLETED"}, timeout=120)
    lines = ffdl_lines(server, again)
    assert any("using the cached environment" in x for x in lines), lines
    assert not any("building a Python environment" in x for x in lines)
    assert seen_by(server, again)["iniconfig"] == PINNED_VERSION


def test_an_unknown_version_runs_on_the_default_with_a_warning(server: LiveServer) -> None:
    response = server.submit(probe_manifest("inifw", "0.9"), {"job.py": PROBE})
    assert response.status_code == 201, response.text
    (warning,) = response.json()["warnings"]
    assert "inifw version 0.9 has no runtime" in warning and "inifw-1.0" in warning
    job_id = response.json()["model_id"]
    server.wait_status(job_id, {"COMPLETED"}, timeout=120)
    assert seen_by(server, job_id)["iniconfig"] == PINNED_VERSION


def test_a_platform_runtime_sees_the_platform_packages(server: LiveServer) -> None:
    job_id = server.submit_ok(probe_manifest("inifw", "2.3"), {"job.py": PROBE})
    model = server.wait_status(job_id, {"COMPLETED"}, timeout=120)
    assert model["framework"]["runtime"] == "inifw-2.*"
    seen = seen_by(server, job_id)
    assert seen["iniconfig"] == version(PINNED) and seen["sqlalchemy"] is True


def test_a_framework_without_a_runtime_is_refused_with_what_exists(server: LiveServer) -> None:
    response = server.submit(probe_manifest("caffe", "1.0"), {"job.py": PROBE})
    assert response.status_code == 400
    body = response.json()
    assert "C101" in (body.get("ffdl_code"), body.get("code"))
    text = json.dumps(body)
    assert "'caffe' has no runtime" in text
    assert "inifw (1.0, 2.*)" in text and "brokenfw (any version)" in text
    assert "pytorch" in text and "custom (any version)" in text


def test_a_failing_build_fails_the_job_with_the_reason(server: LiveServer) -> None:
    job_id = server.submit_ok(probe_manifest("brokenfw", "1"), {"job.py": PROBE})
    model = server.wait_status(job_id, {"FAILED"}, timeout=120)
    status = model["training"]["training_status"]
    message = json.dumps(status)
    assert "runtime brokenfw: installing the requirements failed" in message
    assert f"{PINNED}==99.0.2" in message and "last lines" in message
    assert status["error_code"] == "S101"


@pytest.mark.parametrize("framework_version", ["1.0", "2.3"])
def test_a_runtime_path_runs_the_runtimes_own_python(
    server: LiveServer, framework_version: str
) -> None:
    # FfDL's manifests call the interpreter of FfDL's images by its path.
    probe = (
        "import sys, importlib.metadata as m; print('probe', m.version('iniconfig'), sys.prefix)"
    )
    command = f'/opt/conda/bin/python -c "{probe}"'
    job_id = server.submit_ok(framework_manifest(command, "inifw", framework_version))
    server.wait_status(job_id, {"COMPLETED"}, timeout=180)
    (line,) = [x for x in lines_of(server, job_id) if x.startswith("probe ")]
    _, seen, prefix = line.split()
    if framework_version == "1.0":  # the built environment, its own iniconfig
        assert seen == PINNED_VERSION
        assert prefix.startswith(str(server.home.resolve() / "runtimes"))
    else:  # the platform's environment
        assert (seen, prefix) == (version(PINNED), sys.prefix)


def test_a_runtime_path_naming_what_the_environment_lacks_fails_the_job(
    server: LiveServer,
) -> None:
    job_id = server.submit_ok(framework_manifest("/opt/conda/bin/conda info", "lackfw", "1"))
    model = server.wait_status(job_id, {"FAILED"}, timeout=180)
    status = model["training"]["training_status"]
    assert status["error_code"] == "S101"
    assert (
        "runtime lackfw: paths entry /opt/conda/bin/conda: its environment has no "
        "executable 'conda'" in json.dumps(status)
    )


@pytest.mark.parametrize("framework_version", ["1.0", "2.3"])
def test_pip_install_of_what_the_runtime_has_is_satisfied_offline(
    server: LiveServer, framework_version: str
) -> None:
    # FfDL's keras-test: `pip install keras && python ...`, in a sandbox without a network.
    check = f"import {PINNED}, importlib.metadata as m; print('imported', m.version('{PINNED}'))"
    command = f'pip install {PINNED} && python -c "{check}"'
    job_id = server.submit_ok(framework_manifest(command, "inifw", framework_version))
    server.wait_status(job_id, {"COMPLETED"}, timeout=180)
    lines = lines_of(server, job_id)
    assert any(x.startswith(f"Requirement already satisfied: {PINNED} in") for x in lines), lines
    expected = PINNED_VERSION if framework_version == "1.0" else version(PINNED)
    assert f"imported {expected}" in lines


def test_pip_install_of_what_the_runtime_lacks_fails_at_once(server: LiveServer) -> None:
    job_id = server.submit_ok(framework_manifest("pip install not-in-it", "inifw", "1.0"))
    server.wait_status(job_id, {"FAILED"}, timeout=120)
    lines = lines_of(server, job_id)
    assert "ERROR: No matching distribution found for not-in-it" in lines, lines
    assert not any("Retrying" in x for x in lines)  # no index tried: there is no network
