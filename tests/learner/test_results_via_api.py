"""A whole job whose learner runs where the platform's disk is out of reach: its code comes
through the API, its results go back through it, its checkpoints to a shared store. A real
server (``remote_node``: the local backend, each learner moved as the Ray backend moves it
onto a node) and a real, unchanged controller."""

from __future__ import annotations

import io
import json
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for

TRAIN = """\
echo trained > "$RESULT_DIR/model.txt"
mkdir -p "$RESULT_DIR/nested" && echo deep > "$RESULT_DIR/nested/deep.txt"
ln -s /etc/hostname "$RESULT_DIR/host-file"
python -c "from ffdl.sdk.checkpoint import save_checkpoint; save_checkpoint(b'state', 1)"
echo "trained in $(pwd)"
"""


@dataclass
class NodeServer(LiveServer):
    """A ``LiveServer`` whose learners run as on a node with ``work_root`` of its own."""

    work_root: Path = field(default_factory=Path)
    checkpoints: Path = field(default_factory=Path)

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "tests.learner.remote_node", "--home", str(self.home)]
        argv += ["--port", str(self.port), "--work-root", str(self.work_root)]
        return [*argv, "--checkpoints", str(self.checkpoints)]


@pytest.fixture
def node_server(tmp_path: Path) -> Iterator[NodeServer]:
    checkpoints = tmp_path / "shared-checkpoints"
    checkpoints.mkdir()
    server = NodeServer(
        home=tmp_path / "home",
        config={**FAST_CONFIG, "sandbox": False},
        work_root=tmp_path / "node",
        checkpoints=checkpoints,
    )
    with serving(server) as live:
        yield live


def test_a_remote_learners_job_completes_with_its_results_downloadable(
    node_server: NodeServer,
) -> None:
    job_id = node_server.submit_ok(manifest_yaml("bash train.sh"), {"train.sh": TRAIN})

    node_server.wait_status(job_id, {"COMPLETED"}, timeout=90)

    response = node_server.client.get(f"/v1/models/{job_id}/trained_model")
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        files = {name: archive.read(name).decode() for name in archive.namelist()}
    assert files["model.txt"] == "trained\n"
    assert files["nested/deep.txt"] == "deep\n"
    node_job = node_server.work_root / "jobs" / job_id
    # The command ran in the node's copy of the code, fetched through the API ...
    assert (node_job / "code" / "train.sh").read_text() == TRAIN
    assert f"trained in {node_job / 'code'}" in files["logs/learner-1/training-log.txt"]
    # ... wrote its results there, and they reached the platform only through the API.
    assert (node_job / "results" / "model.txt").read_text() == "trained\n"
    platform_results = node_server.home / "jobs" / job_id / "results"
    assert (platform_results / "model.txt").read_text() == "trained\n"
    lines = [line["line"] for line in node_server.loglines(job_id)]
    assert any(line.startswith("[ffdl] storing results: ") for line in lines), lines
    # A link is never followed nor sent: the host's files stay on the host.
    assert "host-file" not in files
    assert "[ffdl] storing results: left out host-file: a link or special file is not copied" in (
        lines
    )
    # The learner's checkpoint is in the shared store, for an attempt on another node.
    stored = node_server.checkpoints / job_id / "_wml_checkpoints" / "ckpt-000000001.pt"
    wait_for(stored.exists, what="the checkpoint in the shared store")
    (spec_file,) = (node_job / "learners" / "1").glob("attempt-*/spec.json")
    assert json.loads(spec_file.read_text())["results_via_api"] is True
