"""Retention on a live server: an ended job's log lines and metrics move to the archive
store in chunks, leave the database, and every view still serves them as before; deleting
the job deletes its chunks, and a chunk the store lost is a clear 503."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    followed_socket_lines,
    manifest_yaml,
    serving,
    streamed_log_items,
    wait_for,
)

STEPS = 150
PLAIN = 120
# Prints ``PLAIN`` plain lines, then one metrics line per step (the regex group below).
TRAIN = f"""
for i in range(1, {PLAIN + 1}):
    print(f"line {{i}}")
for step in range(1, {STEPS + 1}):
    print(f"Iteration {{step}}, loss = {{1.0 / step:.4f}}")
"""
METRICS: dict[str, Any] = {
    "type": "regex_extractor",
    "groups": {
        "train": {
            "regex": r"Iteration %{INT:iter}, loss = %{FLOAT:loss}",
            "scalars": {"loss": {"type": "FLOAT", "value": "$loss"}},
            "etimes": {"iteration": {"type": "INT", "value": "$iter"}},
        }
    },
}
CHUNK = 100


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    config = {
        **FAST_CONFIG,
        # Archived about a second after the job ends, in chunks of 100 records.
        "archive_records_after_h": 0.0003,
        "archive_interval_s": 0.3,
        "archive_chunk_records": CHUNK,
    }
    home = tmp_path_factory.mktemp("retention") / "home"
    with serving(LiveServer(home=home, config=config)) as live:
        yield live


def _stored(server: LiveServer, job_id: str) -> tuple[int, int, int, int]:
    """(log lines, metrics records) of the job still in the database, and its two marks."""
    with sqlite3.connect(server.home / "ffdl.db") as db:
        lines = db.execute("SELECT count(*) FROM log_lines WHERE job_id = ?", (job_id,)).fetchone()
        metrics = db.execute("SELECT count(*) FROM metrics WHERE job_id = ?", (job_id,)).fetchone()
        marks = db.execute(
            "SELECT archived_line_number, archived_metric_number FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
    return lines[0], metrics[0], marks[0], marks[1]


def _archived_job(server: LiveServer) -> tuple[str, int]:
    job_id = server.submit_ok(
        manifest_yaml("python train.py", evaluation_metrics=METRICS), {"train.py": TRAIN}
    )
    server.wait_status(job_id, {"COMPLETED"}, timeout=60)
    total = len(_all_lines(server, job_id))
    wait_for(
        lambda: _stored(server, job_id) == (0, 1, total, STEPS - 1),
        timeout=30,
        what="the job's records archived",
    )
    return job_id, total


def _all_lines(server: LiveServer, job_id: str) -> list[dict[str, Any]]:
    return server.loglines(job_id, pagesize=10_000)


def test_an_ended_jobs_records_move_to_the_archive_and_read_the_same(server: LiveServer) -> None:
    job_id, total = _archived_job(server)
    chunks = sorted(p.name for p in (server.home / "archive" / "records" / job_id).iterdir())
    assert chunks == [
        f"log-{first:012d}-{min(first + CHUNK - 1, total):012d}.jsonl.gz"
        for first in range(1, total + 1, CHUNK)
    ] + [
        f"metric-{1:012d}-{CHUNK:012d}.jsonl.gz",
        f"metric-{CHUNK + 1:012d}-{STEPS - 1:012d}.jsonl.gz",
    ]

    everything = _all_lines(server, job_id)
    texts = [item["line"] for item in everything]
    assert [item["meta"]["rindex"] for item in everything] == list(range(1, total + 1))
    assert [t for t in texts if t.startswith("line ")] == [f"line {i}" for i in range(1, PLAIN + 1)]
    page = server.loglines(job_id, pos=95, pagesize=10)  # across two chunks
    assert [item["meta"]["rindex"] for item in page] == list(range(96, 106))
    back = server.loglines(job_id, since_time="-5")
    assert [item["line"] for item in back] == texts[-5:]
    last = server.loglines(job_id, pos=-1, pagesize=3)
    assert [item["line"] for item in last] == texts[-3:]
    middle = everything[150]["meta"]["time"]
    from_then = server.loglines(job_id, since_time=str(middle), pagesize=10_000)
    assert [item["line"] for item in from_then] == [
        item["line"] for item in everything if item["meta"]["time"] >= middle
    ]

    metrics = server.client.get(f"/v1/logs/{job_id}/emetrics", params={"pagesize": 1000})
    records = metrics.json()["models"]
    assert [r["etimes"]["iteration"]["value"] for r in records] == [
        str(step) for step in range(1, STEPS + 1)
    ]
    assert float(records[3]["values"]["loss"]["value"]) == pytest.approx(0.25)
    # The newest record stayed in the database: the model's summary still shows it.
    (latest,) = server.model(job_id)["metrics"]
    assert latest["iteration"] == STEPS

    assert [i["line"] for i in streamed_log_items(server, job_id, since_rindex=0)] == texts
    assert [i["line"] for i in streamed_log_items(server, job_id, since_rindex=98)] == texts[98:]
    assert followed_socket_lines(server, job_id, "since_time=-7") == texts[-7:]
    followed = server.client.get(f"/v1/models/{job_id}/logs", params={"follow": "true"})
    assert followed.text.splitlines() == texts


def test_deleting_an_archived_job_deletes_its_chunks(server: LiveServer) -> None:
    job_id, _ = _archived_job(server)
    chunks = server.home / "archive" / "records" / job_id
    assert any(chunks.iterdir())
    assert server.client.delete(f"/v1/models/{job_id}").json()["deleted"] is True
    assert not chunks.exists()


def test_a_chunk_the_store_lost_is_a_503_naming_it(server: LiveServer) -> None:
    job_id, _ = _archived_job(server)
    chunk = server.home / "archive" / "records" / job_id / f"log-{1:012d}-{CHUNK:012d}.jsonl.gz"
    chunk.unlink()
    response = server.client.get(f"/v1/logs/{job_id}/loglines", params={"pos": 10})
    assert response.status_code == 503
    message = response.json()["description"]
    assert f"log lines 1..{CHUNK} of {job_id} are archived" in message
    assert "no such object" in message
    # Records outside the lost chunk are still served.
    tail = server.client.get(f"/v1/logs/{job_id}/loglines", params={"pos": CHUNK, "pagesize": 5})
    assert tail.status_code == 200
    assert [i["meta"]["rindex"] for i in tail.json()["models"]] == list(range(CHUNK + 1, CHUNK + 6))


def test_a_running_jobs_records_stay_in_the_database(server: LiveServer) -> None:
    wait = "import time\nprint('started', flush=True)\ntime.sleep(600)\n"
    job_id = server.submit_ok(manifest_yaml("python wait.py"), {"wait.py": wait})
    wait_for(
        lambda: any(i["line"] == "started" for i in server.loglines(job_id)),
        timeout=60,
        what="the job's first line",
    )
    # Several archiver passes run meanwhile (every 0.3 s): none may touch a live job.
    passes = _archiver_passes(server)
    wait_for(lambda: _archiver_passes(server) >= passes + 5, timeout=30, what="5 archiver passes")
    lines, _, line_mark, metric_mark = _stored(server, job_id)
    assert lines >= 1 and line_mark == 0 and metric_mark == 0
    assert server.client.delete(f"/v1/models/{job_id}").json()["deleted"] is True


def _archiver_passes(server: LiveServer) -> float:
    for row in server.client.get("/metrics").text.splitlines():
        if row.startswith('ffdl_loop_pass_duration_seconds_count{loop="archiver"}'):
            return float(row.split()[-1])
    return 0.0
