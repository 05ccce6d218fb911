"""Replicas on PostgreSQL: API throughput beside SQLite, and how fast the loops fail over.

1. Submits per second (6 client processes) and the p99 of a 100-job list page, with
   ``SEEDED`` jobs in the store, for SQLite (one process), PostgreSQL with one replica and
   PostgreSQL with three replicas (clients spread over them), side by side.
2. Failover: three replicas; ``KILLS`` times, the replica that runs the LCM is SIGKILLed
   (and started again afterwards). Measured: kill → every loop led by a live replica again.
   A replica whose process is gone on the same machine is taken over at once; a replica
   on another machine that dies looks like one that stopped answering, which is measured
   by freezing the leader (SIGSTOP) instead: its leases must run out first (goal < 5 s).

The PostgreSQL server is a throwaway one on 127.0.0.1 (``tests/postgres.py``) with
``fsync=on`` here, like SQLite's ``synchronous=FULL``, so that both pay for durability.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from _server import LiveServer, code_zip, manifest_yaml, median, percentile, wait_for
from bench_api import multipart_body, seed_jobs, submit_many
from tests.postgres import PostgresServer

SEEDED = 2_000
SUBMITS = 600
CLIENTS = 6
LIST_CALLS = 200
KILLS = 20
CONFIG: dict[str, Any] = {
    "nodes": [{"name": "only", "gpus": 1, "cpus": 1, "memory": "4GiB", "gpu_type": "cpu"}],
    "scheduler_interval_s": 1.0,
    "lease_ttl_s": 3.0,
}
LOOPS = ("scheduler", "lcm", "monitor", "autoscaler", "webhooks")


def start_replicas(home: Path, config: dict[str, Any], count: int) -> list[LiveServer]:
    replicas = []
    for n in range(count):
        replica = LiveServer(home=home, config=dict(config), log_name=f"r{n}.log")
        replica.start()
        replicas.append(replica)
    return replicas


def throughput(name: str, database_url: str | None, replicas: int, tmp: Path) -> dict[str, float]:
    home = tmp / name
    config = dict(CONFIG)
    if database_url is not None:
        config["database_url"] = database_url
    first = LiveServer(home=home, config=dict(config))
    first.start()
    first.stop()
    seed_jobs(database_url or f"sqlite:///{home / 'ffdl.db'}", SEEDED)
    servers = start_replicas(home, config, replicas)
    try:
        manifest = manifest_yaml("python train.py", cpus=1, gpus=1).encode()
        body, content_type = multipart_body(manifest, code_zip({"train.py": "print('hi')\n"}))
        token = servers[0].token
        work = [
            (servers[i % replicas].port, token, body, content_type, SUBMITS // CLIENTS)
            for i in range(CLIENTS)
        ]
        started = time.perf_counter()
        with ProcessPoolExecutor(CLIENTS) as pool:
            list(pool.map(submit_many, work))
        elapsed = time.perf_counter() - started
        latencies = []
        headers = {"Authorization": f"Bearer {token}"}
        clients = [httpx.Client(base_url=s.url, headers=headers, timeout=60) for s in servers]
        try:
            for i in range(LIST_CALLS):
                t0 = time.perf_counter()
                answer = clients[i % replicas].get(
                    "/v1/models", params={"limit": 100, "offset": (i % 20) * 100}
                )
                latencies.append(time.perf_counter() - t0)
                assert answer.status_code == 200, answer.text
        finally:
            for client in clients:
                client.close()
    finally:
        for server in servers:
            server.stop()
    return {
        "submits_per_s": SUBMITS / elapsed,
        "list_p50_ms": median(latencies) * 1000,
        "list_p99_ms": percentile(latencies, 99) * 1000,
    }


def leases(replica: LiveServer) -> dict[str, str | None]:
    body = replica.client.get("/v1/replicas", timeout=5).json()
    return {lease["name"]: lease["holder"] for lease in body["leases"]}


def replica_ids(replica: LiveServer) -> dict[int, str]:
    body = replica.client.get("/v1/replicas", timeout=5).json()
    return {r["pid"]: r["id"] for r in body["replicas"] if r["alive"]}


def settled(replica: LiveServer) -> bool:
    """Every loop led, and spread evenly: each live replica leads its share, no more."""
    body = replica.client.get("/v1/replicas", timeout=5).json()
    held = {lease["name"]: lease["holder"] for lease in body["leases"]}
    shares = [len(r["leads"]) for r in body["replicas"] if r["alive"]]
    loops = len(body["leases"])
    return all(held.values()) and max(shares) <= -(-loops // len(shares))


def failover(database_url: str, tmp: Path, how: signal.Signals) -> list[float]:
    home = tmp / f"failover-{how.name}"
    replicas = start_replicas(home, {**CONFIG, "database_url": database_url}, 3)
    times = []
    try:
        for n in range(KILLS):
            asking = replicas[(n + 1) % 3]
            # The replica started again after the last kill takes its share back first, so
            # that a lease between two holders is not counted as the failover's.
            wait_for(partial(settled, asking), timeout=30, interval=0.1, what="the loops settled")
            ids = replica_ids(asking)
            holder = leases(asking)["lcm"]
            victim = next(r for r in replicas if r.proc and ids.get(r.proc.pid) == holder)
            others = [r for r in replicas if r is not victim]
            assert victim.proc is not None
            pid = victim.proc.pid
            t0 = time.perf_counter()
            os.kill(pid, how)
            if how == signal.SIGKILL:
                victim.proc.wait()  # reaped at once, as by a supervisor (else a zombie)

            def led_again(others: list[LiveServer] = others, gone: str | None = holder) -> bool:
                held = leases(others[0])
                return all(held.get(loop) not in (None, gone) for loop in LOOPS)

            wait_for(led_again, timeout=30, interval=0.02, what="the loops led again")
            times.append(time.perf_counter() - t0)
            if how == signal.SIGSTOP:
                os.kill(pid, signal.SIGCONT)
                victim.stop()
            else:
                victim.proc = None
            victim.start()
    finally:
        for replica in replicas:
            if replica.proc is not None:
                os.kill(replica.proc.pid, signal.SIGCONT)
            replica.stop()
    return times


def main() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp_dir, PostgresServer(fsync=True) as postgres:
        tmp = Path(tmp_dir)
        rows = {
            "SQLite, 1 process": throughput("sqlite", None, 1, tmp),
            "PostgreSQL, 1 replica": throughput("pg1", postgres.create_database(), 1, tmp),
            "PostgreSQL, 3 replicas": throughput("pg3", postgres.create_database(), 3, tmp),
        }
        killed = failover(postgres.create_database(), tmp, signal.SIGKILL)
        frozen = failover(postgres.create_database(), tmp, signal.SIGSTOP)
    base = rows["SQLite, 1 process"]
    print(f"API with {SEEDED} jobs seeded, {SUBMITS} submits from {CLIENTS} client processes")
    print(f"  {'store':24} {'submits/s':>10} {'ratio':>7} {'list p50':>10} {'list p99':>10}")
    for name, row in rows.items():
        print(
            f"  {name:24} {row['submits_per_s']:10.1f} "
            f"{row['submits_per_s'] / base['submits_per_s']:6.2f}× "
            f"{row['list_p50_ms']:8.1f} ms {row['list_p99_ms']:8.1f} ms"
        )
    print(f"failover over {KILLS} times each (lease_ttl_s {CONFIG['lease_ttl_s']:g} s), goal < 5 s")
    for label, times in (("leader SIGKILLed", killed), ("leader frozen (SIGSTOP)", frozen)):
        print(f"  {label:24} median {median(times):5.2f} s   max {max(times):5.2f} s")
    result = {f"{name} {key}": value for name, row in rows.items() for key, value in row.items()}
    result.update(
        {
            "failover_kill_median_s": median(killed),
            "failover_kill_max_s": max(killed),
            "failover_freeze_median_s": median(frozen),
            "failover_freeze_max_s": max(frozen),
        }
    )
    return result


if __name__ == "__main__":
    main()
