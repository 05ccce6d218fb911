"""End-to-end test of the elastic digits example: rescaled 1 → 2 → 1 learners by a real
platform, it must train every epoch exactly once and match an uninterrupted run."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
import zipfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ffdl.sdk.batch_file import write_batch
from ffdl.sdk.context import DIRECTORY_VARIABLES
from tests.integration.live import FAST_CONFIG, LiveServer, serving, wait_for

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "elastic"
EPOCHS = 30
BASE_LR, BASE_BATCH = 2e-3, 64
ACCURACY_TOLERANCE = 0.01
# A parent process's platform variables must not leak into the baseline learner.
PLATFORM_VARIABLES = (
    "FFDL_EMETRICS_FILE",
    "FFDL_BATCH_SIZE",
    "FFDL_MICRO_BATCH_SIZE",
    "FFDL_ACCUMULATION_STEPS",
    "FFDL_GPUS",
    "WORLD_SIZE",
    "RANK",
)
CONFIG_LINE = re.compile(
    r"^config: learners=(?P<learners>\d+) batch=(?P<batch>\d+) "
    r"micro_batch=(?P<micro>\S+) steps=(?P<steps>\d+) lr=(?P<lr>\S+) "
    r"resumed_epoch=(?P<resumed>\d+)$"
)
REBATCH_LINE = re.compile(
    r"^rebatch: batch=(?P<batch>\d+) micro_batch=(?P<micro>\S+) steps=(?P<steps>\d+) "
    r"lr=(?P<lr>\S+) epoch=(?P<epoch>\d+)$"
)


def run_learner(
    root: Path, epochs: int = EPOCHS, told: dict[str, int] | None = None
) -> tuple[str, dict[str, Any]]:
    """Run train.py as a single learner would be started, outside the platform; with
    ``told``, write the batch its controller would write for it to take in place, once its
    first epoch has ended. Its output and its metrics.json."""
    directories = {name: root / sub for name, sub in DIRECTORY_VARIABLES.items()}
    for path in directories.values():
        path.mkdir(parents=True)
    environment = {k: v for k, v in os.environ.items() if k not in PLATFORM_VARIABLES}
    environment.update({name: str(path) for name, path in directories.items()})
    environment.update(
        {
            "TRAINING_ID": "training-baseline",
            "LEARNER_ID": "1",
            "NUM_LEARNERS": "1",
            "FFDL_BATCH_SIZE": str(BASE_BATCH),
            "FFDL_ATTEMPT": "1",
        }
    )
    learner = subprocess.Popen(
        [sys.executable, str(EXAMPLE_DIR / "train.py"), "--epochs", str(epochs)],
        env=environment,
        cwd=directories["MODEL_DIR"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert learner.stdout is not None
    output = []
    try:
        for line in learner.stdout:
            output.append(line)
            if told is not None and line.startswith("epoch 1/"):
                write_batch(directories["JOB_STATE_DIR"], 1, told)
        learner.wait(timeout=120)
    finally:
        learner.kill()
    text = "".join(output)
    assert learner.returncode == 0, text
    summary: dict[str, Any] = json.loads((directories["RESULT_DIR"] / "metrics.json").read_text())
    return text, summary


def run_baseline(root: Path) -> dict[str, Any]:
    """Train uninterrupted as a single learner would be started, and return metrics.json."""
    output, summary = run_learner(root)
    assert "config: learners=1 batch=64 micro_batch=- steps=1 lr=0.002 resumed_epoch=0" in output
    assert "rebatch:" not in output
    return summary


@pytest.fixture
def one_node_server(tmp_path: Path) -> Iterator[LiveServer]:
    config = {
        **FAST_CONFIG,
        "nodes": [{"name": "node-a", "gpus": 2, "cpus": 4, "memory": "16GiB", "gpu_type": "cpu"}],
        "autoscaler_interval_s": 0.5,
        # Only the user's scale requests resize the job; the autoscaler keeps it as it is.
        "min_rescale_interval_s": 3600,
        "halt_grace_s": 10,
    }
    with serving(LiveServer(home=tmp_path / "home", config=config)) as live:
        yield live


def post_example(server: LiveServer, manifest: bytes | None = None) -> httpx.Response:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as bundle:
        for path in sorted(EXAMPLE_DIR.iterdir()):
            if path.is_file() and path.suffix in {".py", ".md", ".yml"}:
                bundle.write(path, path.name)
    return server.client.post(
        "/v1/models",
        files={
            "manifest": (
                "manifest.yml",
                manifest or (EXAMPLE_DIR / "manifest.yml").read_bytes(),
                "application/x-yaml",
            ),
            "model_definition": ("model.zip", archive.getvalue(), "application/zip"),
        },
    )


def submit_example(server: LiveServer, manifest: bytes | None = None) -> str:
    response = post_example(server, manifest)
    assert response.status_code == 201, response.text
    return str(response.json()["model_id"])


def scale(server: LiveServer, job_id: str, gpus: int) -> None:
    response = server.client.patch(f"/v1/models/{job_id}", json={"gpus": gpus})
    assert response.status_code == 202, response.text


def metric_records(server: LiveServer, job_id: str, group: str) -> list[dict[str, Any]]:
    response = server.client.get(f"/v1/logs/{job_id}/emetrics", params={"pagesize": 10000})
    assert response.status_code == 200, response.text
    return [r for r in response.json()["models"] if r["grouplabel"] == group]


def trained_epochs(server: LiveServer, job_id: str) -> list[int]:
    return [int(r["etimes"]["iteration"]["value"]) for r in metric_records(server, job_id, "train")]


def last_epoch(server: LiveServer, job_id: str) -> int:
    return max(trained_epochs(server, job_id), default=0)


def config_lines(server: LiveServer, job_id: str) -> list[dict[str, str]]:
    found = []
    for item in server.loglines(job_id):
        match = CONFIG_LINE.match(item["line"])
        if match:
            found.append(match.groupdict())
    return found


def wait_learners(server: LiveServer, job_id: str, count: int) -> None:
    def processing_with_count() -> bool:
        model = server.model(job_id)
        status = model["training"]["training_status"]["status"]
        assert status not in {"FAILED", "CANCELLED", "COMPLETED"}, model["training"]
        return status == "PROCESSING" and len(model["learners"]) == count

    wait_for(processing_with_count, timeout=60, interval=0.1, what=f"{count} learners")


def wait_epoch(server: LiveServer, job_id: str, epoch: int) -> None:
    def reached() -> bool:
        status = server.status(job_id)
        assert status not in {"FAILED", "CANCELLED", "COMPLETED"}, server.model(job_id)
        return last_epoch(server, job_id) >= epoch

    wait_for(reached, timeout=60, interval=0.1, what=f"epoch {epoch}")


def _rescaled_run(server: LiveServer) -> str:
    """Run the example on one learner, then two, then one again, to its end; its job id."""
    job_id = submit_example(server)
    # Pinned at once, so that the job starts with one learner however idle the node is.
    scale(server, job_id, 1)
    wait_learners(server, job_id, 1)
    wait_epoch(server, job_id, 5)

    scale(server, job_id, 2)
    wait_learners(server, job_id, 2)
    wait_for(
        lambda: any(line["learners"] == "2" for line in config_lines(server, job_id)),
        timeout=60,
        what="the two-learner run to start",
    )
    resumed_on_two = int(config_lines(server, job_id)[-1]["resumed"])
    wait_epoch(server, job_id, resumed_on_two + 3)

    scale(server, job_id, 1)
    server.wait_status(job_id, {"COMPLETED"}, timeout=120)
    return job_id


@pytest.mark.slow
def test_rescaled_run_trains_each_epoch_once_and_matches_an_uninterrupted_one(
    tmp_path: Path, one_node_server: LiveServer
) -> None:
    # The uninterrupted run trains meanwhile: most of the platform's run is waits on restarts.
    with ThreadPoolExecutor(max_workers=1) as beside:
        uninterrupted = beside.submit(run_baseline, tmp_path / "baseline")
        job_id = _rescaled_run(one_node_server)
        baseline = uninterrupted.result()
    assert baseline["epochs"] == EPOCHS and baseline["final_learners"] == 1
    assert baseline["test_accuracy"] >= 0.95

    server = one_node_server
    starts = config_lines(server, job_id)
    learner_counts = [int(line["learners"]) for line in starts]
    # A job pinned by the user keeps its batch size too: the only restarts are the resizes.
    assert learner_counts == [1, 2, 1], starts
    resumed = [int(line["resumed"]) for line in starts]
    assert resumed[0] == 0 and resumed == sorted(resumed) and resumed[-1] < EPOCHS, starts
    first_on_two = learner_counts.index(2)
    last_on_one = len(learner_counts) - 1
    assert 0 < resumed[first_on_two] < resumed[last_on_one], starts
    for line in starts:
        assert 64 <= int(line["batch"]) <= 128, line
        # Each GPU's slice runs in micro-batches of at most elastic.local_batch_size.max.
        micro, steps = int(line["micro"]), int(line["steps"])
        assert micro <= 64 and micro * steps * int(line["learners"]) >= int(line["batch"]), line
        assert math.isclose(float(line["lr"]), BASE_LR * int(line["batch"]) / BASE_BATCH), line

    # The example declares its total, so the platform shows how far it came.
    progress = server.model(job_id)["progress"]
    assert (progress["epoch"], progress["total_epochs"]) == (EPOCHS, EPOCHS), progress

    epoch_counts = Counter(trained_epochs(server, job_id))
    assert sorted(epoch_counts) == list(range(1, EPOCHS + 1))
    assert set(epoch_counts.values()) == {1}, epoch_counts

    tests = metric_records(server, job_id, "test")
    assert len(tests) == 1
    accuracy = float(tests[0]["values"]["accuracy"]["value"])
    assert abs(accuracy - baseline["test_accuracy"]) <= ACCURACY_TOLERANCE, (
        accuracy,
        baseline["test_accuracy"],
    )

    response = server.client.get(f"/v1/models/{job_id}/trained_model")
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        summary = json.loads(archive.read("metrics.json"))
        assert "model.pt" in archive.namelist()
    assert summary["epochs"] == EPOCHS
    assert summary["final_learners"] == 1
    assert summary["test_accuracy"] == pytest.approx(accuracy)


def test_a_batch_past_the_gpus_memory_runs_as_accumulated_micro_batches(
    one_node_server: LiveServer,
) -> None:
    """Two learners of at most 8 samples each run the batch of 64 as 4 micro-batches of 8."""
    server = one_node_server
    manifest = yaml.safe_load((EXAMPLE_DIR / "manifest.yml").read_text())
    manifest["learners"] = 2
    manifest["framework"]["command"] = "python train.py --epochs 3"
    manifest["elastic"] = {
        "gpus": {"min": 2, "max": 2},
        "batch_size": {"min": 64, "max": 64},
        "local_batch_size": {"min": 1, "max": 8},
        "accumulate_gradients": True,
    }
    job_id = submit_example(server, yaml.safe_dump(manifest).encode())
    server.wait_status(job_id, {"COMPLETED"}, timeout=120)

    starts = config_lines(server, job_id)
    assert [(s["learners"], s["batch"], s["micro"], s["steps"]) for s in starts] == [
        ("2", "64", "8", "4")
    ], starts
    accuracy = float(metric_records(server, job_id, "test")[0]["values"]["accuracy"]["value"])
    assert accuracy >= 0.9, accuracy

    # Without accumulation the same limits cannot hold that batch: refused, naming the field.
    del manifest["elastic"]["accumulate_gradients"]
    response = post_example(server, yaml.safe_dump(manifest).encode())
    assert response.status_code == 400, response.text
    assert "elastic.local_batch_size" in response.text
    assert "accumulate_gradients: true" in response.text


def test_a_batch_told_in_place_is_taken_at_the_next_epoch(tmp_path: Path) -> None:
    """The batch a controller writes for the attempt (``elastic.rebatch_in_place``; the
    platform's side is tested in tests/integration/test_elastic.py) is what the example
    trains its next epoch with, split into the micro-batches it names, its learning rate
    scaled with it."""
    told = {"batch_size": 128, "micro_batch_size": 32, "accumulation_steps": 2}
    output, summary = run_learner(tmp_path, epochs=6, told=told)
    assert "config: learners=1 batch=64 micro_batch=- steps=1 lr=0.002 resumed_epoch=0" in output
    rebatches = [m.groupdict() for line in output.splitlines() if (m := REBATCH_LINE.match(line))]
    assert len(rebatches) == 1, output
    assert {k: v for k, v in rebatches[0].items() if k != "epoch"} == {
        "batch": "128",
        "micro": "32",
        "steps": "2",
        "lr": "0.004",
    }, output
    # Taken at an epoch boundary after the first, and every epoch still trained once.
    assert 2 <= int(rebatches[0]["epoch"]) <= 6, output
    assert [int(n) for n in re.findall(r"^epoch (\d+)/6 ", output, re.M)] == [1, 2, 3, 4, 5, 6]
    assert summary["epochs"] == 6
