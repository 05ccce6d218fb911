"""The report stream on a real server with real controllers: metrics with absurd numbers are
dropped with a warning, forged reports cannot mute a job's log, and an ended job takes no
more reports."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from ffdl.core.jobdirs import JobDirs
from ffdl.server.auth import JobTokens, load_or_create_secret
from tests.integration.live import LiveServer, manifest_yaml, wait_for

BAD_METRICS = """
import json, os
lines = [
    '{"step": 1e20, "loss": 1}',
    '{"step": 2, "time": 1e308, "loss": 1}',
    '{"step": 3, "loss": NaN}',
    '{"step": 4, "loss": 1e300}',
    '{"step": 5, "loss": 0.5}',
]
with open(os.path.join(os.environ["LOG_DIR"], "emetrics.jsonl"), "a") as fh:
    fh.write("\\n".join(lines) + "\\n")
print("wrote metrics", flush=True)
"""

# Waits (with a deadline of its own) until the test lets it go on.
WAIT_FOR_GO = """
import os, pathlib, time
print("first", flush=True)
go = pathlib.Path(os.environ["DATA_DIR"], "go")
deadline = time.monotonic() + 120
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("after the forgery", flush=True)
"""


def test_absurd_metrics_are_dropped_with_warnings_and_good_ones_arrive(
    server: LiveServer,
) -> None:
    job_id = server.submit_ok(manifest_yaml("python m.py", gpus=0), {"m.py": BAD_METRICS})
    server.wait_status(job_id, {"COMPLETED"})
    records = server.client.get(f"/v1/logs/{job_id}/emetrics").json()["models"]
    assert [r["etimes"]["iteration"]["value"] for r in records] == ["5"]
    assert records[0]["values"]["loss"]["value"] == "0.5"
    warnings = [
        line["line"] for line in server.loglines(job_id) if "dropped metric" in line["line"]
    ]
    reasons = [text.rsplit(": ", 1)[1] for text in warnings]
    assert reasons == [
        "iteration out of range",
        "time out of range",
        "value 'loss' is not finite",
        "value 'loss' out of range",
    ]
    assert all(text.startswith("[ffdl] dropped metric (line ") for text in warnings)


@dataclass
class Forger:
    """Posts reports for learner 1 of a job's current attempt with the job's own token, as
    someone holding a leaked job token could."""

    server: LiveServer
    job_id: str

    def __post_init__(self) -> None:
        self.token = JobTokens(load_or_create_secret(self.server.home)).issue(self.job_id)
        self.attempt = int(self.server.model(self.job_id)["learners"][0]["attempt"])

    def post(self, items: list[Any] | str, **batch: Any) -> httpx.Response:
        if isinstance(items, str):  # raw JSON items, e.g. with a bare NaN in them
            body = f'{{"attempt": {self.attempt}, "items": [{items}]}}'
        else:
            body = json.dumps({"attempt": self.attempt, "items": items, **batch})
        return self.post_raw(body)

    def post_raw(self, body: str, learner: int = 1) -> httpx.Response:
        return httpx.post(
            f"{self.server.url}/v1/internal/jobs/{self.job_id}/learners/{learner}/reports",
            content=body,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            timeout=10,
        )

    def last_seq(self) -> int:
        answer = self.post([])
        assert answer.status_code == 200, answer.text
        return int(answer.json()["last_seq"])


def log_item(seq: int, text: str) -> dict[str, Any]:
    return {"type": "log", "seq": seq, "time": 1.7e9, "stream": "stdout", "text": text}


def _texts(server: LiveServer, job_id: str) -> list[str]:
    return [line["line"] for line in server.loglines(job_id)]


def _started(server: LiveServer) -> tuple[str, Forger]:
    job_id = server.submit_ok(manifest_yaml("python w.py", gpus=0), {"w.py": WAIT_FOR_GO})
    wait_for(lambda: "first" in _texts(server, job_id), timeout=60, what="the first line")
    return job_id, Forger(server, job_id)


def _let_go(server: LiveServer, job_id: str) -> None:
    (JobDirs.of(server.home / "jobs", job_id).data / "go").write_text("")


def test_forged_reports_cannot_mute_the_log_nor_reach_an_ended_job(server: LiveServer) -> None:
    job_id, forger = _started(server)
    last = forger.last_seq()
    stored = len(_texts(server, job_id))

    # A jump far ahead would make every genuine item look old: refused, nothing stored.
    jump = forger.post([log_item(2**62, "muted?")])
    assert jump.status_code == 409
    assert jump.json()["detail"] == {"expected_seq": last + 1, "got": 2**62}
    assert forger.post([log_item(last + 1, "a"), log_item(last + 3, "b")]).status_code == 400
    for bad_seq in (2**63, 0, -1, "7", 1.5):
        answer = forger.post([{**log_item(last + 1, "x"), "seq": bad_seq}])
        assert answer.status_code == 400, (bad_seq, answer.text)
    assert len(_texts(server, job_id)) == stored

    # Items with numbers that cannot be stored are dropped one by one with a warning; the
    # rest of their batch is stored. NaN is spelt raw, as a careless JSON encoder would.
    seq = last + 1
    metric = '{"type": "emetric", "seq": %d, "time": %s, "iteration": %s, "values": %s}'
    raw_items = [
        metric % (seq, "1.7e9", str(2**63), '{"loss": 1}'),
        metric % (seq + 1, "1e308", "1", '{"loss": 1}'),
        metric % (seq + 2, "1.7e9", "2", '{"loss": NaN}'),
        metric % (seq + 3, "1.7e9", "3", '{"loss": 0.25}'),
        json.dumps({**log_item(seq + 4, "x"), "time": float("inf")}),
    ]
    # The forgery runs the stream well past anything the real controller has queued, so its
    # next batches all look old to the API until it renumbers them.
    raw_items += [json.dumps(log_item(seq + 5 + i, f"forged {i}")) for i in range(60)]
    answer = forger.post(", ".join(raw_items))
    assert answer.status_code == 200, answer.text
    assert (answer.json()["accepted"], answer.json()["dropped"]) == (65, 4)
    texts = _texts(server, job_id)
    assert f"[ffdl] dropped emetric (report item {seq}): iteration out of range" in texts
    assert f"[ffdl] dropped emetric (report item {seq + 1}): time out of range" in texts
    assert f"[ffdl] dropped emetric (report item {seq + 2}): value 'loss' is not finite" in texts
    assert f"[ffdl] dropped log (report item {seq + 4}): time out of range" in texts
    records = server.client.get(f"/v1/logs/{job_id}/emetrics").json()["models"]
    assert [r["etimes"]["iteration"]["value"] for r in records] == ["3"]

    # The real controller's lines still arrive after all this, and the job completes.
    _let_go(server, job_id)
    server.wait_status(job_id, {"COMPLETED"})
    texts = _texts(server, job_id)
    assert "after the forgery" in texts
    assert texts.index("after the forgery") > texts.index("forged 59")

    # The job has ended: new items are refused; resending old ones is still harmless.
    done = forger.last_seq()
    assert forger.post([log_item(done + 1, "late")]).status_code == 410
    again = forger.post([log_item(done, "dup")])
    assert again.status_code == 200 and again.json()["accepted"] == 0
    assert "late" not in _texts(server, job_id) and "dup" not in _texts(server, job_id)


def test_illegal_statuses_and_bad_numbers_in_a_report_are_never_a_server_error(
    server: LiveServer,
) -> None:
    job_id, forger = _started(server)
    for body in (
        {"attempt": 2**63, "items": []},
        {"attempt": -1, "items": []},
        {"attempt": forger.attempt, "items": "nope"},
    ):
        assert forger.post_raw(json.dumps(body)).status_code == 400
    response = forger.post_raw(json.dumps({"attempt": forger.attempt, "items": []}), 2**63)
    assert response.status_code == 400
    assert response.json()["detail"] == {"field": "learner"}

    last = forger.last_seq()
    status = {"type": "status", "seq": last + 1, "time": 1.7e9, "status": "DOWNLOADING"}
    unknown = {**status, "seq": last + 2, "status": "ROOT"}
    huge_exit = {**status, "seq": last + 3, "status": "FAILED", "exit_code": 2**70}
    answer = forger.post([status, unknown, huge_exit])
    assert answer.status_code == 200, answer.text
    texts = _texts(server, job_id)
    assert "[ffdl] ignored status DOWNLOADING: not allowed after PROCESSING" in texts
    assert "[ffdl] ignored unknown status 'ROOT'" in texts
    assert f"[ffdl] dropped status (report item {last + 3}): exit code out of range" in texts
    assert server.status(job_id) == "PROCESSING"
    _let_go(server, job_id)
    server.wait_status(job_id, {"COMPLETED"})
