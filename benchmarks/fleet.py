"""The control plane at fleet scale, with simulated learners (``make fleet``).

``python benchmarks/fleet.py`` runs, for each combination of ``--nodes`` (declared nodes of
8 GPUs), ``--stored`` (finished jobs already in the database) and ``--setups``
(``sqlite:1``, ``postgres:1``, ``postgres:3``: store and replicas), the real platform with
the ``simulated`` backend: a load-testing harness process (``ffdl.loadtest.harness``) plays
every learner on the wire. Jobs arrive with the gaps of the Philly trace (``data/``, scaled
to keep ``--learners`` learners running; ``--arrivals poisson``: steady gaps of the same
mean), their sizes from the trace, across four tenants and three priorities, one in five
elastic. Replicas on PostgreSQL divide the loops among themselves (``--loops together``
keeps them in one, to compare; ``--loops apart`` starts one more replica that runs every
loop and is given no traffic, the others serving the API only). After a ramp of one job
length it measures for ``--window`` seconds and prints one row per run:

- submit → PROCESSING p50/p99 (from the jobs' own events), and where it went: queued
  (submit → PENDING), deploy (PENDING → the last learner launched) and report (that launch
  → PROCESSING); scheduling and lifecycle-manager pass p50/p99 and each loop's share of
  the window spent in its passes (``/metrics`` histograms);
- API latency p50/p99 for submit, list (first and a deep page, by offset and by keyset),
  show and loglines, under that load;
- report ingestion: log lines/s and metric points/s acknowledged, the harness's backlog,
  and the CPU the replicas (all, and the busiest one) and the harness took meanwhile (per
  cent of one core);
- each replica's RSS, the database's growth per million log lines, one ``/metrics``
  scrape's time and size, control-plane CPU seconds per job start.

Ratios against the first setup are printed beside each table. Nothing may be lost: at the
end every job submitted in the run must have ended or be running.

One harness process plays a few hundred learners; ``--harnesses N`` shares the jobs among N
of them, for thousands. ``--platform-cpus 0,1`` pins the control plane (the replicas and
PostgreSQL) to those CPUs and the harnesses and this process to the others, so that a
bigger machine can measure a control plane of a given size under a load it could not play
itself.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from _fleet_measure import (
    PASSES,
    REQUESTS,
    database_bytes,
    harness_stats,
    histogram_quantile,
    process_cpu_s,
    quantile,
    rss_mib,
    scrape_histograms,
)
from _fleet_report import TIMED_LOOPS, Run, Setup, print_runs
from _seed import seed_finished_jobs
from _server import FAST_CONFIG, LiveServer, code_zip
from sqlalchemy import func, select
from tests.postgres import PostgresServer, free_port

from ffdl.server.store.db import Store
from ffdl.server.store.models import DeployStep, Job
from ffdl.sim.philly import TraceFilter, load_philly

TENANTS = ("vision", "speech", "nlp", "ads")
PRIORITIES = (0, 50, 100)
GPUS_PER_NODE = 8
LOOPS = ("scheduler", "lcm")
# Submissions in flight at once, at most.
SUBMITTERS = 8
REPORTS = "/v1/internal/jobs/{job_id}/learners/{learner}/reports"


def arrivals(
    count: int, mean_gap_s: float, seed: int, *, poisson: bool = False
) -> list[tuple[float, int]]:
    """``count`` (gap, GPUs) pairs from the Philly trace, gaps scaled to ``mean_gap_s``;
    ``poisson``: the trace's sizes with exponential gaps of that mean instead of its own."""
    jobs = load_philly(None, TraceFilter(sample=1.0, seed=seed), max_gpus=64)
    jobs.sort(key=lambda job: job.submit_s)
    gaps = [max(0.0, b.submit_s - a.submit_s) for a, b in itertools.pairwise(jobs)]
    rng = random.Random(seed)
    start = rng.randrange(max(1, len(gaps) - count))
    if poisson:
        return [(rng.expovariate(1.0 / mean_gap_s), jobs[start + i].gpus) for i in range(count)]
    # Scaled by the picked stretch's own mean gap: the trace's bursts and lulls are kept,
    # and the arrival rate over the stretch is the one asked for.
    mean = statistics.fmean(gaps[start : start + count]) or 1.0
    picked = [(gaps[start + i] * mean_gap_s / mean, jobs[start + i].gpus) for i in range(count)]
    return picked


