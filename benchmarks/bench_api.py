"""The API with 10,000 jobs in the store: submits per second and list-page latency.

Goals: >= 200 submits/s on 2 cores; p99 of a 100-job list page < 50 ms. The cluster is one
node whose only slot is held by a seeded running job, so submitted jobs stay queued and
the measurement is the API and the store, not learner start-up.
"""

from __future__ import annotations

import http.client
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path

import httpx
from _server import LiveServer, code_zip, manifest_yaml, median, percentile

from ffdl.server.store.db import Store
from ffdl.server.store.models import Job
from ffdl.server.store.transitions import utcnow

SEEDED = 10_000
SUBMITS = 1_000
CLIENTS = 4
LIST_CALLS = 300
CONFIG = {
    "nodes": [{"name": "only", "gpus": 1, "cpus": 1, "memory": "4GiB", "gpu_type": "cpu"}],
    "scheduler_interval_s": 1.0,
}


def seed_jobs(database_url: str, count: int) -> None:
    """``count`` finished jobs, and one running job holding the only GPU slot."""
    store = Store(database_url)
    base = utcnow() - timedelta(days=30)
    rows = []
    for i in range(count):
        at = base + timedelta(seconds=i * 60)
        rows.append(
            Job(
                id=f"training-seed{i:06d}",
                tenant_id="default",
                user_id="admin",
                name=f"seed-{i}",
                manifest={
                    "name": f"seed-{i}",
                    "framework": {"name": "pytorch", "version": "2", "command": "python train.py"},
                },
                status="COMPLETED",
                reason="completed",
                learners=1,
                gpus=1,
                cpus=1.0,
                memory_mb=1024,
                submitted_at=at,
                started_at=at,
                finished_at=at,
                status_changed_at=at,
                attempt=1,
                exit_code=0,
            )
        )
    holder = Job(
        id="training-holder",
        tenant_id="default",
        user_id="admin",
        name="holder",
        manifest={"name": "holder", "framework": {"name": "custom", "command": "true"}},
        status="PROCESSING",
        reason="training",
        learners=1,
        gpus=1,
        cpus=1.0,
        memory_mb=1024,
        placement=[{"learner": 1, "node": "only", "gpu_ids": [0]}],
        submitted_at=utcnow(),
        started_at=utcnow(),
        status_changed_at=utcnow(),
        attempt=1,
    )
    with store.write() as session:
        session.add_all(rows)
        session.add(holder)
    store.dispose()


def multipart_body(manifest: bytes, archive: bytes) -> tuple[bytes, str]:
    """Encode the submit form once, so the load generator spends no CPU on it."""
    request = httpx.Request(
        "POST",
        "http://127.0.0.1/v1/models",
        files={"manifest": ("m.yml", manifest), "model_definition": ("c.zip", archive)},
    )
    return request.read(), request.headers["content-type"]


def submit_many(args: tuple[int, str, bytes, str, int]) -> list[float]:
    """One client process: ``count`` submits over one keep-alive connection."""
    port, token, body, content_type, count = args
    headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies = []
    for _ in range(count):
        t0 = time.perf_counter()
        connection.request("POST", "/v1/models", body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        assert response.status == 201, response.status
        latencies.append(time.perf_counter() - t0)
    connection.close()
    return latencies


def main() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        server = LiveServer(home=Path(tmp) / "home")
        server.config.update(CONFIG)
        server.start()
        server.stop()
        seed_jobs(f"sqlite:///{server.home / 'ffdl.db'}", SEEDED)
        server.start()
        try:
            manifest = manifest_yaml("python train.py", cpus=1, gpus=1).encode()
            archive = code_zip({"train.py": "print('hi')\n"})
            headers = {"Authorization": f"Bearer {server.token}"}

            body, content_type = multipart_body(manifest, archive)
            started = time.perf_counter()
            with ProcessPoolExecutor(CLIENTS) as pool:
                runs = pool.map(
                    submit_many,
                    [(server.port, server.token, body, content_type, SUBMITS // CLIENTS)] * CLIENTS,
                )
                submit_latencies = [t for ts in runs for t in ts]
            elapsed = time.perf_counter() - started

            list_latencies = []
            with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
                for i in range(LIST_CALLS):
                    t0 = time.perf_counter()
                    r = client.get("/v1/models", params={"limit": 100, "offset": (i % 50) * 100})
                    list_latencies.append(time.perf_counter() - t0)
                    assert r.status_code == 200
                total = client.get("/v1/models", params={"limit": 1}).json()["total"]
        finally:
            server.stop()
    result = {
        "jobs_in_store": float(total),
        "submits_per_s": SUBMITS / elapsed,
        "submit_p50_ms": median(submit_latencies) * 1000,
        "list_p50_ms": median(list_latencies) * 1000,
        "list_p99_ms": percentile(list_latencies, 99) * 1000,
    }
    print(f"API with {int(result['jobs_in_store'])} jobs in the store ({CLIENTS} clients)")
    print(
        f"  submits/s      {result['submits_per_s']:8.1f}   goal >= 200   "
        f"ratio {result['submits_per_s'] / 200:.2f}×"
    )
    print(f"  submit p50     {result['submit_p50_ms']:8.1f} ms")
    print(f"  list page p50  {result['list_p50_ms']:8.1f} ms")
    print(
        f"  list page p99  {result['list_p99_ms']:8.1f} ms   goal < 50 ms   "
        f"ratio {result['list_p99_ms'] / 50:.2f}× of goal"
    )
    return result


if __name__ == "__main__":
    main()
