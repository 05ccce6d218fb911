"""The cost of a Prometheus scrape of ``GET /metrics`` with 10,000 jobs in the store.

Seeds a SQLite store with 10,000 jobs over 10 tenants (9,500 finished, 300 queued, 200
running with a learner each, their GPU figures and progress), then scrapes the app's
``/metrics`` over ASGI (the whole request path: auth, queries, exposition; the loops are
not running, so the seeded jobs stay as they are) and prints the time per scrape against
the goal of 50 ms.

    python benchmarks/bench_metrics_scrape.py [--jobs 10000] [--scrapes 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ffdl.server.app import create_app  # noqa: E402
from ffdl.server.settings import NodeConfig, Settings  # noqa: E402
from ffdl.server.store.models import Job, Learner, Tenant  # noqa: E402
from ffdl.server.store.transitions import utcnow  # noqa: E402

SCRAPE_TOKEN = "bench-scrape-token-0123456789"
TENANTS = 10
NODES = 50


def seed(settings: Settings, jobs: int) -> None:
    app = create_app(settings)
    store = app.state.platform.store
    now = utcnow()
    base = now - timedelta(days=30)
    queued, running = 300 * jobs // 10_000, 200 * jobs // 10_000
    with store.write() as session:
        for t in range(TENANTS):
            session.add(Tenant(id=f"team-{t}", name=f"team {t}", created_at=now))
    rows: list[Job] = []
    learners: list[Learner] = []
    for i in range(jobs):
        at = base + timedelta(seconds=i * 60)
        status = "COMPLETED" if i % 7 else "FAILED"
        if i < running:
            status = "PROCESSING"
        elif i < running + queued:
            status = "QUEUED"
        node = f"node-{i % NODES:02d}"
        rows.append(
            Job(
                id=f"training-scrape{i:06d}",
                tenant_id=f"team-{i % TENANTS}",
                user_id="admin",
                name=f"job-{i}",
                manifest={"name": f"job-{i}", "framework": {"name": "custom", "command": "x"}},
                status=status,
                reason=status.lower(),
                error_code="E100" if status == "FAILED" else None,
                learners=1,
                gpus=1,
                cpus=1.0,
                memory_mb=1024,
                placement=[{"learner": 1, "node": node, "gpu_ids": [i % 4]}]
                if status == "PROCESSING"
                else None,
                progress={"fraction": 0.5, "remaining_s": 600.0, "samples_rate": 900.0}
                if status == "PROCESSING"
                else None,
                gpu_util_avg=70.0 if status == "PROCESSING" else None,
                submitted_at=at,
                started_at=at if status != "QUEUED" else None,
                finished_at=at if status in ("COMPLETED", "FAILED") else None,
                status_changed_at=at,
                attempt=1,
            )
        )
        if status == "PROCESSING":
            learners.append(
                Learner(
                    job_id=f"training-scrape{i:06d}",
                    index=1,
                    attempt=1,
                    status="PROCESSING",
                    node=node,
                    gpu_ids=[i % 4],
                    last_heartbeat=now,
                    gpu_util=80.0,
                    gpu_memory_mb=2048.0,
                    updated_at=now,
                )
            )
    with store.write() as session:
        session.add_all(rows)
    with store.write() as session:
        session.add_all(learners)
    app.state.platform.close()


async def scrape_times(settings: Settings, scrapes: int) -> tuple[list[float], int, int]:
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {SCRAPE_TOKEN}"}
    times: list[float] = []
    body = ""
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        for _ in range(scrapes + 3):
            started = time.perf_counter()
            response = await client.get("/metrics", headers=headers)
            times.append(time.perf_counter() - started)
            assert response.status_code == 200, response.text
            body = response.text
    app.state.platform.close()
    series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    return times[3:], series, len(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            home=Path(tmp) / "home",
            sandbox=False,
            metrics_token=SCRAPE_TOKEN,
            nodes=[
                NodeConfig(name=f"node-{n:02d}", gpus=4, cpus=32, memory="128GiB")
                for n in range(NODES)
            ],
        )
        seed(settings, args.jobs)
        times, series, size = asyncio.run(scrape_times(settings, args.scrapes))
    ms = sorted(t * 1000 for t in times)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    print(f"/metrics with {args.jobs} jobs in SQLite ({TENANTS} tenants, {NODES} nodes)")
    print(f"  series {series}, body {size / 1024:.0f} KiB, {len(ms)} scrapes")
    print(
        f"  scrape median {statistics.median(ms):.1f} ms   p95 {p95:.1f} ms   "
        f"max {ms[-1]:.1f} ms   (goal < 50 ms)"
    )


if __name__ == "__main__":
    main()
