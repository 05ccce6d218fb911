"""End-to-end tests of the digits example run as a learner would run it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ffdl.sdk.context import DIRECTORY_VARIABLES

TRAIN_SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "digits" / "train.py"
INHERITED_SDK_VARIABLES = ("FFDL_EMETRICS_FILE", "FFDL_BATCH_SIZE", "FFDL_GPUS")


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def job_dirs(tmp_path: Path) -> dict[str, Path]:
    directories = {name: tmp_path / sub for name, sub in DIRECTORY_VARIABLES.items()}
    directories["DATA_DIR"].mkdir()
    return directories


def learner_environment(job_dirs: dict[str, Path]) -> dict[str, str]:
    environment = {
        name: value for name, value in os.environ.items() if name not in INHERITED_SDK_VARIABLES
    }
    environment.update({name: str(path) for name, path in job_dirs.items()})
    environment.update({"TRAINING_ID": "training-digits", "LEARNER_ID": "1", "NUM_LEARNERS": "1"})
    return environment


def run_training(job_dirs: dict[str, Path], epochs: int) -> str:
    completed = subprocess.run(
        [sys.executable, str(TRAIN_SCRIPT), "--epochs", str(epochs)],
        env=learner_environment(job_dirs),
        cwd=job_dirs["RESULT_DIR"].parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def emetrics(job_dirs: dict[str, Path]) -> list[dict[str, Any]]:
    text = (job_dirs["LOG_DIR"] / "emetrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def checkpoint_names(job_dirs: dict[str, Path]) -> list[str]:
    return sorted(path.name for path in job_dirs["CHECKPOINT_DIR"].glob("ckpt-*.pt"))


@pytest.mark.slow
def test_full_run_reaches_95_percent_and_writes_every_output(job_dirs: dict[str, Path]) -> None:
    stdout = run_training(job_dirs, epochs=15)

    assert "data: scikit-learn bundled digits (1797 samples)" in stdout
    epoch_lines = re.findall(r"^epoch (\d+)/15 loss \d+\.\d{4} accuracy \d\.\d{4}$", stdout, re.M)
    assert epoch_lines == [str(epoch) for epoch in range(1, 16)]
    printed_accuracy = re.search(r"^test accuracy: (\d\.\d{4})$", stdout, re.M)
    assert printed_accuracy is not None

    summary = json.loads((job_dirs["RESULT_DIR"] / "metrics.json").read_text())
    assert summary["epochs"] == 15
    assert summary["test_accuracy"] >= 0.95
    assert printed_accuracy.group(1) == f"{summary['test_accuracy']:.4f}"

    import torch

    state_dict = torch.load(job_dirs["RESULT_DIR"] / "model.pt", weights_only=True)
    assert any(name.endswith("weight") for name in state_dict)

    records = emetrics(job_dirs)
    assert len(records) == 16
    assert [(r["group"], r["iteration"]) for r in records[:15]] == [
        ("train", epoch) for epoch in range(1, 16)
    ]
    assert all(set(r["values"]) == {"loss", "accuracy"} for r in records[:15])
    # Each epoch declares the total, so the platform can show progress and time left.
    assert [(r["epoch"], r["total_epochs"]) for r in records[:15]] == [
        (epoch, 15) for epoch in range(1, 16)
    ]
    assert records[15]["group"] == "test"
    assert records[15]["values"] == {"accuracy": summary["test_accuracy"]}

    assert checkpoint_names(job_dirs) == [f"ckpt-{epoch:09d}.pt" for epoch in (13, 14, 15)]


@pytest.mark.slow
def test_halt_checkpoints_and_exits_zero_then_a_restart_resumes(
    job_dirs: dict[str, Path],
) -> None:
    import numpy
    from sklearn.datasets import load_digits

    bundled = load_digits()
    staged = job_dirs["DATA_DIR"] / "digits.npz"
    numpy.savez(staged, images=bundled.images, target=bundled.target)
    log_file = job_dirs["DATA_DIR"].parent / "first-run.log"

    # Far more epochs than can finish before the halt, so the halt always lands mid-run.
    with log_file.open("w") as log:
        first_run = subprocess.Popen(
            [sys.executable, str(TRAIN_SCRIPT), "--epochs", "1000"],
            env=learner_environment(job_dirs),
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_for(
                lambda: bool(checkpoint_names(job_dirs)) or first_run.poll() is not None,
                90,
                "the first checkpoint",
            )
            assert first_run.poll() is None, log_file.read_text()
            first_run.send_signal(signal.SIGTERM)
            first_run.wait(timeout=60)
        finally:
            if first_run.poll() is None:
                first_run.kill()
                first_run.wait()
    first_output = log_file.read_text()

    assert first_run.returncode == 0, first_output
    assert f"data: {staged} (1797 samples)" in first_output
    halted = re.search(r"^halt requested: checkpoint saved at epoch (\d+)$", first_output, re.M)
    assert halted is not None, first_output
    halted_epoch = int(halted.group(1))
    assert halted_epoch >= 1
    assert not (job_dirs["RESULT_DIR"] / "metrics.json").exists()

    second_output = run_training(job_dirs, epochs=halted_epoch + 2)

    resumed = re.search(r"^resumed from epoch (\d+)$", second_output, re.M)
    assert resumed is not None, second_output
    assert int(resumed.group(1)) == halted_epoch
    epochs_trained = re.findall(r"^epoch (\d+)/", second_output, re.M)
    assert epochs_trained == [str(halted_epoch + 1), str(halted_epoch + 2)]
    assert "test accuracy: " in second_output
    summary = json.loads((job_dirs["RESULT_DIR"] / "metrics.json").read_text())
    assert summary["epochs"] == halted_epoch + 2
    assert (job_dirs["RESULT_DIR"] / "model.pt").is_file()
