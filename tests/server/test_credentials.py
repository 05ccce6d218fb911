"""Data-store credentials at rest: sealed with the platform's credential key, opened only
for deploying, erased by the status gate when a job ends; on a real SQLite file."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ffdl.core.status import JobStatus
from ffdl.server.auth import JobTokens
from ffdl.server.credentials import (
    ERASED,
    CredentialError,
    CredentialVault,
    decrypt_connection,
    derive_fernet_key,
    erase_manifest_secrets,
)
from ffdl.server.store.models import Job
from ffdl.server.store.transitions import set_job_status
from tests.server.factories import make_job, make_store

SECRET = bytes(range(32))
CONNECTION = {
    "path": "/stores/team",
    "user_name": "bob",
    "password": "hunter2-plain",
    "secret_key": "s3cr3t-plain",
    "endpoint": "http://bob:url-pw-plain@127.0.0.1:9000/bucket",
    "region": "",
    "api_token": "",
}


def manifest_data(connection: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": "job",
        "framework": {"name": "custom", "command": "true"},
        "data_stores": [
            {"id": "s", "type": "local", "connection": dict(connection or CONNECTION)},
        ],
    }


def test_sealed_connections_hold_no_plain_secret_and_open_again() -> None:
    vault = CredentialVault(SECRET)
    sealed = vault.seal_connection(CONNECTION)
    text = json.dumps(sealed)
    for plain in ("hunter2-plain", "s3cr3t-plain", "url-pw-plain"):
        assert plain not in text
    assert sealed["password"].startswith("fernet:")
    assert sealed["endpoint"].startswith("http://bob:fernet:")
    assert sealed["endpoint"].endswith("@127.0.0.1:9000/bucket")
    # Non-secret values and empty secrets stay as they were.
    assert (sealed["path"], sealed["user_name"], sealed["api_token"]) == ("/stores/team", "bob", "")
    assert vault.seal_connection(sealed) == sealed  # sealing twice changes nothing
    assert decrypt_connection(vault, sealed) == CONNECTION


def test_only_the_platform_secret_opens_them() -> None:
    sealed = CredentialVault(SECRET).seal_connection(CONNECTION)
    with pytest.raises(CredentialError) as caught:
        decrypt_connection(CredentialVault(bytes(32)), sealed)
    assert caught.value.code == "C103"
    assert "hunter2" not in caught.value.message


def test_the_credential_key_is_not_the_job_token_key() -> None:
    fernet_key = base64.urlsafe_b64decode(derive_fernet_key(SECRET))
    assert fernet_key != SECRET
    token = bytes.fromhex(JobTokens(SECRET).issue("training-x"))
    assert fernet_key != token and len(fernet_key) == 32


def test_erasing_overwrites_every_secret_and_keeps_the_rest() -> None:
    sealed = CredentialVault(SECRET).seal_manifest(manifest_data())
    erased = erase_manifest_secrets(sealed)
    assert erased is not None
    connection = erased["data_stores"][0]["connection"]
    assert connection["password"] == ERASED and connection["secret_key"] == ERASED
    assert connection["endpoint"] == f"http://bob:{ERASED}@127.0.0.1:9000/bucket"
    assert connection["path"] == "/stores/team" and connection["api_token"] == ""
    assert erase_manifest_secrets(erased) is None
    assert erase_manifest_secrets({"name": "no stores"}) is None
    with pytest.raises(CredentialError, match="erased"):
        decrypt_connection(CredentialVault(SECRET), connection)


def _raw_manifest(db: Path, job_id: str) -> str:
    with sqlite3.connect(db) as connection:
        row = connection.execute("SELECT manifest FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return str(row[0])


@pytest.mark.parametrize("final", [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED])
def test_the_status_gate_erases_credentials_when_a_job_ends(
    tmp_path: Path, final: JobStatus
) -> None:
    store = make_store(tmp_path)
    vault = CredentialVault(SECRET)
    job_id = make_job(store, manifest=vault.seal_manifest(manifest_data()))
    db = tmp_path / "ffdl.db"
    stored = _raw_manifest(db, job_id)
    assert "hunter2-plain" not in stored and "fernet:" in stored
    path = [JobStatus.PENDING, JobStatus.PROCESSING, JobStatus.STORING]
    steps = [*path, final] if final == JobStatus.COMPLETED else [JobStatus.PENDING, final]
    for status in steps:
        with store.write() as session:
            job = session.get(Job, job_id)
            assert job is not None
            set_job_status(session, job, status, "test")
            if status != final:
                # Secrets live as long as the job may still deploy.
                assert "fernet:" in json.dumps(job.manifest)
    stored = json.loads(_raw_manifest(db, job_id))
    connection = stored["data_stores"][0]["connection"]
    assert connection["password"] == ERASED and "fernet:" not in json.dumps(stored)
    assert connection["path"] == "/stores/team"


def test_a_halted_job_keeps_its_credentials_to_resume(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    job_id = make_job(store, manifest=CredentialVault(SECRET).seal_manifest(manifest_data()))
    with store.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        set_job_status(session, job, JobStatus.HALTED, "halted while queued")
    assert "fernet:" in _raw_manifest(tmp_path / "ffdl.db", job_id)
