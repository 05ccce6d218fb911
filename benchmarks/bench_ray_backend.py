"""The Ray backend against the local backend, on a real Ray cluster on 127.0.0.1.

1. submit → PROCESSING of a trivial job, Ray backend beside local backend (goal: Ray median
   < 2 s and < 2× local), as the platform's events time it (QUEUED → PROCESSING).
2. 100 short jobs through a 4-node Ray cluster: job starts per second and the control
   plane's CPU per job (the server and its Ray driver, from /proc).
3. A node dies under a running job: seconds from its death to the job PROCESSING again on
   another node (goal: < heartbeat timeout + 10 s).

Run: ``.venv/bin/python benchmarks/bench_ray_backend.py [--jobs 100] [--latency-jobs 15]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _server import FAST_CONFIG, LiveServer, manifest_yaml, median, percentile, wait_for
from tests.ray_backend.cluster import RayTestCluster

HEARTBEAT_TIMEOUT_S = 10.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _config(cluster: RayTestCluster | None, root: Path) -> dict[str, Any]:
    config = {k: v for k, v in FAST_CONFIG.items() if k != "nodes"}
    config["heartbeat_timeout_s"] = HEARTBEAT_TIMEOUT_S
    (root / "checkpoints").mkdir(exist_ok=True)
    if cluster is None:
        config["nodes"] = [
            {"name": f"n{i}", "gpus": 4, "cpus": 4, "memory": "8GiB", "gpu_type": "cpu"}
            for i in range(4)
        ]
        return config
    config.update(
        backend="ray",
        ray_address=cluster.address,
        ray_work_root=str(root / "work"),
        checkpoint_store=f"file://{root / 'checkpoints'}",
        checkpoint_sync_s=0.5,
    )
    return config


def _event_times(model: dict[str, Any]) -> dict[str, datetime]:
    return {
        e["to"]: datetime.fromisoformat(e["time"]) for e in model["events"] if e["learner"] is None
    }


def _latencies(server: LiveServer, jobs: int) -> list[float]:
    manifest = manifest_yaml("python -c 'import time; time.sleep(0.3)'", gpus=1)
    found = []
    for _ in range(jobs):
        job_id = server.submit_ok(manifest)
        model = server.wait_status(job_id, {"COMPLETED"}, timeout=120)
        times = _event_times(model)
        found.append((times["PROCESSING"] - times["QUEUED"]).total_seconds())
    return found


def _descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (the Ray driver is started from a thread, so
    ``/proc/PID/task/PID/children`` alone would miss it)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        each = todo.pop()
        found.append(each)
        todo.extend(parents.get(each, []))
    return found


def _cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and of its live descendants (the Ray driver), in seconds."""
    total = 0.0
    for each in _descendants(pid):
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime, cutime, cstime (fields 14-17 of stat; 12-15 after the name).
        total += sum(int(x) for x in fields[11:15]) / CLOCK_TICKS
    return total


def _throughput(server: LiveServer, jobs: int) -> tuple[float, float]:
    assert server.proc is not None
    manifest = manifest_yaml("python -c 'print(1)'", gpus=1)
    cpu_before = _cpu_seconds(server.proc.pid)
    started = time.perf_counter()
    ids = [server.submit_ok(manifest) for _ in range(jobs)]
    for job_id in ids:
        server.wait_status(job_id, {"COMPLETED"}, timeout=600)
    elapsed = time.perf_counter() - started
    cpu = _cpu_seconds(server.proc.pid) - cpu_before
    return jobs / elapsed, cpu / jobs


STEPS = """
import time
from ffdl.sdk.api import load_checkpoint, save_checkpoint
restored = load_checkpoint()
step = 0 if restored is None else restored[1]
while step < 600:
    step += 1
    save_checkpoint(step, step, keep=1)
    print(f"step {step}", flush=True)
    time.sleep(0.1)
"""


def _node_loss(server: LiveServer, cluster: RayTestCluster) -> float:
    manifest = manifest_yaml("python steps.py", max_restarts=3)
    job_id = server.submit_ok(manifest, {"steps.py": STEPS})
    server.wait_status(job_id, {"PROCESSING"}, timeout=60)
    time.sleep(2.0)  # let it checkpoint a few steps before its machine dies
    node = server.model(job_id)["learners"][0]["node"]
    died = time.perf_counter()
    cluster.remove(node)

    def again() -> bool:
        model = server.model(job_id)
        attempts = [lr for lr in model["learners"] if lr["attempt"] > 1]
        status = model["training"]["training_status"]["status"]
        return bool(attempts) and status == "PROCESSING"

    wait_for(again, timeout=120, interval=0.05, what="the job processing elsewhere")
    elapsed = time.perf_counter() - died
    server.client.delete(f"/v1/models/{job_id}")
    cluster.add(node)
    return elapsed


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--latency-jobs", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        local = LiveServer(home=root / "local", config=_config(None, root))
        local.start()
        try:
            local_latency = _latencies(local, args.latency_jobs)
        finally:
            local.stop()
            local.kill_learners()
        from tests.integration.live import free_port

        cluster = RayTestCluster(
            port=free_port(), root=root / "ray", nodes={f"n{i}": "r1" for i in range(4)}
        )
        cluster.start()
        try:
            server = LiveServer(home=root / "ray-home", config=_config(cluster, root))
            server.start()
            try:
                ray_latency = _latencies(server, args.latency_jobs)
                rate, cpu_per_job = _throughput(server, args.jobs)
                recovery = _node_loss(server, cluster)
            finally:
                server.stop()
        finally:
            cluster.shutdown()
    result = {
        "local_median_s": median(local_latency),
        "ray_median_s": median(ray_latency),
        "ray_p95_s": percentile(ray_latency, 95),
        "starts_per_s": rate,
        "cpu_per_job_s": cpu_per_job,
        "node_loss_s": recovery,
    }
    ratio = result["ray_median_s"] / result["local_median_s"]
    print(f"submit → PROCESSING over {args.latency_jobs} trivial jobs (server events)")
    print(
        f"  local  median {result['local_median_s']:.3f} s   "
        f"p95 {percentile(local_latency, 95):.3f} s"
    )
    print(
        f"  ray    median {result['ray_median_s']:.3f} s   p95 {result['ray_p95_s']:.3f} s   "
        f"ray/local {ratio:.2f}×   (goal: < 2 s and < 2×)"
    )
    print(f"{args.jobs} short jobs through a 4-node Ray cluster")
    print(f"  {rate:.2f} job starts/s   control plane CPU {cpu_per_job * 1000:.0f} ms per job")
    print(
        f"node death → PROCESSING elsewhere: {recovery:.1f} s   "
        f"(goal: < heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s + 10 s)"
    )
    return result


if __name__ == "__main__":
    main()
