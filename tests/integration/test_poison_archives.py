"""Corrupt uploads stay their submitter's problem: refused at submit, or failed alone.

Every member of an archive is read at submit, so a bad CRC, a broken deflate stream or a
lying size is a 400 C102 and nothing is stored. An archive that goes bad on disk after
submit fails its own job at deploy (C102) while another tenant's jobs deploy and complete.
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.live import LiveServer, code_zip, manifest_yaml, serving, wait_for

TRAIN = {"train.py": "print('trained')\n" + "# padding\n" * 200}
BLOCKER = """
import os, time
while not os.path.exists(os.path.join(os.environ["JOB_STATE_DIR"], "release")):
    time.sleep(0.05)
"""


def _zip(compression: int) -> bytearray:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        archive.writestr("train.py", TRAIN["train.py"])
    return bytearray(buffer.getvalue())


def bad_crc() -> bytes:
    data = _zip(zipfile.ZIP_STORED)
    at = data.index(b"# padding")
    data[at] ^= 0xFF  # the stored bytes no longer match the CRC
    return bytes(data)


def bad_deflate() -> bytes:
    data = _zip(zipfile.ZIP_DEFLATED)
    header = data.index(b"PK\x03\x04")
    name_len, extra_len = struct.unpack_from("<HH", data, header + 26)
    start = header + 30 + name_len + extra_len
    for offset in range(start, start + 12):
        data[offset] = 0xFF  # garbage where the deflate stream begins
    return bytes(data)


def lying_size() -> bytes:
    data = _zip(zipfile.ZIP_DEFLATED)
    central = data.index(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 24, 10)  # declares 10 bytes; holds far more
    return bytes(data)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path_factory.mktemp("poison") / "home")) as live:
        yield live


def _submit(server: LiveServer, archive: bytes, token: str, **manifest: object) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/models",
        headers={"Authorization": f"Bearer {token}"},
        files={
            "manifest": ("manifest.yml", manifest_yaml("python train.py", **manifest).encode()),
            "model_definition": ("model.zip", archive, "application/zip"),
        },
        timeout=30,
    )


@pytest.mark.parametrize("poison", [bad_crc, bad_deflate, lying_size])
def test_a_corrupt_archive_is_refused_at_submit_and_nothing_is_stored(
    server: LiveServer, poison: object
) -> None:
    before = server.client.get("/v1/models").json()["total"]
    response = _submit(server, poison(), server.token)  # type: ignore[operator]
    assert response.status_code == 400, response.text
    assert response.json()["ffdl_code"] == "C102"
    assert "train.py" in response.json()["description"]
    assert server.client.get("/v1/models").json()["total"] == before


def test_an_archive_gone_bad_fails_its_own_job_and_others_deploy(server: LiveServer) -> None:
    admin = server.client
    assert admin.post("/v1/tenants", json={"id": "team-b"}).status_code == 201
    other = admin.post("/v1/tenants/team-b/users", json={"name": "bob"}).json()["token"]
    # Fill the node so that the next jobs wait in the queue while the archive is spoilt.
    blocker = server.submit_ok(manifest_yaml("python block.py", gpus=4), {"block.py": BLOCKER})
    server.wait_status(blocker, {"PROCESSING"})
    poisoned = _submit(server, code_zip(TRAIN), server.token).json()["model_id"]
    healthy = [_submit(server, code_zip(TRAIN), other).json()["model_id"] for _ in range(3)]
    (server.home / "jobs" / poisoned / "model.zip").write_bytes(bad_deflate())
    (server.home / "jobs" / blocker / "state" / "release").touch()

    failed = server.wait_status(poisoned, {"FAILED"})["training"]["training_status"]
    assert failed["error_code"] == "C102", failed
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {other}"}) as bob:

        def completed(job_id: str) -> bool:
            status = bob.get(f"/v1/models/{job_id}").json()["training"]["training_status"]
            assert status["status"] != "FAILED", status
            return bool(status["status"] == "COMPLETED")

        for job_id in healthy:
            wait_for(lambda job_id=job_id: completed(job_id), timeout=60, what=f"{job_id}")
