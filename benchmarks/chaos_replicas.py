"""Chaos among replicas: jobs from concurrent clients while loop leaders are killed.

``python benchmarks/chaos_replicas.py`` (``make chaos-replicas``) starts a throwaway
PostgreSQL on 127.0.0.1 and ``--replicas`` ``ffdl up`` processes sharing it and one home,
then submits ``--jobs`` jobs from ``--clients`` client threads, each sending every submit
to a random live replica (and retrying on another, with the same ``Idempotency-Key``, when
one is down). Meanwhile, every ``--every-min``..``--every-max`` seconds, it picks a loop
(scheduler, LCM, monitor, autoscaler, webhooks), SIGKILLs the replica that runs it, and
starts that replica again ``--down-min``..``--down-max`` seconds later.

Each job prints numbered lines ``chaos <job> run <token> line <n>``, ``token`` drawn anew
by each start of its process. No learner is harmed, so a job whose lines carry two tokens
was started twice: a double deploy. At the end it prints jobs acknowledged, stored,
completed, failed, duplicated and lost; lines expected, delivered, duplicated, missing;
double deploys; and the failovers seen. Goal: all zero but completed, every job COMPLETED.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _server import FAST_CONFIG, LiveServer, all_models, code_zip, manifest_yaml, median, wait_for
from tests.postgres import PostgresServer

JOB_SCRIPT = """
import sys, time, uuid
name, lines = sys.argv[1], int(sys.argv[2])
token = uuid.uuid4().hex[:8]
for n in range(1, lines + 1):
    print(f"chaos {name} run {token} line {n}", flush=True)
    time.sleep(0.05)
