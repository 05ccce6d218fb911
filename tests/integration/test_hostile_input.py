"""Hostile numbers and text at the HTTP API of a real server: every out-of-range integer is a
400 naming its field, never a 500; repeated manifest keys are refused; the trained-model
download never follows a link out of the job's results.

One server serves the module (``shared_server``): what each test sends is refused and
changes nothing, which each test checks against what the server held before it."""

from __future__ import annotations

import io
import json
import sqlite3
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.live import LiveServer, manifest_yaml

HUGE = [2**63, 2**64, -(2**64), 10**30]
WRITE_RESULTS = """
import os, pathlib, sys
results = pathlib.Path(os.environ["RESULT_DIR"])
(results / "model.txt").write_text("weights")
os.symlink(sys.argv[1], results / "leak")
os.symlink(os.path.dirname(sys.argv[1]), results / "hostdir")
print("results written", flush=True)
"""


def assert_bad_request(response: httpx.Response, field: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "error", "description", "ffdl_code", "detail"}
    assert body["code"] == 400 and body["error"] == "Bad Request"
    assert field in body["description"]
    return body


@pytest.fixture(scope="module")
def finished_job(shared_server: LiveServer) -> str:
    job_id = shared_server.submit_ok(manifest_yaml("echo hello", gpus=0))
    shared_server.wait_status(job_id, {"COMPLETED"})
    return job_id


@pytest.mark.parametrize("kind", ["loglines", "emetrics"])
def test_log_paging_numbers_are_range_checked(
    shared_server: LiveServer, finished_job: str, kind: str
) -> None:
    url = f"/v1/logs/{finished_job}/{kind}"
    for value in [*HUGE, "1e20", "1.5"]:
        assert_bad_request(shared_server.client.get(url, params={"pos": str(value)}), "pos")
    for value in [*HUGE, 0, -1, "1e20"]:
        assert_bad_request(
            shared_server.client.get(url, params={"pagesize": str(value)}), "pagesize"
        )
    for value in ["nan", "inf", "1e400", "-5.5", "-1e3", "-" + "9" * 30, "9" * 80, "1e300"]:
        assert_bad_request(
            shared_server.client.get(url, params={"since_time": value}), "since_time"
        )
    assert shared_server.client.get(url, params={"pos": str(-(2**63) + 1)}).status_code == 200
    for value in ["0", "-5", str(-(2**63) + 1)]:
        assert shared_server.client.get(url, params={"since_time": value}).status_code == 200


