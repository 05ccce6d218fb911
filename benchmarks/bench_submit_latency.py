"""Submit latency on the local backend: the POST itself, and submit → PROCESSING of a
trivial job (goal: median < 1 s).

``POST /v1/models`` is timed alone over a burst of submits (what a client waits for before
its job is acknowledged, and so durable: the store commits with ``synchronous=FULL``), then
submit → PROCESSING is measured two ways per job: by the server's own event times (QUEUED →
PROCESSING) and as a client sees it (POST sent → GET first shows PROCESSING or later, polled
every 10 ms).
"""

from __future__ import annotations

import tempfile
import time
from datetime import datetime
from pathlib import Path

from _server import LiveServer, manifest_yaml, median, percentile, wait_for

JOBS = 20
BURST = 100


def _post_latencies(server: LiveServer) -> list[float]:
    # Each is deleted (cancelled) straight away, so the burst does not queue ahead of the
    # jobs timed next; only the submit itself is timed.
    manifest = manifest_yaml("true", gpus=0, name="burst")
    latencies: list[float] = []
    for _ in range(BURST):
        sent = time.perf_counter()
        response = server.submit(manifest)
        latencies.append(time.perf_counter() - sent)
        assert response.status_code == 201, response.text
        server.client.delete(f"/v1/models/{response.json()['model_id']}")
    return latencies


def main() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        server = LiveServer(home=Path(tmp) / "home")
        server.start()
        try:
            posts = _post_latencies(server)
            server_side: list[float] = []
            client_side: list[float] = []
            manifest = manifest_yaml("python -c 'import time; time.sleep(0.5)'", gpus=0)
            for _ in range(JOBS):
                sent = time.perf_counter()
                job_id = server.submit_ok(manifest)

                def processing(job_id: str = job_id) -> bool:
                    status = server.status(job_id)
                    return status in {"PROCESSING", "STORING", "COMPLETED"}

                wait_for(processing, timeout=30, interval=0.01)
                client_side.append(time.perf_counter() - sent)
                model = server.wait_status(job_id, {"COMPLETED"})
                times = {e["to"]: e["time"] for e in model["events"] if e["learner"] is None}
                queued = datetime.fromisoformat(times["QUEUED"])
                running = datetime.fromisoformat(times["PROCESSING"])
                server_side.append((running - queued).total_seconds())
        finally:
            server.stop()
            server.kill_learners()
    result = {
        "post_median_s": median(posts),
        "post_p95_s": percentile(posts, 95),
        "server_median_s": median(server_side),
        "server_p95_s": percentile(server_side, 95),
        "client_median_s": median(client_side),
        "client_p95_s": percentile(client_side, 95),
    }
    print(f"POST /v1/models over {BURST} submits (acknowledged = durable)")
    print(
        f"  request        median {result['post_median_s'] * 1000:.1f} ms  "
        f"p95 {result['post_p95_s'] * 1000:.1f} ms"
    )
    print(f"submit → PROCESSING over {JOBS} trivial jobs (goal: median < 1 s)")
    print(
        f"  server events  median {result['server_median_s']:.3f} s   "
        f"p95 {result['server_p95_s']:.3f} s"
    )
    print(
        f"  client view    median {result['client_median_s']:.3f} s   "
        f"p95 {result['client_p95_s']:.3f} s   "
        f"goal ratio {result['client_median_s'] / 1.0:.2f}× of 1 s"
    )
    return result


if __name__ == "__main__":
    main()
