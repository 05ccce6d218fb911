"""A learner's metric sources by manifest type: the TensorBoard directory each learner reads,
the host path it finds it at, and the line that says when a type found nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ffdl.learner.metric_sources import MetricSources
from ffdl.learner.metrics import EMetric
from ffdl.learner.spec import LearnerSpec
from tests.late_imports import summary_writer


def spec_for(tmp_path: Path, learner: int = 1, **changes: Any) -> LearnerSpec:
    """A learner whose command sees its logs at $JOB_STATE_DIR/logs while the controller
    finds them at logs/learner-N, as the sandbox binds them."""
    state = tmp_path / "state"
    host_logs = tmp_path / "logs" / f"learner-{learner}"
    host_logs.mkdir(parents=True)
    state.mkdir(exist_ok=True)
    fields: dict[str, Any] = {
        "training_id": "job-1",
        "learner": learner,
        "num_learners": 2,
        "attempt": 0,
        "api_url": "http://127.0.0.1:1",
        "job_token": "t",
        "command": "true",
        "workdir": str(tmp_path),
        "env": {"JOB_STATE_DIR": str(state), "LOG_DIR": str(state / "logs")},
        "data": [],
        "results_source": None,
        "results_target": None,
        "emetrics_file": None,
        "metric_groups": {},
        "state_dir": str(tmp_path / "controller"),
        "log_dir": str(host_logs),
        "metrics_type": "tensorboard",
        "metrics_in": "$JOB_STATE_DIR/logs/tb",
    }
    fields.update(changes)
    return LearnerSpec(**fields)


class Seen:
    def __init__(self) -> None:
        self.metrics: list[EMetric] = []
        self.lines: list[str] = []


def sources_for(spec: LearnerSpec, seen: Seen) -> MetricSources:
    return MetricSources(spec, seen.metrics.append, seen.lines.append)


def test_each_learner_reads_the_event_files_under_its_own_log_dir(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, learner=2)
    seen = Seen()
    sources = sources_for(spec, seen)
    sources.start()
    writer = summary_writer(tmp_path / "logs" / "learner-2" / "tb" / "train")
    writer.add_scalar("loss", 0.5, 4)
    writer.close()
    sources.stop()
    assert [(m.group, m.iteration, m.values) for m in seen.metrics] == [("train", 4, {"loss": 0.5})]
    # The job's own name for the directory, not the controller's.
    assert seen.lines == [
        f"evaluation metrics (tensorboard): reading scalars from {tmp_path}/state/logs/tb"
    ]


def test_a_directory_shared_by_the_learners_is_read_by_the_first_only(tmp_path: Path) -> None:
    seen = Seen()
    sources = sources_for(spec_for(tmp_path, learner=2, metrics_in="$JOB_STATE_DIR/tb"), seen)
    sources.start()
    sources.stop()
    assert seen.lines == [
        f"evaluation metrics (tensorboard): {tmp_path}/state/tb is shared; learner 1 reads it"
    ]


def test_a_directory_outside_the_job_is_named_and_not_read(tmp_path: Path) -> None:
    seen = Seen()
    sources = sources_for(spec_for(tmp_path, metrics_in="$HOME/tb"), seen)
    sources.start()
    sources.stop()
    assert len(seen.lines) == 1
    assert "names $HOME, which the learner does not have; no metrics are read" in seen.lines[0]


def test_nothing_found_is_said_once_with_where_the_reader_looked(tmp_path: Path) -> None:
    seen = Seen()
    sources = sources_for(spec_for(tmp_path), seen)
    sources.start()
    (tmp_path / "logs" / "learner-1" / "tb").mkdir()
    sources.stop()
    assert seen.lines[-1] == (
        "evaluation metrics (tensorboard): no TensorBoard event files (*tfevents*) in "
        f"{tmp_path}/state/logs/tb"
    )


def test_regex_groups_apply_whatever_the_type_and_only_regex_extractor_must_match(
    tmp_path: Path,
) -> None:
    groups = {"train": {"regex": r"loss=(?P<loss>\S+)", "scalars": {"loss": "$loss"}}}
    for kind, said in (("regex_extractor", True), ("log_collector", False)):
        seen = Seen()
        spec = spec_for(tmp_path / kind, metrics_type=kind, metric_groups=groups)
        sources = sources_for(spec, seen)
        sources.start()
        assert sources.feed("epoch 1") == []
        sources.stop()
        expected = [
            "evaluation metrics (regex_extractor): no output line matched the groups 'train'"
        ]
        assert seen.lines == (expected if said else [])
        assert sources.feed("loss=0.5") == [EMetric("train", None, {"loss": 0.5})]
