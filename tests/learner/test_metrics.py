"""Metric extraction: FfDL regex groups over log lines, emetrics lines, and file tailing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ffdl.learner.metrics import (
    EMetric,
    EmetricsTailer,
    compile_groups,
    match_line,
    parse_emetrics_line,
)

from .test_recording_api import wait_until


def test_regex_group_maps_named_groups_to_scalars_and_iteration() -> None:
    groups, problems = compile_groups(
        {
            "train": {
                "regex": r"step (?<step>\d+) loss=(?P<loss>\S+) acc=(?P<acc>\S+)",
                "scalars": {"loss": "$loss", "accuracy": "acc"},
                "etimes": {"iteration": "$step", "wallclock": "$loss"},
            }
        }
    )
    assert problems == []
    assert match_line(groups, "epoch 1 step 20 loss=0.5 acc=0.75") == [
        EMetric(group="train", iteration=20, values={"loss": 0.5, "accuracy": 0.75})
    ]
    assert match_line(groups, "nothing to see") == []
    assert match_line(groups, "step 3 loss=nan acc=oops") == []


def test_regex_group_without_iteration_and_bad_groups() -> None:
    groups, problems = compile_groups(
        {
            "test": {"regex": r"accuracy: (?P<a>[0-9.]+)", "scalars": {"accuracy": "$a"}},
            "broken": {"regex": "(unclosed", "scalars": {}},
            "empty": {"scalars": {}},
        }
    )
    assert [group.name for group in groups] == ["test"]
    assert len(problems) == 2
    assert "'broken'" in problems[0] and "'empty'" in problems[1]
    (metric,) = match_line(groups, "accuracy: 0.9")
    assert (metric.iteration, metric.values) == (None, {"accuracy": 0.9})


def test_both_emetrics_shapes_parse() -> None:
    nested = parse_emetrics_line(
        json.dumps(
            {"time": 7.5, "group": "test", "iteration": None, "samples": 3, "values": {"f1": 1}}
        )
    )
    # The SDK's cumulative sample count travels with the values (the platform's throughput).
    assert nested == EMetric(
        group="test", iteration=None, values={"f1": 1.0, "samples": 3.0}, time=7.5
    )
    flat = parse_emetrics_line(
        json.dumps({"epoch": 2, "step": 40, "loss": 0.1, "tag": "x", "ok": True})
    )
    assert flat == EMetric(group="train", iteration=40, values={"epoch": 2.0, "loss": 0.1})


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"step": 1, "name": "x"}', "no numeric metric values"),
        ('{"step": 1.5, "loss": 1}', "'step' must be an integer"),
        ('{"group": 3, "loss": 1}', "'group'"),
        ('{"time": "now", "loss": 1}', "'time'"),
    ],
)
def test_unusable_emetrics_lines_say_why(line: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_emetrics_line(line)


def test_tailer_waits_for_the_file_and_finishes_partial_lines(tmp_path: Path) -> None:
    path = tmp_path / "emetrics.jsonl"
    found: list[EMetric] = []
    problems: list[str] = []
    tailer = EmetricsTailer(str(path), found.append, problems.append, poll_s=0.01)
    tailer.start()
    try:
        with path.open("w") as handle:
            handle.write('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
            handle.flush()
            wait_until(lambda: len(found) == 1, what="the first line")
            handle.write('ss": 2.0}\nbroken\n{"step": 3, "loss": 3.0}')
            handle.flush()
            wait_until(lambda: len(found) == 2 and problems, what="the finished line")
    finally:
        tailer.stop()
    assert [(m.iteration, m.values["loss"]) for m in found] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert problems == [f"malformed line 3 in emetrics file {path}: not JSON (Expecting value)"]


def test_tailer_skips_what_an_earlier_attempt_wrote_and_follows_a_new_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "emetrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n')
    found: list[EMetric] = []
    tailer = EmetricsTailer(str(path), found.append, lambda _: None, skip_existing=True)
    tailer.poll()
    assert found == []
    with path.open("a") as handle:
        handle.write('{"step": 2, "loss": 2.0}\n')
    tailer.poll()
    replacement = tmp_path / "replacement"
    replacement.write_text('{"step": 9, "loss": 9.0}\n')
    replacement.replace(path)
    tailer.poll(final=True)
    assert [m.iteration for m in found] == [2, 9]


def test_tailer_stops_complaining_after_a_while(tmp_path: Path) -> None:
    path = tmp_path / "emetrics.jsonl"
    path.write_text("garbage\n" * 30)
    problems: list[str] = []
    EmetricsTailer(str(path), lambda _: None, problems.append).poll()
    assert len(problems) == 21
    assert problems[-1] == "further emetrics problems are not reported"
