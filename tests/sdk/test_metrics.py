"""Tests for the emetrics file: line shape, file location, validation, concurrent writers."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ffdl.sdk.api import report


@pytest.fixture
def log_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    directory = tmp_path / "logs"
    monkeypatch.delenv("FFDL_EMETRICS_FILE", raising=False)
    monkeypatch.setenv("LOG_DIR", str(directory))
    return directory


def read_lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_report_appends_one_line_with_the_exact_shape(log_dir: Path) -> None:
    before = time.time()
    report(step=3, samples=192, loss=0.25, accuracy=1)
    after = time.time()

    (record,) = read_lines(log_dir / "emetrics.jsonl")
    assert list(record) == ["time", "group", "iteration", "samples", "values"]
    assert before <= record["time"] <= after
    assert record["group"] == "train"
    assert record["iteration"] == 3
    assert record["samples"] == 192
    assert record["values"] == {"loss": 0.25, "accuracy": 1.0}
    assert isinstance(record["values"]["accuracy"], float)


def test_successive_reports_append_in_order(log_dir: Path) -> None:
    report(step=1, loss=0.5)
    report(group="test", accuracy=0.97)

    first, second = read_lines(log_dir / "emetrics.jsonl")
    assert (first["group"], first["iteration"], first["values"]) == ("train", 1, {"loss": 0.5})
    assert second["group"] == "test"
    assert second["iteration"] is None
    assert second["samples"] is None
    assert second["values"] == {"accuracy": 0.97}


def test_emetrics_file_variable_overrides_log_dir(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    explicit = tmp_path / "elsewhere" / "metrics.jsonl"
    monkeypatch.setenv("FFDL_EMETRICS_FILE", str(explicit))

    report(step=7, loss=0.1)

    assert [record["iteration"] for record in read_lines(explicit)] == [7]
    assert not log_dir.exists()


def test_local_default_is_under_ffdl_local(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FFDL_EMETRICS_FILE", raising=False)
    monkeypatch.delenv("LOG_DIR", raising=False)
    monkeypatch.chdir(tmp_path)

    report(step=0, loss=2.3)

    assert len(read_lines(tmp_path / "ffdl-local" / "logs" / "emetrics.jsonl")) == 1


def test_numpy_and_tensor_scalars_are_accepted(log_dir: Path) -> None:
    numpy = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")

    report(step=1, loss=numpy.float32(0.5), accuracy=torch.tensor(0.75))

    (record,) = read_lines(log_dir / "emetrics.jsonl")
    assert record["values"] == {"loss": 0.5, "accuracy": 0.75}


@pytest.mark.parametrize(
    "bad_value", [math.nan, math.inf, -math.inf, "0.5", None, True, [1.0], b"1"]
)
def test_non_finite_or_non_numeric_values_are_rejected_naming_the_metric(
    log_dir: Path, bad_value: object
) -> None:
    with pytest.raises(ValueError, match="val_loss"):
        report(step=1, loss=0.5, val_loss=bad_value)  # type: ignore[arg-type]

    assert not (log_dir / "emetrics.jsonl").exists(), "a rejected report writes nothing"


def test_multi_element_tensor_is_rejected_naming_the_metric(log_dir: Path) -> None:
    torch = pytest.importorskip("torch")

    with pytest.raises(ValueError, match="loss"):
        report(step=1, loss=torch.ones(3))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"step": -1}, "step"),
        ({"step": 1.5}, "step"),
        ({"step": True}, "step"),
        ({"samples": -5}, "samples"),
        ({"group": ""}, "group"),
    ],
)
def test_invalid_step_samples_or_group_are_rejected(
    log_dir: Path, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        report(loss=0.5, **arguments)


def test_concurrent_reports_never_interleave(log_dir: Path) -> None:
    threads_count, reports_per_thread = 8, 200
    start = threading.Barrier(threads_count)

    def writer(thread_index: int) -> None:
        start.wait()
        for step in range(reports_per_thread):
            report(step=step, group=f"worker-{thread_index}", value=float(step), padding=1.0)

    threads = [threading.Thread(target=writer, args=(index,)) for index in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()

    records = read_lines(log_dir / "emetrics.jsonl")
    assert len(records) == threads_count * reports_per_thread
    for index in range(threads_count):
        steps = [r["iteration"] for r in records if r["group"] == f"worker-{index}"]
        assert steps == list(range(reports_per_thread))
