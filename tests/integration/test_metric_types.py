"""FfDL's metric types through a real server: TensorBoard event files and typed regex groups
become emetrics, and a type that yields nothing says so in the job's log."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.live import LiveServer, manifest_yaml, serving

TENSORBOARD_JOB = """
import os
from torch.utils.tensorboard import SummaryWriter

root = os.path.join(os.environ["LOG_DIR"], "tb")
train = SummaryWriter(os.path.join(root, "train"))
test = SummaryWriter(os.path.join(root, "test"))
for step in range(1, 6):
    train.add_scalar("loss", 1.0 / step, step)
    train.add_scalar("accuracy", step / 10, step)
    if step % 2 == 0:
        test.add_scalar("accuracy", step / 20, step, new_style=True)
train.close()
test.close()
print("trained", flush=True)
"""

REGEX_JOB = """
for step in range(1, 4):
    print(f"Iteration {step * 100}, loss = {1.0 / step:.3f}, lr = 1e-{step}, note = warm")
print("Iteration 400, loss = diverged, lr = 1e-4, note = warm")
"""

FFDL_EMETRICS_JOB = """
import json, os, time
path = os.path.join(os.environ["LOG_DIR"], "evaluation-metrics.txt")
for step in (1, 2):
    record = {
        "meta": {"training_id": os.environ["TRAINING_ID"], "time": int(time.time() * 1000)},
        "grouplabel": "test",
        "etimes": {"iteration": {"type": "INT", "value": str(step)}},
        "values": {"accuracy": {"type": "FLOAT", "value": str(step / 4)}},
    }
    with open(path, "a") as out:
        out.write(json.dumps(record) + "\\n")
