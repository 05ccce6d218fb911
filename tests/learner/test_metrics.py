"""Metric extraction: FfDL regex groups over log lines, emetrics lines, and file tailing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ffdl.learner.metrics import (
    MAX_LINE_BYTES,
    EMetric,
    EmetricsTailer,
    MetricOutOfRange,
    parse_emetrics_line,
)
from ffdl.learner.regex_metrics import LineMatcher, compile_groups, match_line

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


# --- numbers the platform cannot store --------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"step": 1e20, "loss": 1}', "iteration out of range"),
        ('{"iteration": 100000000000000000000000, "loss": 1}', "iteration out of range"),
        ('{"step": -1, "loss": 1}', "iteration out of range"),
        ('{"step": Infinity, "loss": 1}', "iteration out of range"),
        ('{"step": 2, "time": 1e308, "loss": 1}', "time out of range"),
        ('{"step": 2, "time": -5, "loss": 1}', "time out of range"),
        ('{"step": 2, "time": 1' + "0" * 30 + ', "loss": 1}', "time out of range"),
        ('{"step": 3, "loss": NaN}', "value 'loss' is not finite"),
        ('{"step": 3, "loss": -Infinity}', "value 'loss' is not finite"),
        ('{"step": 4, "loss": 1e300}', "value 'loss' out of range"),
        ('{"iteration": 5, "values": {"acc": NaN}}', "value 'acc' is not finite"),
        ('{"iteration": 5, "values": {"acc": 1}, "samples": 1e200}', "value 'samples'"),
    ],
)
def test_metrics_with_numbers_out_of_range_are_dropped(line: str, why: str) -> None:
    with pytest.raises(MetricOutOfRange, match=why):
        parse_emetrics_line(line)


def test_regex_metrics_out_of_range_are_dropped_and_reported() -> None:
    groups, _ = compile_groups(
        {
            "train": {
                "regex": r"step (?P<s>\S+) loss (?P<l>\S+)",
                "scalars": {"loss": "l"},
                "etimes": {"iteration": "s"},
            }
        }
    )
    problems: list[str] = []
    assert match_line(groups, "step 1e20 loss 0.5", problems.append) == []
    assert match_line(groups, "step 3 loss 1e300", problems.append) == []
    assert match_line(groups, "step 3 loss 1e300") == []  # without a listener: dropped quietly
    assert problems == [
        "dropped metric of group 'train': iteration out of range",
        "dropped metric of group 'train': value 'loss' out of range",
    ]
    assert match_line(groups, "step 4 loss 0.25") == [
        EMetric(group="train", iteration=4, values={"loss": 0.25})
    ]


def test_tailer_drops_bad_metrics_with_a_warning_and_keeps_going(tmp_path: Path) -> None:
    path = tmp_path / "emetrics.jsonl"
    lines = [
        '{"step": 1e20, "loss": 1}',
        '{"step": 2, "time": 1e308, "loss": 1}',
        '{"step": 3, "loss": NaN}',
        '{"step": 4, "loss": 0.5}',
    ]
    path.write_text("\n".join(lines) + "\n")
    found: list[EMetric] = []
    problems: list[str] = []
    EmetricsTailer(str(path), found.append, problems.append).poll()
    assert [(m.iteration, m.values) for m in found] == [(4, {"loss": 0.5})]
    assert problems == [
        f"dropped metric (line 1 of emetrics file {path}): iteration out of range",
        f"dropped metric (line 2 of emetrics file {path}): time out of range",
        f"dropped metric (line 3 of emetrics file {path}): value 'loss' is not finite",
    ]


# --- what the tailer will not read ----------------------------------------------------------


def test_tailer_never_follows_a_symlink(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text('{"step": 1, "root_password_hash": 1234}\n')
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "emetrics.jsonl"
    path.symlink_to(secret)
    found: list[EMetric] = []
    problems: list[str] = []
    tailer = EmetricsTailer(str(path), found.append, problems.append)
    tailer.poll()
    tailer.poll(final=True)
    assert found == []
    assert problems == [f"emetrics file {path} is a symbolic link; it is not read"]
    # Once the link is replaced by a real file, the tailer reads that.
    path.unlink()
    path.write_text('{"step": 2, "loss": 0.1}\n')
    tailer.poll()
    assert [m.iteration for m in found] == [2]


def test_tailer_does_not_follow_a_linked_directory(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "emetrics.jsonl").write_text('{"step": 1, "loss": 1}\n')
    (tmp_path / "logs").symlink_to(real)
    found: list[EMetric] = []
    problems: list[str] = []
    EmetricsTailer(str(tmp_path / "logs" / "emetrics.jsonl"), found.append, problems.append).poll()
    assert found == [] and len(problems) == 1 and "is a link" in problems[0]


def test_tailer_is_not_blocked_by_a_fifo(tmp_path: Path) -> None:
    path = tmp_path / "emetrics.jsonl"
    os.mkfifo(path)
    found: list[EMetric] = []
    problems: list[str] = []
    tailer = EmetricsTailer(str(path), found.append, problems.append, poll_s=0.01)
    tailer.start()
    wait_until(lambda: problems, timeout_s=5, what="the FIFO to be refused")
    tailer.stop(timeout_s=5)
    assert not tailer._thread.is_alive()
    assert found == []
    assert problems == [f"emetrics file {path} is not a regular file; it is not read"]


def test_tailer_drops_a_line_too_long_to_hold(tmp_path: Path) -> None:
    path = tmp_path / "emetrics.jsonl"
    with path.open("wb") as handle:
        handle.write(b'{"step": 1, "loss": 1}\n')
        handle.write(b"x" * (MAX_LINE_BYTES * 3))
        handle.write(b'\n{"step": 3, "loss": 3}\n')
    found: list[EMetric] = []
    problems: list[str] = []
    EmetricsTailer(str(path), found.append, problems.append).poll()
    assert [m.iteration for m in found] == [1, 3]
    assert problems == [
        f"line 2 in emetrics file {path} is longer than {MAX_LINE_BYTES} bytes; dropped"
    ]


def test_typed_values_are_read_as_their_type_and_bad_ones_dropped_with_a_warning() -> None:
    problems: list[str] = []
    groups, _ = compile_groups(
        {
            "train": {
                "regex": r"it=%{INT:it} acc=(?P<acc>\S+) n=(?P<n>\S+) tag=(?P<tag>\S+)",
                "scalars": {
                    "accuracy": {"type": "FLOAT", "value": "$acc"},
                    "count": {"type": "INT", "value": "$n"},
                    "label": {"type": "STRING", "value": "$tag"},
                    "version": {"type": "INT", "value": "3"},
                },
                "etimes": {"iteration": {"type": "INT", "value": "$it"}},
            }
        }
    )
    (metric,) = match_line(groups, "it=12 acc=0.5 n=7 tag=0.25", problems.append)
    assert metric == EMetric(
        "train", 12, {"accuracy": 0.5, "count": 7, "label": 0.25, "version": 3}
    )
    assert problems == []
    (metric,) = match_line(groups, "it=13 acc=high n=7.5 tag=best", problems.append)
    assert metric.values == {"version": 3.0}
    assert len(problems) == 3
    assert "'accuracy'" in problems[0] and "'high' is not a finite FLOAT" in problems[0]
    assert "'count'" in problems[1] and "'7.5' is not an INT" in problems[1]
    assert "'label'" in problems[2] and "only numbers are stored" in problems[2]


def test_line_lookahead_matches_a_regex_over_several_lines_once() -> None:
    problems: list[str] = []
    matcher = LineMatcher(
        {
            "test": {
                "regex": r"Test net output #0: accuracy = %{FLOAT:acc}.*?loss = %{FLOAT:loss}",
                "scalars": {"accuracy": "$acc", "loss": "$loss"},
            }
        },
        line_lookahead=4,
        on_problem=problems.append,
    )
    found = [
        metric
        for line in [
            "Iteration 100, Testing net",
            "Test net output #0: accuracy = 0.75",
            "Test net output #1: loss = 0.5",
            "Iteration 200",
            "Test net output #1: loss = 0.25",
        ]
        for metric in matcher.feed(line)
    ]
    assert found == [EMetric("test", None, {"accuracy": 0.75, "loss": 0.5})]
    assert matcher.matched == 1 and problems == []


def test_without_lookahead_every_group_matches_each_line() -> None:
    matcher = LineMatcher(
        {
            "loss": {"regex": r"loss=(?P<v>\S+)", "scalars": {"loss": "$v"}},
            "acc": {"regex": r"acc=(?P<v>\S+)", "scalars": {"acc": "$v"}},
        },
        line_lookahead=None,
        on_problem=lambda _: None,
    )
    assert [m.group for m in matcher.feed("loss=1 acc=0.5")] == ["loss", "acc"]
    assert matcher.matched == 2


def test_ffdl_evaluation_metrics_records_parse() -> None:
    record = {
        "meta": {"training_id": "training-1", "time": 1_700_000_000_500, "rindex": 3},
        "grouplabel": "test",
        "etimes": {
            "iteration": {"type": "INT", "value": "20"},
            "timestamp": {"type": "STRING", "value": "2023-11-14T22:13:20Z"},
        },
        "values": {
            "accuracy": {"type": "FLOAT", "value": "0.875"},
            "phase": {"type": "STRING", "value": "eval"},
        },
    }
    assert parse_emetrics_line(json.dumps(record)) == EMetric(
        group="test", iteration=20, values={"accuracy": 0.875}, time=1_700_000_000.5
    )
    record["values"] = {"phase": {"type": "STRING", "value": "eval"}}
    with pytest.raises(ValueError, match=r"no numeric metric values \('phase': 'eval' is not"):
        parse_emetrics_line(json.dumps(record))
    record["values"] = {"loss": {"value": 0.5}}
    record["etimes"] = {"iteration": {"type": "INT", "value": "x"}}
    with pytest.raises(ValueError, match="etimes 'iteration': 'x' is not an INT"):
        parse_emetrics_line(json.dumps(record))