def manifest(name: str, gpus: int, tenant_priority: int, elastic: bool, duration_s: float) -> str:
    learners = max(1, -(-gpus // GPUS_PER_NODE))
    per_learner = min(gpus, GPUS_PER_NODE)
    lines = [
        f"name: {name}",
        "version: '1.0'",
        f"learners: {learners}",
        f"gpus: {per_learner}",
        "cpus: 1",
        "memory: 1GiB",
        f"priority: {tenant_priority}",
        "framework:",
        "  name: custom",
        "  version: '1'",
        f"  command: simulate duration_s={duration_s:.0f}",
    ]
    if elastic and learners == 1 and per_learner > 1:
        lines.append(f"elastic: {{gpus: {{min: 1, max: {per_learner}}}}}")
    return "\n".join(lines) + "\n"


def progress(what: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {what}", flush=True)


@contextlib.contextmanager
def pinned(platform_cpus: set[int] | None, *, platform: bool) -> Iterator[None]:
    """This thread (and what it starts) on the control plane's CPUs, or on all the others;
    nothing changes without ``--platform-cpus``."""
    if platform_cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    others = before - platform_cpus
    os.sched_setaffinity(0, platform_cpus if platform else others)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class Fleet:
    def __init__(self, args: argparse.Namespace, setup: Setup, nodes: int, stored: int) -> None:
        self.args = args
        self.setup = setup
        self.nodes = nodes
        self.stored = stored
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = {
            k: [] for k in ("submit", "list", "list deep", "list after", "show", "loglines")
        }
        self.submitted: list[str] = []
        # Failed calls by HTTP status; 0: no answer at all (the connection failed).
        self.errors: Counter[int] = Counter()
        self.measuring = threading.Event()
        self.stop = threading.Event()

    def run(self, tmp: Path) -> Run:
        args, setup = self.args, self.setup
        home = tmp / "home"
        home.mkdir(parents=True)
        postgres: PostgresServer | None = None
        harness_ports = [free_port() for _ in range(args.harnesses)]
        harness_urls = [f"http://127.0.0.1:{port}" for port in harness_ports]
        # Children keep the CPUs of the thread that started them.
        with pinned(args.platform_cpus, platform=False):
            harnesses = [
                subprocess.Popen(
                    [sys.executable, "-m", "ffdl.loadtest.harness", "--port", str(port)],
                    stdout=(tmp / f"harness{n}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
                for n, port in enumerate(harness_ports)
            ]
        # Those the clients and learners are given; with the one running the loops apart.
        replicas: list[LiveServer] = []
        everyone: list[LiveServer] = []
        result = Run(setup, self.nodes, self.stored)
        try:
            with pinned(args.platform_cpus, platform=True):
                if setup.store == "postgres":
                    postgres = PostgresServer(fsync=True).start()
                    database_url = postgres.create_database()
                else:
                    database_url = f"sqlite:///{home / 'ffdl.db'}"
                config = self._config(database_url, harness_urls)
                if args.loops == "apart":
                    # First, so that its start makes the schema and the administrator.
                    everyone.append(
                        LiveServer(home=home, config=dict(config), log_name="loops.log")
                    )
                    everyone[0].start()
                    config["run_loops"] = False
                for n in range(setup.replicas):
                    replica = LiveServer(home=home, config=dict(config), log_name=f"r{n}.log")
                    replica.start()
                    replicas.append(replica)
                    everyone.append(replica)
            # After the first start, which made the schema, the tenant and the administrator.
            progress(f"{setup.replicas} replicas up; storing {self.stored} finished jobs")
            seeding = Store(database_url)
            try:
                seed_finished_jobs(seeding, self.stored)
            finally:
                seeding.dispose()
            tokens = self._tenants(replicas[0])
            with pinned(args.platform_cpus, platform=False):
                result.figures = self._load(
                    replicas, everyone, tokens, harness_urls, harnesses, database_url, home
                )
            result.lost = self._lost(database_url)
        finally:
            self.stop.set()
            progress("stopping")
            # The learners first, so that the replicas stop without thousands of posts.
            for harness in harnesses:
                harness.terminate()
            for harness in harnesses:
                harness.wait(timeout=30)
            for replica in everyone:
                replica.stop()
            if postgres is not None:
                postgres.stop()
        return result

    def _config(self, database_url: str, harness_urls: list[str]) -> dict[str, Any]:
        args = self.args
        config: dict[str, Any] = {
            **FAST_CONFIG,
            "scheduler_interval_s": 1.0,
            "lcm_interval_s": 0.5,
            "monitor_interval_s": 1.0,
            "heartbeat_s": 2.0,
            "heartbeat_timeout_s": 60.0,
            "database_url": database_url,
            "spread_loops": args.loops == "spread",
            "report_records_at_once": args.records_at_once,
            "report_posts_per_s": args.report_posts_per_s,
            "backend": "simulated",
            "sandbox": False,
            "gpu_sample_s": 0,
            "cluster_sample_s": 0,
            "simulated": {
                "harness_url": harness_urls,
                "duration_s": args.duration,
                "lines_per_s": args.lines_per_s,
                "metrics_per_s": args.metrics_per_s,
                "node_count": self.nodes,
                "gpus_per_node": GPUS_PER_NODE,
                "racks": max(1, self.nodes // 40),
            },
        }
        config.pop("nodes", None)
        return config

    def _tenants(self, replica: LiveServer) -> list[str]:
        tokens = []
        for tenant in TENANTS:
            answer = replica.client.post("/v1/tenants", json={"id": tenant})
            assert answer.status_code in (200, 201), answer.text
            user = replica.client.post(
                f"/v1/tenants/{tenant}/users", json={"name": f"{tenant}-user"}
            )
            assert user.status_code in (200, 201), user.text
            tokens.append(str(user.json()["token"]))
        return tokens

    # -- load ---------------------------------------------------------------------------

    def _submitter(
        self, replicas: list[LiveServer], tokens: list[str], plan: list[tuple[float, int]]
    ) -> None:
        """Submits on the plan's gaps; a few submissions may be in flight at once, so that
        one slow answer does not hold back the arrivals after it."""
        rng = random.Random(self.args.seed)
        code = code_zip({"train.py": "print('simulated')\n"})
        clients = [
            httpx.Client(base_url=r.url, headers={"Authorization": f"Bearer {t}"}, timeout=60)
            for r in replicas
            for t in tokens
        ]
        try:
            with ThreadPoolExecutor(max_workers=SUBMITTERS) as pool:
                for n, (gap, gpus) in enumerate(plan):
                    if self.stop.wait(gap):
                        return
                    body = manifest(
                        f"fleet-{n:05d}",
                        gpus,
                        rng.choice(PRIORITIES),
                        n % 5 == 0,
                        self.args.duration * rng.uniform(0.5, 1.5),
                    )
                    pool.submit(self._submit, rng.choice(clients), body, code)
        finally:
            for client in clients:
                client.close()

    def _submit(self, client: httpx.Client, body: str, code: bytes) -> None:
        if self.stop.is_set():
            return
        started = time.perf_counter()
        try:
            answer = client.post(
                "/v1/models",
                files={"manifest": ("m.yml", body.encode()), "model_definition": ("c.zip", code)},
            )
        except httpx.HTTPError:
            if not self.stop.is_set():
                with self.lock:
                    self.errors[0] += 1
            return
        took = time.perf_counter() - started
        with self.lock:
            if answer.status_code != 201:
                self.errors[answer.status_code] += 1
                return
            self.submitted.append(str(answer.json()["model_id"]))
            if self.measuring.is_set():
                self.latency["submit"].append(took)

    def _prober(self, replicas: list[LiveServer]) -> None:
        rng = random.Random(self.args.seed + 1)
        clients = [
            httpx.Client(base_url=r.url, headers={"Authorization": f"Bearer {r.token}"}, timeout=60)
            for r in replicas
        ]
        deep = max(0, self.stored - 100)
        # The same deep page by keyset (``after``): the cursor of the job just before it.
        cursor = clients[0].get("/v1/models", params={"limit": 1, "offset": max(deep - 1, 0)})
        after = cursor.json().get("next") if cursor.status_code == 200 else None
        try:
            while not self.stop.wait(0.1):
                client = rng.choice(clients)
                with self.lock:
                    known = list(self.submitted[-200:])
                calls = [("list", "/v1/models", {"limit": 50})]
                calls.append(("list deep", "/v1/models", {"limit": 50, "offset": deep}))
                if after is not None:
                    calls.append(("list after", "/v1/models", {"limit": 50, "after": after}))
                if known:
                    job_id = rng.choice(known)
                    calls.append(("show", f"/v1/models/{job_id}", {}))
                    calls.append(("loglines", f"/v1/logs/{job_id}/loglines", {"pagesize": 100}))
                for name, path, params in calls:
                    started = time.perf_counter()
                    answer = client.get(path, params=params)
                    took = time.perf_counter() - started
                    with self.lock:
                        if answer.status_code >= 400:
                            self.errors[answer.status_code] += 1
                        elif self.measuring.is_set():
                            self.latency[name].append(took)
        finally:
            for client in clients:
                client.close()

    def _load(
        self,
        replicas: list[LiveServer],
        everyone: list[LiveServer],
        tokens: list[str],
        harness_urls: list[str],
        harnesses: list[subprocess.Popen[bytes]],
        database_url: str,
        home: Path,
    ) -> dict[str, float | None]:
        args = self.args
        mean_learners = 1.6  # the Philly sizes in learners of 8 GPUs, about
        rate = args.learners / args.duration / mean_learners
        total_s = args.duration + args.window + 5
        # Arrivals for a little longer than the run (the submitter stops with it), at the
        # asked rate over that time.
        plan = arrivals(
            int(1.1 * rate * total_s) + 10,
            1.0 / rate,
            args.seed,
            poisson=args.arrivals == "poisson",
        )
        threads = [
            threading.Thread(target=self._submitter, args=(replicas, tokens, plan), daemon=True),
            threading.Thread(target=self._prober, args=(replicas,), daemon=True),
        ]
        for thread in threads:
            thread.start()
        admin = replicas[0].client
        pids = [r.proc.pid for r in everyone if r.proc is not None]
        progress(f"ramp of {args.duration:g} s: jobs arriving at {rate:.1f}/s")
        time.sleep(args.duration)  # the ramp: the cluster fills up to its steady state
        before_stats = harness_stats(harness_urls)
        before_harness_cpu = sum(process_cpu_s(h.pid) for h in harnesses)
        before = scrape_histograms(everyone)
        before_each = [process_cpu_s(pid) for pid in pids]
        before_cpu = sum(before_each)
        before_db = database_bytes(database_url, home)
        with self.lock:
            first_measured = len(self.submitted)
        self.measuring.set()
        running = before_stats["learners"].get("running", 0)
        progress(f"measuring for {args.window:g} s, {running} learners running")
        started = time.monotonic()
        time.sleep(args.window)  # the measured window, under load
        self.measuring.clear()
        elapsed = time.monotonic() - started
        after_stats = harness_stats(harness_urls)
        after_harness_cpu = sum(process_cpu_s(h.pid) for h in harnesses)
        after = scrape_histograms(everyone)
        after_each = [process_cpu_s(pid) for pid in pids]
        after_cpu = sum(after_each)
        after_db = database_bytes(database_url, home)
        with self.lock:
            measured = list(self.submitted[first_measured:])
        self.stop.set()
        progress("measured; reading the starts")
        for thread in threads:
            thread.join(timeout=120)

        to_processing, stages = self._starts(admin, database_url, measured)
        passes = {loop: after.buckets_since(before, PASSES, {"loop": loop}) for loop in LOOPS}
        served = after.buckets_since(before, REQUESTS, {"route": REPORTS})
        lines = after_stats["lines_acked"] - before_stats["lines_acked"]
        metrics = after_stats["metrics_acked"] - before_stats["metrics_acked"]
        scrape_started = time.perf_counter()
        scrape = admin.get("/metrics")
        scrape_s = time.perf_counter() - scrape_started
        figures: dict[str, float | None] = {
            "jobs stored": float(self.stored + len(self.submitted)),
            "learners running": float(after_stats["learners"].get("running", 0)),
            "to PROCESSING p50": quantile(to_processing, 0.5),
            "to PROCESSING p99": quantile(to_processing, 0.99),
            "started/s": len(to_processing) / elapsed,
            "sched pass p50": histogram_quantile(passes["scheduler"], 0.5),
            "sched pass p99": histogram_quantile(passes["scheduler"], 0.99),
            "LCM pass p50": histogram_quantile(passes["lcm"], 0.5),
            "LCM pass p99": histogram_quantile(passes["lcm"], 0.99),
            "lines/s": lines / elapsed,
            "metrics/s": metrics / elapsed,
            "backlog": float(after_stats["backlog_items"]),
            "report p50 ms": after_stats["post_p50_ms"],
            "report p99 ms": after_stats["post_p99_ms"],
            # The same posts as the replicas timed them, from their app's first byte to its
            # last: what is left of the learners' figure waited in sockets or the harness.
            "served p50 ms": _ms(histogram_quantile(served, 0.5)),
            "served p99 ms": _ms(histogram_quantile(served, 0.99)),
            # Of one core: where the two cores went while the reports poured in.
            "replicas CPU %": (after_cpu - before_cpu) / elapsed * 100,
            "busiest replica %": max(a - b for a, b in zip(after_each, before_each, strict=True))
            / elapsed
            * 100,
            "harness CPU %": (after_harness_cpu - before_harness_cpu) / elapsed * 100,
            "posts/s": (after_stats["posts"] - before_stats["posts"]) / elapsed,
            # What each post, and each line, cost the replicas, whatever else they did
            # meanwhile (loops, API calls) counted in.
            "CPU ms per post": (after_cpu - before_cpu)
            * 1000
            / max(1, after_stats["posts"] - before_stats["posts"]),
            "CPU µs per line": (after_cpu - before_cpu) * 1e6 / max(1, lines),
            "max RSS MiB": max(rss_mib(pid) for pid in pids),
            "DB MiB per M lines": (after_db - before_db) / 2**20 / (lines / 1e6) if lines else None,
            "scrape ms": scrape_s * 1000,
            "scrape KiB": len(scrape.content) / 1024,
            "CPU s per start": (after_cpu - before_cpu) / len(to_processing)
            if to_processing
            else None,
        }
        for loop in TIMED_LOOPS:
            spent = after.sum(PASSES, {"loop": loop}) - before.sum(PASSES, {"loop": loop})
            figures[f"{loop} %"] = spent / elapsed * 100
        for name, values in stages.items():
            figures[f"{name} p50"] = quantile(values, 0.5)
            figures[f"{name} p99"] = quantile(values, 0.99)
        for name, values in self.latency.items():
            figures[f"{name} p50"] = quantile(values, 0.5)
            figures[f"{name} p99"] = quantile(values, 0.99)
        figures["errors"] = float(sum(self.errors.values()))
        # Report posts the server answered with an error of its own (the learner retries).
        figures["reports failed"] = float(
            sum(n for code, n in after_stats["answers"].items() if int(code) >= 500)
        )
        return figures

    def _starts(
        self, admin: httpx.Client, database_url: str, job_ids: list[str]
    ) -> tuple[list[float], dict[str, list[float]]]:
        """Each start's submit → PROCESSING (from the job's own events), and where it went:
        queued (submit to PENDING, the scheduler), deploy (PENDING to its last learner
        launched, the lifecycle manager), report (that launch to the job's PROCESSING: the
        learners' first reports on the wire and stored)."""
        store = Store(database_url)
        try:
            with store.read() as session:
                rows = session.execute(
                    select(DeployStep.job_id, func.max(DeployStep.done_at))
                    .where(DeployStep.job_id.in_(job_ids), DeployStep.step.like("learner-%"))
                    .group_by(DeployStep.job_id)
                ).all()
        finally:
            store.dispose()
        launched = {job_id: _stamp(done_at.isoformat()) for job_id, done_at in rows}
        waits: list[float] = []
        stages: dict[str, list[float]] = {"queued": [], "deploy": [], "report": []}
        for job_id in job_ids:
            events = admin.get(f"/v1/models/{job_id}").json().get("events") or []
            firsts: dict[str, float] = {}
            for event in events:
                if event.get("learner") is None:
                    firsts.setdefault(str(event.get("to")), _stamp(event["time"]))
            queued, processing = firsts.get("QUEUED"), firsts.get("PROCESSING")
            if queued is None or processing is None:
                continue
            waits.append(processing - queued)
            pending, launch = firsts.get("PENDING"), launched.get(job_id)
            if pending is not None and launch is not None:
                stages["queued"].append(pending - queued)
                stages["deploy"].append(launch - pending)
                stages["report"].append(processing - launch)
        return waits, stages

    def _lost(self, database_url: str) -> int:
        """Jobs acknowledged but not stored (each must be there, in whatever status), read
        from the database in one query per thousand: asking the API job by job takes
        minutes with thousands of learners still reporting."""
        store = Store(database_url)
        found: set[str] = set()
        try:
            with store.read() as session:
                for first in range(0, len(self.submitted), 1000):
                    chunk = self.submitted[first : first + 1000]
                    found.update(session.scalars(select(Job.id).where(Job.id.in_(chunk))))
        finally:
            store.dispose()
        return len(set(self.submitted) - found)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _stamp(value: Any) -> float:
    return datetime.fromisoformat(str(value).rstrip("Z")).timestamp()


def keep_logs(tmp: Path, into: Path) -> None:
    """Copy a run's replica logs (with the loops' replica's) and the harness's log."""
    into.mkdir(parents=True, exist_ok=True)
    for log in [*sorted((tmp / "home").glob("*.log")), *sorted(tmp.glob("harness*.log"))]:
        if log.exists():
            shutil.copy(log, into / log.name)
    print(f"logs kept in {into}", flush=True)


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,1000,10000")
    parser.add_argument("--stored", default="0,100000")
    parser.add_argument("--setups", default="sqlite:1,postgres:1,postgres:3")
    parser.add_argument("--learners", type=int, default=2000)
    parser.add_argument("--duration", type=float, default=60.0, help="a job's length, seconds")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--lines-per-s", type=float, default=2.0)
    parser.add_argument("--metrics-per-s", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--records-at-once",
        type=int,
        default=8,
        help="each replica's report_records_at_once (records-only batches stored at once)",
    )
    parser.add_argument(
        "--report-posts-per-s",
        type=float,
        default=15.0,
        help="each replica's report_posts_per_s (the pace it asks of its learners; 0: none)",
    )
    parser.add_argument(
        "--loops",
        choices=("spread", "together", "apart"),
        default="spread",
        help="replicas on PostgreSQL divide the loops (spread), one runs them all (together), "
        "or one more runs them all and the setup's replicas serve the API only (apart)",
    )
    parser.add_argument(
        "--arrivals",
        choices=("trace", "poisson"),
        default="trace",
        help="gaps between jobs: the trace's, bursts and lulls kept (trace), or a steady "
        "Poisson stream of the same mean (poisson); sizes from the trace either way",
    )
    parser.add_argument(
        "--harnesses", type=int, default=1, help="harness processes sharing the learners"
    )
    parser.add_argument(
        "--platform-cpus",
        default=None,
        help="CPUs for the replicas and PostgreSQL, e.g. 0,1; the harnesses get the others",
    )
    parser.add_argument(
        "--logs", type=Path, default=None, help="keep each run's replica and harness logs here"
    )
    args, _ = parser.parse_known_args()
    try:
        node_counts = [int(n) for n in args.nodes.split(",")]
        stored_counts = [int(n) for n in args.stored.split(",")]
        setups = [Setup(s.split(":")[0], int(s.split(":")[1])) for s in args.setups.split(",")]
    except (ValueError, IndexError):
        parser.error("--nodes and --stored take numbers, --setups STORE:REPLICAS, comma-separated")
    for setup in setups:
        if setup.store not in ("sqlite", "postgres") or setup.replicas < 1:
            parser.error(f"--setups: unknown store or replica count in {setup}")
    if args.loops == "apart" and any(setup.store != "postgres" for setup in setups):
        parser.error("--loops apart needs PostgreSQL setups (API-only replicas need it)")
    if args.records_at_once < 1:
        parser.error("--records-at-once must be at least 1")
    if args.report_posts_per_s < 0:
        parser.error("--report-posts-per-s must be at least 0")
    if args.harnesses < 1:
        parser.error("--harnesses must be at least 1")
    if args.platform_cpus is not None:
        try:
            args.platform_cpus = {int(cpu) for cpu in args.platform_cpus.split(",")}
        except ValueError:
            parser.error("--platform-cpus takes CPU numbers, comma-separated, e.g. 0,1")
        usable = os.sched_getaffinity(0)
        if not args.platform_cpus < usable:
            parser.error(
                f"--platform-cpus must be some of this process's CPUs {sorted(usable)}, "
                "leaving at least one for the harnesses"
            )
    runs = []
    for nodes in node_counts:
        for stored in stored_counts:
            for setup in setups:
                print(f"running {setup.label}, {nodes} nodes, {stored} jobs stored ...", flush=True)
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        runs.append(Fleet(args, setup, nodes, stored).run(Path(tmp)))
                    finally:
                        if args.logs is not None:
                            keep_logs(
                                Path(tmp),
                                args.logs / f"{setup.store}-{setup.replicas}"
                                f"-{nodes}-nodes-{stored}-stored",
                            )
    print(
        f"\nfleet: {args.learners} learners targeted, jobs of about {args.duration:g} s, "
        f"{args.lines_per_s:g} lines/s and {args.metrics_per_s:g} metrics/s per learner, "
        f"{args.window:g} s measured after a {args.duration:g} s ramp"
    )
    harnesses = f"{args.harnesses} harness process{'es' if args.harnesses > 1 else ''}"
    if args.platform_cpus is not None:
        others = len(os.sched_getaffinity(0) - args.platform_cpus)
        print(
            f"control plane (replicas, PostgreSQL) pinned to CPUs "
            f"{','.join(map(str, sorted(args.platform_cpus)))}; {harnesses} and the "
            f"client on the other {others}"
        )
    else:
        print(f"{harnesses}, all sharing this machine's {os.cpu_count()} CPUs")
    print_runs(runs)
    return {"lost": float(sum(run.lost for run in runs))}


if __name__ == "__main__":
    raise SystemExit(1 if main()["lost"] else 0)
