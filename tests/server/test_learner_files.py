"""``/v1/internal``'s file routes on a real server: a job's code for its learners, and their
results and logs coming back, all behind the job token (learners on machines that cannot
reach the platform's disk use them)."""

from __future__ import annotations

import io
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ffdl.learner.remote_files import RemoteFileError, fetch_code
from ffdl.server.auth import JobTokens, load_or_create_secret
from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    code_zip,
    manifest_yaml,
    serving,
)

CODE = {"train.py": "print('training')\n", "lib/util.py": "X = 1\n"}
MAX_ARCHIVE_BYTES = 200_000


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("learner-files") / "home"
    config = {**FAST_CONFIG, "max_archive_bytes": MAX_ARCHIVE_BYTES}
    with serving(LiveServer(home=home, config=config)) as server:
        yield server


@pytest.fixture(scope="module")
def running_job(live: LiveServer) -> str:
    """A two-learner job whose learners wait: it has not ended while the tests run."""
    response = live.client.post(
        "/v1/models",
        files={
            "manifest": ("m.yml", manifest_yaml("sleep 600", learners=2).encode(), "text/yaml"),
            "model_definition": ("model.zip", code_zip(CODE), "application/zip"),
        },
    )
    assert response.status_code == 201, response.text
    job_id = str(response.json()["model_id"])
    live.wait_status(job_id, {"PROCESSING"})
    return job_id


def token_of(live: LiveServer, job_id: str) -> str:
    return JobTokens(load_or_create_secret(live.home)).issue(job_id)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def zipped(entries: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


def put_results(live: LiveServer, job_id: str, learner: int, body: bytes) -> httpx.Response:
    return httpx.put(
        f"{live.url}/v1/internal/jobs/{job_id}/learners/{learner}/results",
        content=body,
        headers={**bearer(token_of(live, job_id)), "Content-Type": "application/zip"},
        timeout=30,
    )


def trained_model(live: LiveServer, job_id: str) -> dict[str, bytes]:
    response = live.client.get(f"/v1/models/{job_id}/trained_model")
    assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def leftovers(live: LiveServer, job_id: str) -> list[str]:
    """Temporary files and directories an upload could have left in the job's directory."""
    root = live.home / "jobs" / job_id
    return sorted(
        p.name for p in [*root.iterdir(), *(live.home / "jobs").iterdir()] if ".up" in p.name
    )


def test_the_code_archive_goes_to_the_job_token_only(live: LiveServer, running_job: str) -> None:
    url = f"{live.url}/v1/internal/jobs/{running_job}/code"

    fetched = httpx.get(url, headers=bearer(token_of(live, running_job)), timeout=30)

    assert fetched.status_code == 200
    assert fetched.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(fetched.content)) as archive:
        assert {name: archive.read(name).decode() for name in archive.namelist()} == CODE
    assert httpx.get(url, timeout=30).status_code == 401
    assert httpx.get(url, headers=bearer("wrong"), timeout=30).status_code == 401
    # A user's API token is not a job token.
    assert live.client.get(f"/v1/internal/jobs/{running_job}/code").status_code == 401
    unknown = "training-nosuchjob"
    missing = httpx.get(
        f"{live.url}/v1/internal/jobs/{unknown}/code",
        headers=bearer(token_of(live, unknown)),
        timeout=30,
    )
    assert missing.status_code == 404


def test_fetch_code_writes_the_archive_and_names_the_refusal(
    live: LiveServer, running_job: str, tmp_path: Path
) -> None:
    destination = tmp_path / "node" / "model.zip"

    size = fetch_code(live.url, token_of(live, running_job), running_job, str(destination))

    assert size == destination.stat().st_size == len(code_zip(CODE))
    with pytest.raises(RemoteFileError, match=rf"GET {live.url}/v1/internal/.*/code: HTTP 401"):
        fetch_code(live.url, "wrong", running_job, str(tmp_path / "other.zip"))
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["model.zip", "node"]


