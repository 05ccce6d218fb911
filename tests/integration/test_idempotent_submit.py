"""``POST /v1/models`` with an ``Idempotency-Key`` on a real server: a retry gets the job
the key made (200, same model_id and Location), never a second one, also after a restart,
while the server is down, and when the first answer was lost on its way; another manifest
or archive under the same key is a 409; the key's unique index reaches older databases."""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ffdl.client.http import Client, new_idempotency_key
from tests.integration.live import LiveServer, code_zip, manifest_yaml, serving, wait_for

MANIFEST = manifest_yaml("python -c 'import time; time.sleep(30)'", gpus=0)
# Made once: a zip made again a second later differs (its entries carry their time), and
# a retry must send the same bytes.
ARCHIVE = code_zip({"train.py": "print('hi')\n"})


def post(
    server: LiveServer,
    key: str | None,
    manifest: str = MANIFEST,
    archive: bytes = ARCHIVE,
    client: httpx.Client | None = None,
) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return (client or server.client).post(
        "/v1/models",
        headers=headers,
        files={
            "manifest": ("manifest.yml", manifest.encode(), "application/x-yaml"),
            "model_definition": ("model.zip", archive, "application/zip"),
        },
    )


def job_ids(server: LiveServer) -> list[str]:
    body: dict[str, Any] = server.client.get("/v1/models").json()
    return sorted(model["model_id"] for model in body["models"])


def test_a_retried_submit_gets_the_same_job_and_a_changed_one_a_409(server: LiveServer) -> None:
    key = new_idempotency_key()
    first = post(server, key)
    assert first.status_code == 201, first.text
    again = post(server, key)
    assert again.status_code == 200, again.text
    job_id = first.json()["model_id"]
    assert again.json()["model_id"] == job_id
    assert again.headers["Location"] == first.headers["Location"] == f"/v1/models/{job_id}"
    assert again.json()["location"] == first.json()["location"]
    assert job_ids(server) == [job_id]

    changed = post(server, key, manifest=manifest_yaml("true", gpus=0))
    assert changed.status_code == 409, changed.text
    assert changed.json()["detail"] == {"field": "Idempotency-Key", "model_id": job_id}
    assert key in changed.json()["description"] and job_id in changed.json()["description"]
    other_code = post(server, key, archive=code_zip({"train.py": "print('bye')\n"}))
    assert other_code.status_code == 409, other_code.text

    # Without a key, or with another one, every submit is a new job.
    assert post(server, None).status_code == 201
    assert post(server, new_idempotency_key()).status_code == 201
    assert len(job_ids(server)) == 3


def test_keys_are_checked_and_belong_to_their_user(server: LiveServer) -> None:
    assert post(server, "k" * 201).status_code == 400
    refused = post(server, "k" * 201).json()
    assert refused["detail"] == {"field": "Idempotency-Key"}
    assert "200" in refused["description"]
    assert post(server, "k" * 200).status_code == 201
    assert post(server, "tab\tinside").status_code == 400

    created = server.client.post("/v1/tenants/default/users", json={"name": "bob"})
    assert created.status_code == 201, created.text
    with httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {created.json()['token']}"},
        timeout=30,
    ) as bob:
        # The same key from another user is that user's own.
        theirs = post(server, "k" * 200, client=bob)
        assert theirs.status_code == 201, theirs.text
    assert len(job_ids(server)) == 2


def write_code(tmp_path: Path) -> tuple[Path, Path]:
    manifest = tmp_path / "manifest.yml"
    manifest.write_text(MANIFEST)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    return manifest, code


def test_the_client_retries_through_a_restart_with_the_same_key(tmp_path: Path) -> None:
    manifest, code = write_code(tmp_path)
    server = LiveServer(home=tmp_path / "home")
    with serving(server):
        key = new_idempotency_key()
        with Client(server.url, server.token) as client:
            job_id = client.submit(manifest, code, idempotency_key=key)["model_id"]
        server.stop()
        server.start()
        with Client(server.url, server.token) as client:
            assert client.submit(manifest, code, idempotency_key=key)["model_id"] == job_id

        # Submitted while the server is down: the client retries until it is back.
        server.stop()
        retries: list[str] = []
        outcome: dict[str, Any] = {}

        def submit() -> None:
            with Client(server.url, server.token) as client:
                outcome.update(
                    client.submit(
                        manifest,
                        code,
                        retries=30,
                        retry_delay=0.2,
                        on_retry=lambda error, delay: retries.append(error.code),
                    )
                )

        thread = threading.Thread(target=submit)
        thread.start()
        wait_for(lambda: retries, timeout=30, what="a retry")
        server.start()
        thread.join(60)
        assert not thread.is_alive()
        assert set(retries) == {"UNREACHABLE"}
        assert sorted(job_ids(server)) == sorted([job_id, outcome["model_id"]])


