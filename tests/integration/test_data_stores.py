"""Data stores on a real server: host paths confined to the operator's allow-list, and
credentials sealed in the database, redacted everywhere they are shown, erased at the end."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving

PASSWORD = "hunter2-never-stored-plain"
URL_PASSWORD = "url-pw-never-stored-plain"
READ_DATA = """
import os, pathlib
print("data:", sorted(p.name for p in pathlib.Path(os.environ["DATA_DIR"]).iterdir()))
"""


def local_store(path: Path | str, **changes: Any) -> dict[str, Any]:
    store: dict[str, Any] = {
        "id": "team",
        "type": "local",
        "training_data": {"container": "digits"},
        "connection": {"path": str(path)},
    }
    store.update(changes)
    return store


def test_host_paths_outside_the_allow_list_are_refused(tmp_path: Path) -> None:
    stores = tmp_path / "stores"
    (stores / "digits").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (stores / "escape").symlink_to(outside)
    config = {**FAST_CONFIG, "store_paths": [str(stores)]}
    with serving(LiveServer(home=tmp_path / "home", config=config)) as server:

        def refused(store: dict[str, Any]) -> dict[str, Any]:
            response = server.submit(manifest_yaml("true", gpus=0, data_stores=[store]))
            assert response.status_code == 400, response.text
            body: dict[str, Any] = response.json()
            return body

        body = refused(local_store("/etc"))
        assert body["ffdl_code"] == "C103"
        assert body["detail"]["field"] == "data_stores[0].connection.path"
        assert "'/etc' is outside the allowed store paths" in body["description"]
        body = refused(local_store(tmp_path / "home"))  # the platform's own home included
        assert body["ffdl_code"] == "C103"
        body = refused(local_store(stores, training_data={"container": "../../x"}))
        assert (body["ffdl_code"], body["detail"]["field"]) == (
            "C101",
            "data_stores[0].training_data.container",
        )
        body = refused(local_store(stores, training_data={"container": "escape"}))
        assert (body["ffdl_code"], body["detail"]["field"]) == (
            "C103",
            "data_stores[0].training_data.container",
        )
        body = refused(local_store(stores, training_results={"container": "/tmp"}))
        assert body["detail"]["field"] == "data_stores[0].training_results.container"
        assert server.client.get("/v1/models").json()["total"] == 0
        assert not (tmp_path / "home" / "jobs").exists() or not any(
            (tmp_path / "home" / "jobs").iterdir()
        )


def _database_bytes(home: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(home.glob("ffdl.db*")))


def _stored_connection(home: Path, job_id: str) -> dict[str, str]:
    with sqlite3.connect(home / "ffdl.db") as connection:
        row = connection.execute("SELECT manifest FROM jobs WHERE id = ?", (job_id,)).fetchone()
    stored: dict[str, str] = json.loads(row[0])["data_stores"][0]["connection"]
    return stored


def test_credentials_are_sealed_redacted_and_erased(server: LiveServer) -> None:
    # The default allow-list is HOME/stores.
    stores = server.home / "stores"
    (stores / "digits").mkdir(parents=True)
    (stores / "digits" / "train.csv").write_text("1,2,3\n")
    store = local_store(
        stores,
        connection={
            "path": str(stores),
            "user_name": "bob",
            "password": PASSWORD,
            "endpoint": f"http://bob:{URL_PASSWORD}@127.0.0.1:1/bucket",
        },
    )
    manifest = manifest_yaml("python r.py", gpus=0, data_stores=[store])
    job_id = server.submit_ok(manifest, {"r.py": READ_DATA})

    shown = server.model(job_id)["data_stores"][0]["connection"]
    assert shown == {
        "path": str(stores),
        "user_name": "bob",
        "password": "***",
        "endpoint": "http://bob:***@127.0.0.1:1/bucket",
    }
    listed = server.client.get("/v1/models").json()["models"][0]["data_stores"][0]
    assert listed["connection"] == shown
    sealed = _stored_connection(server.home, job_id)
    assert sealed["password"].startswith("fernet:")
    assert sealed["endpoint"].startswith("http://bob:fernet:")
    for secret in (PASSWORD, URL_PASSWORD):
        assert secret.encode() not in _database_bytes(server.home)

    model = server.wait_status(job_id, {"COMPLETED"})
    assert "data: ['train.csv']" in [line["line"] for line in server.loglines(job_id)]
    erased = _stored_connection(server.home, job_id)
    assert erased["password"] == "erased"
    assert erased["endpoint"] == "http://bob:erased@127.0.0.1:1/bucket"
    assert erased["path"] == str(stores)
    assert server.model(job_id)["data_stores"][0]["connection"]["password"] == "***"
    everything = json.dumps([model, server.loglines(job_id)]) + server.log_tail(10_000)
    for secret in (PASSWORD, URL_PASSWORD):
        assert secret not in everything
        assert secret.encode() not in _database_bytes(server.home)
