"""The embedded platform on a full disk: a submit that finds no room is a 507 with a clear
message, and leaves neither a job nor a file behind; with room again, submits work.

The platform's home is a small tmpfs, mounted for the test: it needs root, as CI runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.live import FAST_CONFIG, LiveServer, code_zip, manifest_yaml, serving

DISK = "16m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    assert os.geteuid() == 0, "mounting a small tmpfs for the platform's home needs root"
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0755", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert mounted.returncode == 0, f"cannot mount a tmpfs here: {mounted.stderr.strip()}"
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """A file taking all of ``disk``'s free space but ``leave`` bytes."""
    filler = disk / "filler"
    free = shutil.disk_usage(disk).free
    with filler.open("wb") as out:
        out.truncate(0)
        chunk = b"\0" * (1 << 20)
        left = free - leave
        while left > 0:
            left -= out.write(chunk[: min(len(chunk), left)])
    return filler


def test_a_submit_on_a_full_disk_is_507_and_leaves_nothing(small_disk: Path) -> None:
    home = small_disk / "home"
    server = LiveServer(home=home, config=dict(FAST_CONFIG))
    manifest = manifest_yaml("python train.py", gpus=0)
    # Random bytes do not compress: the archive is as large as the file.
    code = code_zip({"train.py": "print('hi')\n", "weights.txt": os.urandom(512 * 1024).hex()})
    with serving(server):
        filler = fill(small_disk, leave=256 * 1024)
        answer = server.client.post(
            "/v1/models",
            files={
                "manifest": ("manifest.yml", manifest.encode()),
                "model_definition": ("model.zip", code),
            },
        )
        assert answer.status_code == 507, answer.text
        body = answer.json()
        assert (body["code"], body["ffdl_code"]) == (507, "S507")
        assert body["description"].startswith("the platform's disk is full (")
        assert "nothing was stored" in body["description"]
        assert list((home / "jobs").iterdir()) == [], "no job directory, no partial archive"
        assert server.client.get("/v1/models").json()["total"] == 0

        filler.unlink()
        assert server.submit_ok(manifest, {"train.py": "print('hi')\n"})
        assert server.client.get("/v1/models").json()["total"] == 1
