"""The manifest's ``evaluation_metrics``: FfDL's metric types and their spellings, typed and
short scalars, FfDL's regex dialect, and clear refusals naming what the user wrote."""

from __future__ import annotations

from typing import Any

import pytest

from ffdl.core.errors import ManifestError
from ffdl.core.manifest import EvaluationMetrics, Manifest, MetricValue, parse_manifest

BASE: dict[str, Any] = {
    "name": "metrics",
    "framework": {"name": "tensorflow", "version": "1.5", "command": "python train.py"},
}


def metrics_of(evaluation_metrics: dict[str, Any]) -> EvaluationMetrics:
    manifest = parse_manifest({**BASE, "evaluation_metrics": evaluation_metrics})
    assert manifest.evaluation_metrics is not None
    return manifest.evaluation_metrics


def refusal(evaluation_metrics: dict[str, Any]) -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        parse_manifest({**BASE, "evaluation_metrics": evaluation_metrics})
    return caught.value


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("emetrics", "emetrics"),
        ("regex_extractor", "regex_extractor"),
        ("tensorboard", "tensorboard"),
        ("TensorBoard", "tensorboard"),
        ("tensorboard_extractor", "tensorboard"),
        ("emetrics_file", "emetrics"),
        ("optivist", "emetrics"),
        ("file", "emetrics"),
        ("log_collector", "log_collector"),
        ("logger", "log_collector"),
        ("none", "log_collector"),
    ],
)
def test_ffdl_metric_types_and_their_spellings_are_accepted(written: str, meant: str) -> None:
    groups = {"g": {"regex": "loss=(?P<loss>\\S+)", "scalars": {"loss": "$loss"}}}
    assert metrics_of({"type": written, "groups": groups}).type == meant


def test_an_unknown_type_names_what_was_written_and_what_is_accepted() -> None:
    error = refusal({"type": "prometheus"})
    assert error.field == "evaluation_metrics.type"
    assert error.code == "C101"
    assert "'prometheus'" in error.reason
    for accepted in ("emetrics", "regex_extractor", "tensorboard", "emetrics_file"):
        assert accepted in error.reason


def test_typed_and_short_scalars_mean_the_same() -> None:
    typed = metrics_of(
        {
            "type": "regex_extractor",
            "groups": {
                "train": {
                    "regex": r"step (?P<step>\d+) acc=(?P<acc>[0-9.]+)",
                    "scalars": {"accuracy": {"type": "FLOAT", "value": "$acc"}},
                    "etimes": {"iteration": {"type": "INT", "value": "$step"}},
                }
            },
        }
    )
    short = metrics_of(
        {
            "type": "regex_extractor",
            "groups": {
                "train": {
                    "regex": r"step (?P<step>\d+) acc=(?P<acc>[0-9.]+)",
                    "scalars": {"accuracy": "$acc"},
                    "etimes": {"iteration": "$step"},
                }
            },
        }
    )
    assert typed == short
    group = typed.groups["train"]
    assert group.scalars == {"accuracy": MetricValue(type="FLOAT", value="$acc")}
    assert group.etimes == {"iteration": MetricValue(type="INT", value="$step")}


def test_value_types_are_read_without_case_and_a_typed_value_may_omit_its_type() -> None:
    group = metrics_of(
        {
            "groups": {
                "g": {
                    "regex": r"n=(?P<n>\d+) s=(?P<s>\S+)",
                    "scalars": {"count": {"type": "int", "value": "$n"}, "s": {"value": "$s"}},
                    "meta": {"time": "$timestamp", "subid": "1"},
                }
            }
        }
    ).groups["g"]
    assert group.scalars["count"].type == "INT"
    assert group.scalars["s"].type == "FLOAT"
    assert group.meta == {"time": "$timestamp", "subid": "1"}