def test_results_and_logs_uploaded_are_what_the_job_downloads(
    live: LiveServer, running_job: str
) -> None:
    first = zipped(
        {
            "model/weights.bin": b"\x00\x01" * 1000,
            "summary.txt": b"accuracy 0.9\n",
            "logs/learner-1/training-log.txt": b"epoch 1\n",
        }
    )
    second = zipped({"logs/learner-2/training-log.txt": b"learner two\n"})

    stored = put_results(live, running_job, 1, first)
    assert stored.status_code == 200, stored.text
    assert stored.json() == {"files": 3, "bytes": 2000 + 13 + 8}
    assert put_results(live, running_job, 2, second).status_code == 200
    # Sent again (a retry after a lost answer): the same files, not twice.
    assert put_results(live, running_job, 1, first).status_code == 200

    files = trained_model(live, running_job)
    assert files["model/weights.bin"] == b"\x00\x01" * 1000
    assert files["summary.txt"] == b"accuracy 0.9\n"
    assert files["logs/learner-1/training-log.txt"] == b"epoch 1\n"
    assert files["logs/learner-2/training-log.txt"] == b"learner two\n"
    assert leftovers(live, running_job) == []


@pytest.mark.parametrize(
    ("learner", "body", "named"),
    [
        (2, zipped({"logs/learner-2/ok.txt": b"ok", "intruder.txt": b"results"}), "intruder.txt"),
        (2, zipped({"logs/learner-3/intruder.txt": b"x"}), "logs/learner-3/intruder.txt"),
        (1, zipped({"logs/learner-2/intruder.txt": b"x"}), "logs/learner-2/intruder.txt"),
        (1, zipped({"intruder.txt": b"x"}, links={"passwd": "/etc/passwd"}), "symbolic link"),
        (1, zipped({"../intruder.txt": b"x"}), "unsafe path"),
        (1, b"not a zip at all", "not a valid zip"),
    ],
)
def test_an_upload_out_of_bounds_is_refused_and_writes_nothing(
    live: LiveServer, running_job: str, learner: int, body: bytes, named: str
) -> None:
    before = trained_model(live, running_job)

    refused = put_results(live, running_job, learner, body)

    assert refused.status_code == 400, refused.text
    assert named in refused.json()["description"]
    assert trained_model(live, running_job) == before
    assert not any("intruder" in name for name in before)
    assert leftovers(live, running_job) == []


def test_uploads_need_the_job_token_a_learner_and_a_size_within_limits(
    live: LiveServer, running_job: str
) -> None:
    url = f"{live.url}/v1/internal/jobs/{running_job}/learners/1/results"
    body = zipped({"a.txt": b"a"})
    assert httpx.put(url, content=body, timeout=30).status_code == 401
    assert httpx.put(url, content=body, headers=bearer("wrong"), timeout=30).status_code == 401
    assert put_results(live, running_job, 9, body).status_code == 404
    huge = zipped({"big.bin": bytes(range(256)) * 1000})
    assert len(huge) > MAX_ARCHIVE_BYTES
    too_large = put_results(live, running_job, 1, huge)
    assert too_large.status_code == 413, too_large.text
    # Sent in chunks, without a length to refuse up front: cut off as it arrives.
    chunked = httpx.put(
        url,
        content=iter([huge[:100_000], huge[100_000:]]),
        headers=bearer(token_of(live, running_job)),
        timeout=30,
    )
    assert chunked.status_code == 413, chunked.text
    assert "big.bin" not in trained_model(live, running_job)
    assert leftovers(live, running_job) == []


def test_an_ended_job_takes_no_upload_and_gives_no_code(live: LiveServer) -> None:
    job_id = live.submit_ok(manifest_yaml("sleep 600"), CODE)
    live.wait_status(job_id, {"PROCESSING"})
    assert live.client.patch(f"/v1/models/{job_id}", json={"status": "cancel"}).status_code < 300
    live.wait_status(job_id, {"CANCELLED"})

    refused = put_results(live, job_id, 1, zipped({"late.txt": b"late"}))
    code = httpx.get(
        f"{live.url}/v1/internal/jobs/{job_id}/code",
        headers=bearer(token_of(live, job_id)),
        timeout=30,
    )

    assert (refused.status_code, code.status_code) == (410, 410)
