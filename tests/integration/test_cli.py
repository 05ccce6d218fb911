"""The ``ffdl`` command as a user runs it, against a real server."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx

from tests.integration.live import LiveServer, manifest_yaml


def ffdl(
    server: LiveServer,
    *args: str,
    cwd: Path | None = None,
    token: str | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FFDL_")}
    env["FFDL_CONFIG"] = str(server.home / "client.json")
    env["COLUMNS"] = "250"
    if token is not None:
        env["FFDL_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "ffdl.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def _project(tmp_path: Path) -> tuple[Path, Path]:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import os, pathlib\n"
        "print('hello from the cli job')\n"
        "pathlib.Path(os.environ['RESULT_DIR'], 'weights.bin').write_bytes(b'w')\n"
    )
    manifest = tmp_path / "manifest.yml"
    manifest.write_text(manifest_yaml("python train.py", name="cli-job"))
    return manifest, code


def test_train_follow_list_show_logs_download(server: LiveServer, tmp_path: Path) -> None:
    manifest, code = _project(tmp_path)
    run = ffdl(server, "train", str(manifest), str(code), "--follow")
    assert run.returncode == 0, run.stderr
    assert "Model ID: training-" in run.stdout
    assert "hello from the cli job" in run.stdout
    model_id = run.stdout.split("Model ID: ")[1].split()[0]

    listing = ffdl(server, "list")
    assert model_id in listing.stdout and "COMPLETED" in listing.stdout
    shown = ffdl(server, "show", model_id)
    assert "COMPLETED" in shown.stdout
    logs = ffdl(server, "logs", model_id)
    assert "hello from the cli job" in logs.stdout
    got = ffdl(server, "download", model_id, "--trained-model", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    with zipfile.ZipFile(tmp_path / f"{model_id}-trained-model.zip") as archive:
        assert archive.read("weights.bin") == b"w"


def test_errors_are_one_line_without_traceback(server: LiveServer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("name: x\nlearners: -1\nframework: {name: custom, command: 'true'}\n")
    code = tmp_path / "code"
    code.mkdir()
    run = ffdl(server, "train", str(bad), str(code))
    assert run.returncode == 1
    assert "C104" in run.stderr and "learners" in run.stderr
    assert "Traceback" not in run.stderr
    missing = ffdl(server, "show", "training-nope")
    assert missing.returncode == 1 and "C404" in missing.stderr


def test_tenants_are_isolated_and_nodes_show_holders(server: LiveServer, tmp_path: Path) -> None:
    created = ffdl(server, "tenant", "create", "team-b", "--max-jobs", "2")
    assert created.returncode == 0, created.stderr
    user = ffdl(server, "tenant", "add-user", "team-b", "bob")
    assert user.returncode == 0, user.stderr
    bob = user.stdout.split("Token: ")[1].strip()

    admin_job = server.submit_ok(manifest_yaml("python -c 'import time; time.sleep(30)'"))
    server.wait_status(admin_job, {"PROCESSING"})
    as_bob = httpx.get(
        f"{server.url}/v1/models/{admin_job}", headers={"Authorization": f"Bearer {bob}"}
    )
    assert as_bob.status_code == 404
    assert ffdl(server, "list", token=bob).stdout.strip() == "No models."
    denied = ffdl(server, "tenant", "create", "team-c", token=bob)
    assert denied.returncode == 1 and "admin" in denied.stderr

    nodes = ffdl(server, "nodes")
    assert nodes.returncode == 0, nodes.stderr
    holder = next(line for line in nodes.stdout.splitlines() if admin_job in line)
    assert holder.split()[0] == "node-a" and "PROCESSING" in holder, nodes.stdout
    tenants = ffdl(server, "tenant", "list")
    assert "team-b" in tenants.stdout
    server.client.delete(f"/v1/models/{admin_job}")