def test_ffdl_pattern_library_and_go_group_names_are_accepted() -> None:
    group = metrics_of(
        {
            "type": "regex_extractor",
            "groups": {
                "caffe": {
                    "regex": r"Iteration %{INT:iter}, loss = %{FLOAT:loss} \((?<n>\d+)\)",
                    "scalars": {"loss": {"type": "FLOAT", "value": "$loss"}},
                    "etimes": {"iteration": {"type": "INT", "value": "$iter"}},
                }
            },
        }
    ).groups["caffe"]
    assert group.regex.startswith("Iteration %{INT:iter}")


@pytest.mark.parametrize(
    ("evaluation_metrics", "field", "words"),
    [
        (
            {"type": "regex_extractor"},
            "evaluation_metrics.groups",
            "is required for type regex_extractor",
        ),
        (
            {"groups": {"g": {"regex": "a=(?P<a>\\d)", "scalars": {"a": "$b"}}}},
            "evaluation_metrics.groups.g.scalars.a.value",
            "refers to $b, which the regex does not capture (its groups: a)",
        ),
        (
            {"groups": {"g": {"regex": "a=(?P<a>\\d)", "etimes": {"iteration": "$i"}}}},
            "evaluation_metrics.groups.g.etimes.iteration.value",
            "refers to $i",
        ),
        (
            {"groups": {"g": {"regex": "a", "scalars": {"a": {"type": "BOOL", "value": "1"}}}}},
            "evaluation_metrics.groups.g.scalars.a.type",
            "must be one of FLOAT, INT, STRING, JSONSTRING, got 'BOOL'",
        ),
        (
            {"groups": {"g": {"regex": "a", "scalars": {"a": {"type": "INT"}}}}},
            "evaluation_metrics.groups.g.scalars.a.value",
            "is required",
        ),
        (
            {"groups": {"g": {"regex": "a", "scalars": {"a": ["x"]}}}},
            "evaluation_metrics.groups.g.scalars.a",
            "must be a string or a mapping with type and value",
        ),
        (
            {"groups": {"g": {"regex": "a=%{DECIMAL:a}", "scalars": {"a": "$a"}}}},
            "evaluation_metrics.groups.g.regex",
            "unknown pattern %{DECIMAL}",
        ),
        (
            {"type": "tensorboard", "in": "/etc/secrets"},
            "evaluation_metrics.in",
            "must lie in the job's directories",
        ),
        (
            {"type": "tensorboard", "in": "$HOME/tb"},
            "evaluation_metrics.in",
            "got '$HOME/tb'",
        ),
        (
            {"type": "tensorboard", "in": "$JOB_STATE_DIR/../other/tb"},
            "evaluation_metrics.in",
            "must not contain '..' parts",
        ),
        (
            {"line_lookahead": 100_000},
            "evaluation_metrics.line_lookahead",
            "between 1 and 1000",
        ),
    ],
)
def test_unusable_metric_settings_are_refused_naming_the_field(
    evaluation_metrics: dict[str, Any], field: str, words: str
) -> None:
    error = refusal(evaluation_metrics)
    assert error.field == field
    assert words in error.reason
    assert error.code == "C101"


@pytest.mark.parametrize(
    "directory",
    ["$JOB_STATE_DIR/logs/tb", "${JOB_STATE_DIR}/logs/tb/test", "$LOG_DIR/tb", "tb/train"],
)
def test_tensorboard_directories_in_the_job_are_accepted(directory: str) -> None:
    assert metrics_of({"type": "tensorboard", "in": directory}).in_ == directory


def test_stored_manifests_round_trip_including_the_short_form_of_earlier_versions() -> None:
    manifest = parse_manifest(
        {
            **BASE,
            "evaluation_metrics": {
                "type": "regex_extractor",
                "line_lookahead": 4,
                "groups": {"g": {"regex": "a=(?P<a>\\d)", "scalars": {"a": "$a"}}},
            },
        }
    )
    assert Manifest.from_dict(manifest.to_dict()) == manifest
    stored = manifest.to_dict()
    assert stored["evaluation_metrics"]["groups"]["g"]["scalars"] == {
        "a": {"type": "FLOAT", "value": "$a"}
    }
    stored["evaluation_metrics"]["groups"]["g"]["scalars"] = {"a": "$a"}  # as stored before
    assert Manifest.from_dict(stored) == manifest
