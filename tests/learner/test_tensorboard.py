"""TensorBoard event files as evaluation metrics: both writers' scalars, incremental reads,
no duplicates, and a job's links and special files left unread."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.summary import Writer

from ffdl.learner.metrics import EMetric
from ffdl.learner.tensorboard import MetricsDirError, TensorBoardReader, resolve_dir
from tests.late_imports import summary_writer

from .test_recording_api import wait_until


class Collected:
    def __init__(self) -> None:
        self.metrics: list[EMetric] = []
        self.problems: list[str] = []

    def metric(self, metric: EMetric) -> None:
        self.metrics.append(metric)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def steps(self, group: str) -> list[int | None]:
        return [m.iteration for m in self.metrics if m.group == group]


def reader_for(
    directory: Path, seen: Collected, *, skip_existing: bool = False
) -> TensorBoardReader:
    return TensorBoardReader(
        str(directory.parent),
        str(directory),
        seen.metric,
        seen.problem,
        poll_s=0.05,
        skip_existing=skip_existing,
    )


def test_torch_summary_writer_scalars_become_one_metric_per_run_and_step(tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    for run, offset in (("train", 0.0), ("test", 0.5)):
        writer = summary_writer(tb / run)
        for step in (1, 2, 3):
            writer.add_scalar("loss", 1.0 / step + offset, step)
            writer.add_scalar("accuracy", step / 10, step)
        writer.close()
    seen = Collected()
    reader = reader_for(tb, seen)
    reader.poll(final=True)
    reader.close()
    assert seen.problems == []
    assert seen.steps("train") == [1, 2, 3] and seen.steps("test") == [1, 2, 3]
    train = [m for m in seen.metrics if m.group == "train"]
    assert train[1].values == pytest.approx({"loss": 0.5, "accuracy": 0.2})
    assert all(m.time is not None and m.time > 1.6e9 for m in seen.metrics)
    times = [m.time or 0.0 for m in seen.metrics]
    assert times == sorted(times)
    assert reader.reported == 6


def test_tensor_scalars_of_the_tensorboard_writer_are_read_after_their_first_metadata(
    tmp_path: Path,
) -> None:
    # tensorboard.summary.Writer writes TF2-style tensors, and a tag's plugin only once.
    tb = tmp_path / "tb"
    writer = Writer(str(tb))
    for step in range(5):
        writer.add_scalar("eval/f1", step / 4, step, wall_time=1_800_000_000.0 + step)
    writer.flush()
    # Tensor scalars of torch's "new style" sit beside them in another run.
    torch_writer = summary_writer(tb / "torch")
    torch_writer.add_scalar("lr", 0.125, 7, new_style=True)
    torch_writer.close()
    seen = Collected()
    reader = reader_for(tb, seen)
    reader.poll(final=True)
    reader.close()
    # Event files directly in the directory form a run named after it, as in FfDL.
    assert seen.steps("tb") == [0, 1, 2, 3, 4]
    assert [m.values["eval/f1"] for m in seen.metrics if m.group == "tb"] == [
        0.0,
        0.25,
        0.5,
        0.75,
        1.0,
    ]
    assert next(m.time for m in seen.metrics if m.group == "tb") == 1_800_000_000.0
    assert [(m.iteration, m.values) for m in seen.metrics if m.group == "torch"] == [
        (7, {"lr": 0.125})
    ]


def test_incremental_reads_report_each_step_once_and_in_order(tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    writer = summary_writer(tb / "train")
    seen = Collected()
    reader = reader_for(tb, seen)
    reader.poll()
    assert seen.metrics == [] and reader.dir_found

    writer.add_scalar("loss", 1.0, 1)
    writer.add_scalar("loss", 0.5, 2)
    writer.add_scalar("acc", 0.2, 2)
    writer.flush()
    reader.poll()
    # Step 2 may still gain tags: it is held while its run is being written.
    assert seen.steps("train") == [1]
    reader.poll()  # nothing new in the run: its step is complete
    assert seen.steps("train") == [1, 2]
    assert seen.metrics[1].values == {"loss": 0.5, "acc": pytest.approx(0.2)}

    writer.add_scalar("loss", 0.25, 3)
    writer.flush()
    reader.poll()
    reader.poll()
    reader.poll(final=True)
    writer.close()
    reader.poll(final=True)
    reader.close()
    assert seen.steps("train") == [1, 2, 3]
    assert seen.problems == []


def test_the_same_tag_again_at_one_step_is_a_new_measurement(tmp_path: Path) -> None:
    writer = summary_writer(tmp_path / "tb")
    for value in (3.0, 2.0, 1.0):
        writer.add_scalar("loss", value)  # no step given: every value at step 0
    writer.close()
    seen = Collected()
    reader = reader_for(tmp_path / "tb", seen)
    reader.poll(final=True)
    reader.close()
    assert [m.values["loss"] for m in seen.metrics] == [3.0, 2.0, 1.0]


def test_a_resumed_attempt_skips_what_an_earlier_one_wrote(tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    first = summary_writer(tb / "train")
    for step in (1, 2):
        first.add_scalar("loss", 1.0 / step, step)
    first.close()
    seen = Collected()
    reader = reader_for(tb, seen, skip_existing=True)
    reader.start()
    second = summary_writer(tb / "train", filename_suffix=".resumed")
    second.add_scalar("loss", 0.3, 3)
    second.close()
    reader.stop()
    assert seen.steps("train") == [3]


def test_a_reader_thread_reports_while_the_job_writes(tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    seen = Collected()
    reader = reader_for(tb, seen)
    reader.start()
    writer = summary_writer(tb / "train")
    writer.add_scalar("loss", 1.0, 1)
    writer.flush()
    wait_until(lambda: seen.metrics, what="a flushed step reported while the job runs")
    writer.add_scalar("loss", 0.5, 2)
    writer.close()
    reader.stop()
    assert seen.steps("train") == [1, 2]


def test_links_and_special_files_are_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere"
    writer = summary_writer(secret)
    writer.add_scalar("secret", 42.0, 1)
    writer.close()
    (secret_file,) = secret.iterdir()
    tb = tmp_path / "tb"
    honest = summary_writer(tb / "train")
    honest.add_scalar("loss", 1.0, 1)
    honest.close()
    (tb / "linked-run").symlink_to(secret)
    (tb / "train" / "events.out.tfevents.0.planted").symlink_to(secret_file)
    os.mkfifo(tb / "train" / "events.out.tfevents.1.fifo")
    seen = Collected()
    reader = reader_for(tb, seen)
    reader.poll(final=True)
    reader.close()
    assert [(m.group, m.values) for m in seen.metrics] == [("train", {"loss": 1.0})]
    assert any("linked-run is a symbolic link" in p for p in seen.problems)
    assert any("planted is a symbolic link" in p for p in seen.problems)
    assert any("fifo is not a regular file" in p for p in seen.problems)


def test_a_metrics_directory_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere"
    writer = summary_writer(secret)
    writer.add_scalar("secret", 42.0, 1)
    writer.close()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "tb").symlink_to(secret)
    seen = Collected()
    reader = TensorBoardReader(str(logs), str(logs / "tb"), seen.metric, seen.problem)
    reader.poll(final=True)
    assert seen.metrics == []
    assert any("is a symbolic link or not a directory" in p for p in seen.problems)
    assert "no TensorBoard directory" in reader.nothing_found()


def test_a_value_that_is_not_finite_is_dropped_alone(tmp_path: Path) -> None:
    writer = summary_writer(tmp_path / "tb")
    writer.add_scalar("loss", float("nan"), 1)
    writer.add_scalar("acc", 0.5, 1)
    writer.close()
    seen = Collected()
    reader = reader_for(tmp_path / "tb", seen)
    reader.poll(final=True)
    reader.close()
    assert [(m.iteration, m.values) for m in seen.metrics] == [(1, {"acc": 0.5})]
    assert any("'loss'" in p and "nan" in p for p in seen.problems)


def test_nothing_found_names_where_the_reader_looked(tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    seen = Collected()
    reader = reader_for(tb, seen)
    reader.poll(final=True)
    assert reader.nothing_found() == f"no TensorBoard directory {tb}"
    tb.mkdir()
    (tb / "notes.txt").write_text("no events here")
    reader.poll(final=True)
    assert reader.nothing_found() == f"no TensorBoard event files (*tfevents*) in {tb}"


ENV = {
    "JOB_STATE_DIR": "/jobs/j1/state",
    "LOG_DIR": "/jobs/j1/state/logs",
    "RESULT_DIR": "/jobs/j1/results",
}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("$JOB_STATE_DIR/logs/tb", ("/jobs/j1/state", "/jobs/j1/state/logs/tb")),
        ("${JOB_STATE_DIR}/logs/tb/test", ("/jobs/j1/state", "/jobs/j1/state/logs/tb/test")),
        (None, ("/jobs/j1/state", "/jobs/j1/state/logs/tb")),
        ("runs", ("/jobs/j1/state", "/jobs/j1/state/logs/runs")),
        ("$RESULT_DIR/tb/", ("/jobs/j1/results", "/jobs/j1/results/tb")),
    ],
)
def test_metrics_directory_is_expanded_against_the_learner_environment(
    raw: str | None, expected: tuple[str, str]
) -> None:
    anchor, directory = expected
    assert resolve_dir(raw, ENV) == (anchor, directory, directory)


def test_metrics_directory_maps_to_where_the_controller_finds_it() -> None:
    def to_host(path: str) -> str:
        inside = "/jobs/j1/state/logs"
        return "/host/logs/learner-1" + path[len(inside) :] if path.startswith(inside) else path

    assert resolve_dir("$LOG_DIR/tb", ENV, to_host) == (
        "/host/logs/learner-1",
        "/host/logs/learner-1/tb",
        "/jobs/j1/state/logs/tb",
    )


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("$JOB_STATE_DIR/../../other/tb", "is not inside the job's"),
        ("/etc", "is not inside the job's"),
        ("$HOME/tb", "names $HOME, which the learner does not have"),
    ],
)
def test_metrics_directory_outside_the_job_is_refused(raw: str, why: str) -> None:
    with pytest.raises(MetricsDirError, match=why.replace("$", r"\$")):
        resolve_dir(raw, ENV)


def test_an_event_file_the_reader_chokes_on_is_named_once_and_dropped(tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    honest = summary_writer(tb / "train")
    honest.add_scalar("loss", 1.0, 1)
    honest.close()
    # A record header claiming a terabyte, with a valid checksum: the reader cannot hold it.
    header = struct.pack("<Q", 2**40)
    (tb / "train" / "events.out.tfevents.9.huge").write_bytes(
        header + struct.pack("<I", masked_crc32c(header)) + b"x" * 100
    )
    seen = Collected()
    reader = reader_for(tb, seen)
    for _ in range(3):
        reader.poll()
    reader.poll(final=True)
    reader.close()
    assert [(m.group, m.values) for m in seen.metrics] == [("train", {"loss": 1.0})]
    (complaint,) = seen.problems
    assert "events.out.tfevents.9.huge" in complaint and "no longer read" in complaint