def test_list_and_patch_numbers_are_range_checked(
    shared_server: LiveServer, finished_job: str
) -> None:
    for value in [2**63, 2**64, -1, "1e20"]:
        response = shared_server.client.get("/v1/models", params={"offset": str(value)})
        assert_bad_request(response, "offset")
    # Values are checked before the job is looked at: the job's state does not matter.
    job_url = f"/v1/models/{finished_job}"
    for field, values in {
        "gpus": [*HUGE, 0, -1, 1e20, 2.5, "4", True],
        "priority": [*HUGE, -1, 101, 1e20, "50", False],
    }.items():
        for value in values:
            response = shared_server.client.patch(job_url, json={field: value})
            body = assert_bad_request(response, field)
            assert body["ffdl_code"] == "C104" and body["detail"] == {"field": field}
    response = shared_server.client.patch(job_url, json={"status": "h" * 1000})
    assert_bad_request(response, "status")
    # Python's JSON parser reads 1e400 as infinity and takes a bare NaN: still a 400.
    for raw in ('{"gpus": 1e400}', '{"priority": NaN}'):
        response = shared_server.client.patch(
            job_url, content=raw, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, response.text


def test_a_follow_stream_cursor_beyond_every_row_is_not_an_error(
    shared_server: LiveServer, finished_job: str
) -> None:
    url = f"/v1/models/{finished_job}/events/stream"
    with shared_server.client.stream("GET", url, params={"since_rindex": str(2**70)}) as response:
        assert response.status_code == 200
        text = "".join(response.iter_text())
    assert "event: end" in text


def test_drain_reasons_are_short(shared_server: LiveServer) -> None:
    response = shared_server.client.post("/v1/nodes/node-a/drain", json={"reason": "r" * 10_000})
    assert_bad_request(response, "reason")
    (node,) = shared_server.client.get("/v1/nodes").json()["nodes"]
    assert node["schedulable"] is True


def test_a_manifest_repeating_a_key_is_refused_naming_it(shared_server: LiveServer) -> None:
    before = shared_server.job_total()
    manifest = manifest_yaml("true", gpus=0) + "gpus: 64\n"
    body = assert_bad_request(shared_server.submit(manifest), "gpus")
    assert body["ffdl_code"] == "C101"
    assert body["detail"]["field"] == "gpus"
    assert "duplicate key 'gpus'" in body["detail"]["reason"]
    text = manifest_yaml("true", gpus=0) + "framework: {name: a, command: b, command: c}\n"
    body = assert_bad_request(shared_server.submit(text), "framework")
    assert body["detail"]["field"] in ("framework", "framework.command")
    assert shared_server.job_total() == before


def test_a_misspelled_manifest_key_is_refused_naming_the_field_meant(
    shared_server: LiveServer,
) -> None:
    before = shared_server.job_total()
    manifest = manifest_yaml("true", gpus=0) + "lerners: 4\n"
    body = assert_bad_request(shared_server.submit(manifest), "lerners")
    assert body["ffdl_code"] == "C101"
    assert body["detail"] == {
        "field": "lerners",
        "reason": "is not a manifest field: did you mean learners?",
    }
    nested = manifest_yaml("true", gpus=0).replace("command:", "commnd:")
    body = assert_bad_request(shared_server.submit(nested), "framework.commnd")
    assert body["detail"]["reason"] == "is not a manifest field: did you mean framework.command?"
    assert shared_server.job_total() == before
    # A key far from every field is still accepted, with a warning.
    response = shared_server.submit(manifest_yaml("true", gpus=0) + "team: vision\n")
    assert response.status_code == 201, response.text
    assert response.json()["warnings"] == ["unknown manifest field ignored: team"]


def test_long_names_and_descriptions_are_refused(shared_server: LiveServer) -> None:
    before = shared_server.job_total()
    assert_bad_request(shared_server.submit(manifest_yaml("true", name="n" * 201)), "name")
    response = shared_server.submit(manifest_yaml("true", description="d" * 5000))
    assert_bad_request(response, "description")
    assert shared_server.job_total() == before


def test_trained_model_download_never_follows_links(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    host = tmp_path / "host"
    host.mkdir()
    secret = host / "secret.txt"
    secret.write_text("host-only-9c1e")
    job_id = shared_server.submit_ok(
        manifest_yaml(f"python w.py {secret}", gpus=0), {"w.py": WRITE_RESULTS}
    )
    model = shared_server.wait_status(job_id, {"COMPLETED"})
    location = Path(model["results"]["location"])
    # Whatever the job managed to leave, the results directory may hold links planted later.
    (location / "planted").unlink(missing_ok=True)
    (location / "planted").symlink_to("/etc/hostname")
    response = shared_server.client.get(f"/v1/models/{job_id}/trained_model")
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    assert members["model.txt"] == b"weights"
    assert not {"leak", "planted"} & set(members)
    assert not any(name.startswith("hostdir/") for name in members)
    assert all(b"host-only-9c1e" not in content for content in members.values())
    host_name = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else None
    if host_name and host_name.strip():
        assert all(content != host_name for content in members.values())
    assert "planted (symbolic link to /etc/hostname)" in members["SKIPPED_LINKS.txt"].decode()


def test_report_json_with_nan_in_a_stored_metric_never_breaks_emetrics(
    shared_server: LiveServer, finished_job: str
) -> None:
    # A value stored before the report checks existed; the endpoint must still answer.
    with sqlite3.connect(shared_server.home / "ffdl.db") as connection:
        connection.execute(
            'INSERT INTO metrics (job_id, learner, attempt, seq, number, "group", iteration, '
            "\"values\", time) VALUES (?, 1, 99, 1, 1, 'train', 1, ?, ?)",
            (finished_job, json.dumps({"loss": float("nan"), "acc": 0.5}), float("inf")),
        )
    response = shared_server.client.get(f"/v1/logs/{finished_job}/emetrics")
    assert response.status_code == 200, response.text
    (record,) = response.json()["models"]
    assert record["values"] == {"acc": {"type": "FLOAT", "value": "0.5"}}
