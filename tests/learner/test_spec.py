"""The spec and result files: round trips, private modes, validation naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ffdl.learner.spec import (
    DataMount,
    LearnerResult,
    LearnerSpec,
    SpecError,
    dump_spec,
    load_spec,
    read_result,
    report_targets,
    spec_to_dict,
    write_result,
)


def sample_spec(tmp_path: Path) -> LearnerSpec:
    return LearnerSpec(
        training_id="training-abc",
        learner=2,
        num_learners=2,
        attempt=1,
        api_url="http://127.0.0.1:8080",
        job_token="secret",
        command="python train.py",
        workdir=str(tmp_path / "code"),
        env={"PATH": "/usr/bin", "LEARNER_ID": "2"},
        data=[DataMount(kind="local", source="/data/in", target="/job/data")],
        results_source="/job/results",
        results_target="/store/results",
        emetrics_file="/job/logs/emetrics.jsonl",
        metric_groups={"test": {"regex": "acc=(?P<a>.*)", "scalars": {"acc": "$a"}}},
        state_dir=str(tmp_path / "state"),
        halt_grace_s=3.0,
    )


def test_dump_and_load_round_trip_with_a_private_file(tmp_path: Path) -> None:
    spec = sample_spec(tmp_path)
    path = tmp_path / "spec.json"
    dump_spec(spec, path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_spec(path) == spec
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]


def test_optional_fields_take_their_defaults(tmp_path: Path) -> None:
    document = spec_to_dict(sample_spec(tmp_path))
    for name in ("halt_grace_s", "heartbeat_s", "report_deadline_s", "data", "metric_groups"):
        del document[name]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(document))
    spec = load_spec(path)
    assert (spec.halt_grace_s, spec.heartbeat_s, spec.report_deadline_s) == (10.0, 2.0, 600.0)
    assert (spec.data, spec.metric_groups) == ([], {})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"learner": True}, "'learner'"),
        ({"learner": 3}, "'learner'"),
        ({"env": {"A": 1}}, "'env'"),
        ({"api_url": "ftp://x"}, "'api_url'"),
        ({"data": [{"kind": "nfs", "source": "/a", "target": "/b"}]}, r"'data\[0\].kind'"),
        ({"data": [{"kind": "local", "source": "a", "target": "/b"}]}, "absolute"),
        ({"heartbeat_s": 0}, "'heartbeat_s'"),
        ({"results_target": 5}, "'results_target'"),
        ({"report_urls": ["ftp://x"]}, "'report_urls'"),
    ],
)
def test_invalid_fields_are_named(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**spec_to_dict(sample_spec(tmp_path)), **change}))
    with pytest.raises(SpecError, match=field):
        load_spec(path)


def test_reports_go_where_the_spec_says_in_order(tmp_path: Path) -> None:
    spec = sample_spec(tmp_path)
    spec.fallback_urls = ["http://127.0.0.1:8081", "http://127.0.0.1:8082"]
    assert report_targets(spec) == [spec.api_url, *spec.fallback_urls]
    spec.report_urls = ["http://127.0.0.1:8082", "http://127.0.0.1:8080", "http://127.0.0.1:8081"]
    assert report_targets(spec) == spec.report_urls
    path = tmp_path / "spec.json"
    dump_spec(spec, path)
    assert load_spec(path).report_urls == spec.report_urls


def test_unreadable_spec(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "bad.json")


def test_result_round_trip(tmp_path: Path) -> None:
    assert read_result(tmp_path) is None
    write_result(tmp_path, LearnerResult("FAILED", exit_code=2, error_code="C201", reason="x"))
    result = read_result(tmp_path)
    assert result is not None
    assert (result.status, result.exit_code, result.error_code, result.reason) == (
        "FAILED",
        2,
        "C201",
        "x",
    )
    assert result.time is not None
    assert (tmp_path / "result.json").stat().st_mode & 0o777 == 0o600
