"""The HTTP API's contract: errors, auth, paging and the follow stream, on a real server.

The tests share one server (``shared_server``): each looks only at the jobs it submits,
and a refused request is checked to change nothing against what the server held before
it. The list test counts every job, so it has a server of its own (``server``).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.integration.live import (
    LiveServer,
    followed_socket_lines,
    manifest_yaml,
    streamed_log_items,
)

PRINT_LINES = """
for i in range(1, 31):
    print(f"line {i}")
"""


# Waits for RESULT_DIR/go, then prints its name and a count, paced so that two jobs'
# reports reach the database interleaved.
TWO_AT_ONCE = """
import os, pathlib, sys, time
go = pathlib.Path(os.environ["RESULT_DIR"], "go")
while not go.exists():
    time.sleep(0.05)
for i in range(1, 61):
    print(f"{sys.argv[1]} {i}", flush=True)
    time.sleep(0.02)
"""


def _jobs_on_disk(server: LiveServer) -> list[str]:
    jobs = server.home / "jobs"
    return sorted(p.name for p in jobs.iterdir()) if jobs.exists() else []


def test_invalid_manifest_is_rejected_with_field_and_nothing_is_stored(
    shared_server: LiveServer,
) -> None:
    before_total, before_on_disk = shared_server.job_total(), _jobs_on_disk(shared_server)
    bad = manifest_yaml("python x.py", learners=0)
    response = shared_server.submit(bad)
    assert response.status_code == 400
    body = response.json()
    assert body["ffdl_code"] == "C104"
    assert body["detail"]["field"] == "learners"
    no_command = "name: x\nframework: {name: pytorch, version: '1'}\n"
    response = shared_server.submit(no_command)
    assert response.status_code == 400
    assert response.json()["ffdl_code"] == "C101"
    assert response.json()["detail"]["field"] == "framework.command"
    assert "Traceback" not in response.text
    assert shared_server.job_total() == before_total
    assert _jobs_on_disk(shared_server) == before_on_disk


def test_bad_archive_and_oversized_job_are_rejected(shared_server: LiveServer) -> None:
    before = _jobs_on_disk(shared_server)
    response = shared_server.client.post(
        "/v1/models",
        files={
            "manifest": ("m.yml", manifest_yaml("true").encode()),
            "model_definition": ("m.zip", b"not a zip"),
        },
    )
    assert response.status_code == 400
    assert response.json()["ffdl_code"] == "C102"
    too_big = manifest_yaml("true", gpus=64)
    response = shared_server.submit(too_big)
    assert response.status_code == 400
    assert response.json()["ffdl_code"] == "S100"
    missing_field = shared_server.client.post(
        "/v1/models", files={"manifest": ("m.yml", manifest_yaml("true").encode())}
    )
    assert missing_field.status_code == 400
    assert "model_definition" in missing_field.json()["description"]
    assert _jobs_on_disk(shared_server) == before


def test_an_object_store_without_its_secret_is_refused(shared_server: LiveServer) -> None:
    before = _jobs_on_disk(shared_server)
    manifest = manifest_yaml(
        "true",
        data_stores=[
            {
                "id": "cos",
                "type": "s3",
                "training_data": {"container": "in"},
                "connection": {"auth_url": "http://127.0.0.1:1", "user_name": "u"},
            }
        ],
    )
    response = shared_server.submit(manifest)
    assert response.status_code == 400
    assert response.json()["detail"]["field"] == "data_stores[0].connection.password"
    assert _jobs_on_disk(shared_server) == before


def test_requests_without_a_valid_token_are_refused(shared_server: LiveServer) -> None:
    assert httpx.get(f"{shared_server.url}/v1/models").status_code == 401
    response = httpx.get(f"{shared_server.url}/v1/models", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401
    assert response.json()["ffdl_code"] == "C103"
    assert httpx.get(f"{shared_server.url}/health").json()["status"] == "ok"


def test_unknown_model_is_404_json(shared_server: LiveServer) -> None:
    response = shared_server.client.get("/v1/models/training-missing")
    assert response.status_code == 404
    assert set(response.json()) == {"code", "error", "description", "ffdl_code", "detail"}


def test_loglines_paging_follows_ffdl_rules(shared_server: LiveServer) -> None:
    job_id = shared_server.submit_ok(manifest_yaml("python p.py"), {"p.py": PRINT_LINES})
    shared_server.wait_status(job_id, {"COMPLETED"})
    user = [i for i in shared_server.loglines(job_id) if i["line"].startswith("line ")]
    assert len(user) == 30
    everything = shared_server.loglines(job_id)
    first = shared_server.loglines(job_id, pagesize=5)
    assert [i["meta"]["rindex"] for i in first] == [i["meta"]["rindex"] for i in everything[:5]]
    tail = shared_server.loglines(job_id, pos=-1, pagesize=3)
    assert [i["line"] for i in tail] == [i["line"] for i in everything[-3:]]
    before_tail = shared_server.loglines(job_id, pos=-4, pagesize=3)
    assert [i["line"] for i in before_tail] == [i["line"] for i in everything[-6:-3]]
    later = shared_server.loglines(job_id, pos=10, pagesize=2)
    assert [i["line"] for i in later] == [i["line"] for i in everything[10:12]]
    counted_back = shared_server.loglines(job_id, since_time="-5", pagesize=2)
    assert [i["line"] for i in counted_back] == [i["line"] for i in everything[-5:-3]]
    default = shared_server.client.get(f"/v1/logs/{job_id}/loglines").json()["models"]
    assert [i["line"] for i in default] == [i["line"] for i in everything[:10]]
    bad = shared_server.client.get(f"/v1/logs/{job_id}/loglines", params={"pagesize": 0})
    assert bad.status_code == 400


def test_follow_stream_delivers_lines_status_and_end(shared_server: LiveServer) -> None:
    job_id = shared_server.submit_ok(manifest_yaml("python p.py"), {"p.py": PRINT_LINES})
    kinds: list[str] = []
    lines: list[str] = []
    statuses: list[str] = []
    with shared_server.client.stream("GET", f"/v1/models/{job_id}/events/stream") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        kind = ""
        for raw in response.iter_lines():
            if raw.startswith("event: "):
                kind = raw[len("event: ") :]
            elif raw.startswith("data: "):
                data = json.loads(raw[len("data: ") :])
                kinds.append(kind)
                if kind == "log":
                    lines.append(data["line"])
                elif kind == "status":
                    statuses.append(data["status"])
                elif kind == "end":
                    assert data["status"] == "COMPLETED"
                    break
    assert kinds[-1] == "end"
    assert [line for line in lines if line.startswith("line ")] == [
        f"line {i}" for i in range(1, 31)
    ]
    assert statuses[-1] == "COMPLETED"


def test_list_pages_and_filters(server: LiveServer) -> None:
    ids = [server.submit_ok(manifest_yaml("true", name=f"job-{i}")) for i in range(3)]
    listing = server.client.get("/v1/models", params={"limit": 2}).json()
    assert listing["total"] == 3
    assert len(listing["models"]) == 2
    assert listing["models"][0]["model_id"] == ids[-1]
    bad = server.client.get("/v1/models", params={"status": "SLEEPING"})
    assert bad.status_code == 400
    for job_id in ids:
        server.wait_status(job_id, {"COMPLETED"})
    done = server.client.get("/v1/models", params={"status": "completed"}).json()
    assert done["total"] == 3
    deleted = server.client.delete(f"/v1/models/{ids[0]}").json()
    assert deleted["deleted"] is True
    assert server.client.get(f"/v1/models/{ids[0]}").status_code == 404


def test_each_job_numbers_its_own_lines_the_same_in_every_view(shared_server: LiveServer) -> None:
    """Two jobs print at once; each job's lines are 1, 2, 3, ... in pages, counted back,
    from a stream cursor, and the followed text forms start where they are told."""
    jobs = {
        name: shared_server.submit_ok(
            manifest_yaml(f"python two.py {name}"), {"two.py": TWO_AT_ONCE}
        )
        for name in ("left", "right")
    }
    for job_id in jobs.values():
        shared_server.wait_status(job_id, {"PROCESSING"})
    for job_id in jobs.values():
        (Path(shared_server.model(job_id)["results"]["location"]) / "go").write_text("")
    for job_id in jobs.values():
        shared_server.wait_status(job_id, {"COMPLETED"})

    for name, job_id in jobs.items():
        everything = shared_server.loglines(job_id)
        texts = [item["line"] for item in everything]
        assert [t for t in texts if t.startswith(name)] == [f"{name} {i}" for i in range(1, 61)]
        assert [item["meta"]["rindex"] for item in everything] == list(range(1, len(texts) + 1))
        page = shared_server.loglines(job_id, pos=10, pagesize=5)
        assert [item["meta"]["rindex"] for item in page] == [11, 12, 13, 14, 15]
        back = shared_server.loglines(job_id, since_time="-5")
        assert [item["meta"]["rindex"] for item in back] == list(
            range(len(texts) - 4, len(texts) + 1)
        )
        streamed = streamed_log_items(shared_server, job_id, since_rindex=20)
        assert [item["meta"]["rindex"] for item in streamed] == list(range(21, len(texts) + 1))
        assert [item["line"] for item in streamed] == texts[20:]
        followed = shared_server.client.get(
            f"/v1/models/{job_id}/logs", params={"follow": "true", "since_time": "-7"}
        )
        assert followed.text.splitlines() == texts[-7:]
        assert followed_socket_lines(shared_server, job_id, "since_time=-7") == texts[-7:]