"""

REGEX_METRICS: dict[str, Any] = {
    "type": "regex_extractor",
    "groups": {
        "train": {
            "regex": r"Iteration %{INT:iter}, loss = (?P<loss>\S+), lr = %{FLOAT:lr}",
            "meta": {"time": "$timelocal"},
            "scalars": {
                "loss": {"type": "FLOAT", "value": "$loss"},
                "lr": {"type": "FLOAT", "value": "$lr"},
            },
            "etimes": {"iteration": {"type": "INT", "value": "$iter"}},
        }
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path_factory.mktemp("metrics") / "home")) as live:
        yield live


def listed(server: LiveServer, job_id: str, kind: str) -> list[dict[str, Any]]:
    response = server.client.get(f"/v1/logs/{job_id}/{kind}", params={"pagesize": 1000})
    assert response.status_code == 200, response.text
    body = response.json()
    wrapped = "lines" if kind == "loglines" else "records"
    items: list[dict[str, Any]] = body.get("models", body.get(wrapped))
    return items


def ffdl_lines(server: LiveServer, job_id: str) -> list[str]:
    lines = [str(item["line"]) for item in listed(server, job_id, "loglines")]
    return [line for line in lines if line.startswith("[ffdl] evaluation metrics")]


def test_tensorboard_scalars_written_to_log_dir_come_out_as_emetrics(server: LiveServer) -> None:
    metrics = {"type": "tensorboard", "in": "$JOB_STATE_DIR/logs/tb"}
    job_id = server.submit_ok(
        manifest_yaml("python train.py", evaluation_metrics=metrics), {"train.py": TENSORBOARD_JOB}
    )
    server.wait_status(job_id, {"COMPLETED"}, timeout=120)
    records = listed(server, job_id, "emetrics")
    by_group: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_group.setdefault(record["grouplabel"], []).append(record)
    assert sorted(by_group) == ["test", "train"]
    train = by_group["train"]
    assert [r["etimes"]["iteration"]["value"] for r in train] == ["1", "2", "3", "4", "5"]
    assert float(train[3]["values"]["loss"]["value"]) == pytest.approx(0.25)
    assert float(train[3]["values"]["accuracy"]["value"]) == pytest.approx(0.4)
    assert [r["etimes"]["iteration"]["value"] for r in by_group["test"]] == ["2", "4"]
    assert float(by_group["test"][1]["values"]["accuracy"]["value"]) == pytest.approx(0.2)
    said = ffdl_lines(server, job_id)
    assert any("reading scalars from" in line for line in said), said
    assert not any("no TensorBoard" in line for line in said), said


def test_regex_extractor_typed_scalars_come_out_as_emetrics(server: LiveServer) -> None:
    job_id = server.submit_ok(
        manifest_yaml("python train.py", evaluation_metrics=REGEX_METRICS), {"train.py": REGEX_JOB}
    )
    server.wait_status(job_id, {"COMPLETED"}, timeout=60)
    records = listed(server, job_id, "emetrics")
    assert [r["grouplabel"] for r in records] == ["train"] * 4
    assert [r["etimes"]["iteration"]["value"] for r in records] == ["100", "200", "300", "400"]
    assert [float(r["values"]["loss"]["value"]) for r in records[:3]] == [1.0, 0.5, 0.333]
    # A value that is not a FLOAT is dropped, with a warning; the rest of the line counts.
    assert sorted(records[3]["values"]) == ["lr"]
    lines = [str(item["line"]) for item in listed(server, job_id, "loglines")]
    assert any("'diverged' is not a finite FLOAT" in line for line in lines), lines


def test_ffdl_evaluation_metrics_file_comes_out_as_emetrics(server: LiveServer) -> None:
    job_id = server.submit_ok(
        manifest_yaml("python train.py", evaluation_metrics={"type": "emetrics_file"}),
        {"train.py": FFDL_EMETRICS_JOB},
    )
    server.wait_status(job_id, {"COMPLETED"}, timeout=60)
    records = listed(server, job_id, "emetrics")
    assert [(r["grouplabel"], r["etimes"]["iteration"]["value"]) for r in records] == [
        ("test", "1"),
        ("test", "2"),
    ]
    assert [float(r["values"]["accuracy"]["value"]) for r in records] == [0.25, 0.5]
    assert ffdl_lines(server, job_id) == []


def test_a_metric_type_that_found_nothing_says_where_it_looked(server: LiveServer) -> None:
    quiet = "print('training without metrics', flush=True)\n"
    board = server.submit_ok(
        manifest_yaml("python train.py", evaluation_metrics={"type": "tensorboard"}),
        {"train.py": quiet},
    )
    regex = server.submit_ok(
        manifest_yaml("python train.py", evaluation_metrics=REGEX_METRICS), {"train.py": quiet}
    )
    emetrics = server.submit_ok(
        manifest_yaml("python train.py", evaluation_metrics={"type": "emetrics"}),
        {"train.py": quiet},
    )
    for job_id in (board, regex, emetrics):
        server.wait_status(job_id, {"COMPLETED"}, timeout=60)
    assert listed(server, board, "emetrics") == []
    (said,) = [line for line in ffdl_lines(server, board) if "no TensorBoard" in line]
    assert said.startswith("[ffdl] evaluation metrics (tensorboard): no TensorBoard directory /")
    assert said.endswith("/tb")
    assert listed(server, regex, "emetrics") == []
    assert ffdl_lines(server, regex) == [
        "[ffdl] evaluation metrics (regex_extractor): no output line matched the groups 'train'"
    ]
    assert ffdl_lines(server, emetrics) == [
        "[ffdl] evaluation metrics (emetrics): no metrics were written to "
        "$LOG_DIR/emetrics.jsonl or $LOG_DIR/evaluation-metrics.txt"
    ]


def test_an_unknown_metric_type_is_refused_naming_it(server: LiveServer) -> None:
    response = server.submit(
        manifest_yaml("python train.py", evaluation_metrics={"type": "prometheus"})
    )
    assert response.status_code == 400
    text = response.text
    assert "evaluation_metrics.type" in text and "'prometheus'" in text
    assert "tensorboard" in text and "regex_extractor" in text