"""
LINE = re.compile(r"^chaos (?P<name>\S+) run (?P<token>\S+) line (?P<n>\d+)$")
LOOPS = ("scheduler", "lcm", "monitor", "autoscaler", "webhooks")


@dataclass
class Report:
    acknowledged: int = 0
    stored: int = 0
    completed: int = 0
    failed: int = 0
    duplicated_jobs: int = 0
    lost_jobs: int = 0
    double_deploys: int = 0
    lines_expected: int = 0
    lines_delivered: int = 0
    lines_duplicated: int = 0
    lines_missing: int = 0
    kills: dict[str, int] = field(default_factory=dict)
    failover_s: list[float] = field(default_factory=list)

    def clean(self) -> bool:
        return (
            self.completed == self.acknowledged == self.stored
            and not self.failed
            and not self.duplicated_jobs
            and not self.lost_jobs
            and not self.double_deploys
            and not self.lines_duplicated
            and not self.lines_missing
        )


class ReplicaChaos:
    def __init__(self, args: argparse.Namespace, home: Path, database_url: str) -> None:
        self.args = args
        self.random = random.Random(args.seed)
        config = {
            **FAST_CONFIG,
            "database_url": database_url,
            "lease_ttl_s": args.lease_ttl,
            "nodes": [
                {"name": f"node-{n}", "gpus": 4, "cpus": 16, "memory": "32GiB", "gpu_type": "cpu"}
                for n in "ab"
            ],
        }
        self.replicas = [
            LiveServer(home=home, config=dict(config), log_name=f"r{n}.log")
            for n in range(args.replicas)
        ]
        self.submitted: dict[str, str] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.report = Report()

    # -- clients --------------------------------------------------------------------------

    def live(self) -> list[LiveServer]:
        return [r for r in self.replicas if r.proc is not None]

    def _client(self, names: list[str], rng: random.Random) -> None:
        code = code_zip({"job.py": JOB_SCRIPT})
        token = self.replicas[0].token
        for name in names:
            manifest = manifest_yaml(f"python job.py {name} {self.args.lines}", name=name)
            key = uuid.uuid4().hex
            while True:
                replicas = self.live()
                if not replicas:
                    time.sleep(0.1)
                    continue
                target = rng.choice(replicas)
                try:
                    with httpx.Client(base_url=target.url, timeout=30) as client:
                        response = client.post(
                            "/v1/models",
                            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key},
                            files={
                                "manifest": ("manifest.yml", manifest.encode()),
                                "model_definition": ("model.zip", code),
                            },
                        )
                except httpx.HTTPError:
                    continue  # that replica is down: another one, with the same key
                if response.status_code in (200, 201):
                    with self.lock:
                        self.submitted[name] = str(response.json()["model_id"])
                    break
                if response.status_code < 500:
                    raise RuntimeError(f"submit of {name} refused: {response.text}")

    # -- chaos ----------------------------------------------------------------------------

    def _ask(self) -> dict[str, Any]:
        for replica in self.live():
            with contextlib.suppress(httpx.HTTPError):
                answer = replica.client.get("/v1/replicas", timeout=5)
                if answer.status_code == 200:
                    body: dict[str, Any] = answer.json()
                    return body
        raise RuntimeError("no replica answers")

    def _kill_leader(self) -> None:
        loop = self.random.choice(LOOPS)
        view = self._ask()
        holder = next(x["holder"] for x in view["leases"] if x["name"] == loop)
        pids = {r["id"]: r["pid"] for r in view["replicas"]}
        victim = next(
            (r for r in self.live() if r.proc is not None and r.proc.pid == pids.get(holder)),
            None,
        )
        if victim is None or len(self.live()) < 2:
            return
        assert victim.proc is not None
        started = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        victim.proc = None
        victim._client = None
        self.report.kills[loop] = self.report.kills.get(loop, 0) + 1

        def led_again() -> bool:
            leases = {x["name"]: x["holder"] for x in self._ask()["leases"]}
            return all(leases.get(name) not in (None, holder) for name in LOOPS)

        wait_for(led_again, timeout=60, interval=0.05, what="loops led again")
        self.report.failover_s.append(time.monotonic() - started)
        self.done.wait(self.random.uniform(self.args.down_min, self.args.down_max))
        victim.start()

    def _chaos(self) -> None:
        while not self.done.wait(self.random.uniform(self.args.every_min, self.args.every_max)):
            self._kill_leader()

    # -- the run --------------------------------------------------------------------------

    def run(self) -> Report:
        for replica in self.replicas:  # one after another: the first makes the schema
            replica.start()
        names = [f"job{n:04d}" for n in range(self.args.jobs)]
        clients = [
            threading.Thread(
                target=self._client,
                args=(names[i :: self.args.clients], random.Random(self.args.seed + i)),
            )
            for i in range(self.args.clients)
        ]
        chaos = threading.Thread(target=self._chaos)
        try:
            chaos.start()
            for client in clients:
                client.start()
            for client in clients:
                client.join()
            wait_for(self._all_ended, timeout=1800, interval=1.0, what="every job ended")
            self.done.set()
            chaos.join()
            self._collect()
        finally:
            self.done.set()
            for replica in self.replicas:
                replica.stop()
            self.replicas[0].kill_learners()
        return self.report

    def _all_ended(self) -> bool:
        with self.lock:
            ids = list(self.submitted.values())
        with contextlib.suppress(httpx.HTTPError, AssertionError, StopIteration):
            replica = self.live()[0]
            return all(
                replica.status(job_id) in ("COMPLETED", "FAILED", "CANCELLED") for job_id in ids
            )
        return False

    def _collect(self) -> None:
        replica = self.live()[0]
        report = self.report
        report.acknowledged = len(self.submitted)
        models = all_models(replica.client)
        by_name: dict[str, int] = {}
        for model in models:
            by_name[model["name"]] = by_name.get(model["name"], 0) + 1
        report.stored = len(models)
        report.duplicated_jobs = sum(n - 1 for n in by_name.values())
        report.lost_jobs = sum(1 for name in self.submitted if name not in by_name)
        for name, job_id in self.submitted.items():
            status = replica.status(job_id)
            report.completed += status == "COMPLETED"
            report.failed += status == "FAILED"
            tokens: set[str] = set()
            seen: set[tuple[str, int]] = set()
            for item in replica.loglines(job_id):
                match = LINE.match(item["line"])
                if match is None or match["name"] != name:
                    continue
                key = (match["token"], int(match["n"]))
                report.lines_delivered += 1
                report.lines_duplicated += key in seen
                seen.add(key)
                tokens.add(key[0])
            report.double_deploys += max(0, len(tokens) - 1)
            report.lines_expected += self.args.lines
            report.lines_missing += self.args.lines - len({n for _, n in seen})


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--every-min", type=float, default=3.0)
    parser.add_argument("--every-max", type=float, default=8.0)
    parser.add_argument("--down-min", type=float, default=1.0)
    parser.add_argument("--down-max", type=float, default=5.0)
    parser.add_argument("--lease-ttl", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    args, _ = parser.parse_known_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, PostgresServer() as postgres:
        chaos = ReplicaChaos(args, Path(tmp) / "home", postgres.create_database())
        report = chaos.run()
    took = time.monotonic() - started
    kills = ", ".join(f"{loop} {n}" for loop, n in sorted(report.kills.items())) or "none"
    print(
        f"replica chaos: {args.jobs} jobs × {args.lines} lines from {args.clients} clients, "
        f"{args.replicas} replicas on PostgreSQL, {took:.0f} s"
    )
    print(f"  leaders SIGKILLed: {sum(report.kills.values())} ({kills})")
    if report.failover_s:
        print(
            f"  failover (kill → every loop led again): median {median(report.failover_s):.2f} s,"
            f" max {max(report.failover_s):.2f} s"
        )
    print(
        f"  jobs: acknowledged {report.acknowledged}, stored {report.stored}, completed "
        f"{report.completed}, failed {report.failed}, duplicated {report.duplicated_jobs}, "
        f"lost {report.lost_jobs}; double deploys {report.double_deploys}"
    )
    print(
        f"  log lines: expected {report.lines_expected}, delivered {report.lines_delivered}, "
        f"duplicated {report.lines_duplicated}, missing {report.lines_missing}"
    )
    print(f"  verdict: {'clean' if report.clean() else 'NOT CLEAN'}")
    return {
        "jobs_completed": float(report.completed),
        "double_deploys": float(report.double_deploys),
        "lines_missing": float(report.lines_missing),
        "clean": float(report.clean()),
    }


if __name__ == "__main__":
    raise SystemExit(0 if main()["clean"] else 1)