class AnswerLosingProxy:
    """A TCP proxy to the server that, for its first connection, passes the request on but
    closes the client's socket instead of answering: the response is lost, as when the
    server crashes right after committing."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self.answers_lost = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            lose = self.connections == 1
            threading.Thread(target=self._relay, args=(client, lose), daemon=True).start()

    def _relay(self, client: socket.socket, lose: bool) -> None:
        upstream = socket.create_connection(("127.0.0.1", self._target))
        with client, upstream:
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            first = upstream.recv(65536)
            if lose:
                # The server answered (so it committed); the client never hears it. A
                # shutdown, unlike a close, also ends the relay thread's pending read.
                self.answers_lost += 1
                client.shutdown(socket.SHUT_RDWR)
                return
            while first:
                client.sendall(first)
                first = upstream.recv(65536)

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)


@contextlib.contextmanager
def losing_proxy(server: LiveServer) -> Iterator[AnswerLosingProxy]:
    proxy = AnswerLosingProxy(server.port)
    try:
        yield proxy
    finally:
        proxy.close()


def test_a_lost_answer_is_retried_into_the_same_job(server: LiveServer, tmp_path: Path) -> None:
    manifest, code = write_code(tmp_path)
    with losing_proxy(server) as proxy:
        with Client(f"http://127.0.0.1:{proxy.port}", server.token) as client:
            created = client.submit(manifest, code, retry_delay=0.05)
        assert proxy.answers_lost == 1
        assert proxy.connections >= 2
    assert job_ids(server) == [created["model_id"]]


# The columns revision 0003 added to tables of the first revision.
LATER_COLUMNS = {
    "jobs": (
        "first_queue_eta_at",
        "progress",
        "estimated_end_at",
        "gpu_util_avg",
        "gpu_util_span_s",
        "gpu_idle_since",
        "gpu_idle_flagged_at",
        "archived_line_number",  # revision 0006
        "archived_metric_number",
        "gpu_types",  # revision 0007
        "mix_gpu_types",
        "pinned_gpu_type",  # revision 0008
        "rho",
    ),
    "learners": ("gpu_util", "gpu_memory_mb", "gpu_power_w", "gpu_stats", "gpu_sampled_at"),
}
# Indexes of later revisions: 0003 (counting by status), 0005 and 0010 (the list order).
LATER_INDEXES = ("ix_jobs_tenant_status", "ix_jobs_submitted_id", "ix_jobs_tenant_submitted_id")
NUMBERED = {"log_lines": "last_line_number", "metrics": "last_metric_number"}


def test_the_key_index_is_added_to_an_older_database(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = LiveServer(home=home)
    with serving(server):
        pass
    with contextlib.closing(sqlite3.connect(home / "ffdl.db")) as db, db:
        db.execute("DROP INDEX ux_jobs_user_idempotency")
        db.execute("ALTER TABLE jobs DROP COLUMN idempotency_key")
        db.execute("ALTER TABLE jobs DROP COLUMN idempotency_digest")
        # What a database from before migrations looked like: no revision, and nothing that
        # later revisions (0002 to 0010) added.
        db.execute("DROP TABLE alembic_version")
        for table in ("leases", "replicas", "gpu_samples", "cluster_samples", "record_chunks"):
            db.execute(f"DROP TABLE {table}")
        for index in LATER_INDEXES:
            db.execute(f"DROP INDEX {index}")
        for table, counter in NUMBERED.items():
            db.execute(f"DROP INDEX ux_{table}_job_number")
            db.execute(f"ALTER TABLE {table} DROP COLUMN number")
            db.execute(f"ALTER TABLE jobs DROP COLUMN {counter}")
        for table, columns in LATER_COLUMNS.items():
            for column in columns:
                db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    with serving(server):
        with contextlib.closing(sqlite3.connect(home / "ffdl.db")) as db:
            indexes = {row[1]: row[2] for row in db.execute("PRAGMA index_list(jobs)")}
        assert indexes.get("ux_jobs_user_idempotency") == 1  # unique
        key = new_idempotency_key()
        assert post(server, key).status_code == 201
        assert post(server, key).status_code == 200
        assert len(job_ids(server)) == 1
