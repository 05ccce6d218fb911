"""The Getting-started page's commands, run as written: ``make demo``, then the first job
(``ffdl up`` in one shell; ``ffdl init``, ``ffdl train --follow`` and ``ffdl download`` in
another). Only what the page leaves to the reader changes: the platform's home and port
(``FFDL_HOME``, ``FFDL_PORT``, which the page names) and the job id ``train`` printed."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.live import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
PLACEHOLDER_ID = "training-abc123"


def shell_blocks(page: Path) -> list[list[str]]:
    """The commands of each ``sh`` block of ``page``, comments and blank lines left out."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in page.read_text(encoding="utf-8").splitlines():
        if current is None and line.strip() == "```sh":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            command = line.split(" #", 1)[0].strip()
            if command:
                current.append(command)
    return blocks


def test_the_page_has_the_two_blocks_this_test_runs() -> None:
    demo, first_job = shell_blocks(PAGE)
    assert demo == ["make demo"]
    assert first_job[0] == "source .venv/bin/activate"
    assert first_job[1] == "ffdl up"
    assert [shlex.split(command)[:2] for command in first_job[2:]] == [
        ["ffdl", "init"],
        ["ffdl", "train"],
        ["ffdl", "download"],
    ]


def reader_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FFDL_", "DLAAS_"))}
    env.update({"FFDL_HOME": str(tmp_path / "ffdl-home"), "FFDL_PORT": str(free_port())})
    return env


def bash(script: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_make_demo_trains_the_example_to_completion() -> None:
    (demo,) = shell_blocks(PAGE)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FFDL_", "DLAAS_"))}
    run = bash([demo], ROOT, env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"Final status\s+COMPLETED", run.stdout), run.stdout[-3000:]
    accuracy = re.search(r"Test accuracy\s+(0\.\d+)", run.stdout)
    assert accuracy is not None and float(accuracy.group(1)) > 0.9, run.stdout[-3000:]


@pytest.fixture
def platform_shell(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The page's first shell: ``source .venv/bin/activate`` then ``ffdl up``, in a
    directory holding only the project's ``.venv``."""
    first_job = shell_blocks(PAGE)[1]
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / ".venv").symlink_to(ROOT / ".venv")
    env = reader_env(tmp_path)
    log = open(tmp_path / "ffdl-up.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        ["bash", "-c", "\n".join(first_job[:2])],
        cwd=workdir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{env['FFDL_PORT']}"

    def up() -> bool:
        if server.poll() is not None:
            raise AssertionError((tmp_path / "ffdl-up.log").read_text()[-3000:])
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=60, what="ffdl up to answer /health")
        yield workdir, env
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


def test_the_first_job_runs_as_written(platform_shell: tuple[Path, dict[str, str]]) -> None:
    workdir, env = platform_shell
    activate, _up, init, train, download = shell_blocks(PAGE)[1]
    trained = bash([activate, init, train], workdir, env)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert (workdir / "mnist" / "manifest.yml").is_file()
    job_id = re.search(r"Model ID: (training-\S+)", trained.stdout)
    assert job_id is not None, trained.stdout[-3000:]
    assert "COMPLETED" in trained.stdout

    fetched = bash([activate, download.replace(PLACEHOLDER_ID, job_id.group(1))], workdir, env)
    assert fetched.returncode == 0, fetched.stderr
    assert (workdir / f"{job_id.group(1)}-trained-model.zip").stat().st_size > 0
