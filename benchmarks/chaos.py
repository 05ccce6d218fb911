"""Chaos: many jobs from concurrent clients while the platform's parts are killed at random.

``python benchmarks/chaos.py`` (``make chaos``) submits ``--jobs`` jobs from ``--clients``
client threads to a live server. Each job prints numbered lines, checkpoints through the
SDK every few lines and has ``max_restarts: 3``. Meanwhile, at random, the chaos thread:

- SIGKILLs the server, keeps it down for ``--down-min``..``--down-max`` seconds and starts
  it again on the same home and port;
- SIGKILLs one learner controller, or one user process;
- halts a running job and resumes it once it is HALTED.

Clients retry a submit that failed on the connection with the same ``Idempotency-Key``.
When every job has ended it prints what was acknowledged, stored, completed, failed,
duplicated or lost; the log lines expected, delivered, duplicated and missing; restarts
taken; the server's recovery times; and the processes of the jobs left running (orphans).
Goal: 0 lost, 0 duplicated, 0 missing lines, 0 orphans, every job COMPLETED, recovery to
``/health`` under 2 s.

A line is ``chaos <job> run <token> line <n>``: ``token`` is drawn anew by each start of the
job's process, so a line printed again by a later attempt (which resumed from an older
checkpoint) is a re-execution, not a duplicate; a duplicate is the same (token, n) twice.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from _server import (
    FAST_CONFIG,
    LiveServer,
    all_models,
    code_zip,
    job_pids,
    manifest_yaml,
    median,
    wait_for,
)

JOB_SCRIPT = """
import os, sys, time, uuid
from ffdl.sdk.api import load_checkpoint, save_checkpoint, should_stop

name, lines = sys.argv[1], int(sys.argv[2])
token = uuid.uuid4().hex[:8]
restored = load_checkpoint()
start = restored[0] + 1 if restored else 1
for n in range(start, lines + 1):
    print(f"chaos {name} run {token} line {n}", flush=True)
    if n % 5 == 0:
        save_checkpoint(str(n).encode(), n)
    if should_stop():
        sys.exit(0)
    time.sleep(0.05)
"""
LINE = re.compile(r"^chaos (?P<name>\S+) run (?P<token>\S+) line (?P<n>\d+)$")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}


@dataclass
class Settings:
    jobs: int = 300
    clients: int = 6
    lines: int = 60
    seed: int = 1
    down_min_s: float = 1.0
    down_max_s: float = 60.0
    chaos_every_s: float = 4.0
    server_kills: int = 5
    deadline_s: float = 3600.0


@dataclass
class Report:
    acknowledged: int = 0
    stored: int = 0
    completed: int = 0
    failed: int = 0
    duplicated_jobs: int = 0
    lost_jobs: int = 0
    lines_expected: int = 0
    lines_delivered: int = 0
    lines_duplicated: int = 0
    lines_missing: int = 0
    restarts: int = 0
    server_kills: int = 0
    controller_kills: int = 0
    process_kills: int = 0
    halts: int = 0
    recovery_health_s: list[float] = field(default_factory=list)
    recovery_first_change_s: list[float] = field(default_factory=list)
    orphans: int = 0
    wall_s: float = 0.0

    @property
    def clean(self) -> bool:
        return (
            self.lost_jobs == 0
            and self.duplicated_jobs == 0
            and self.lines_missing == 0
            and self.lines_duplicated == 0
            and self.orphans == 0
            and self.completed == self.acknowledged
        )


class Chaos:
    def __init__(self, settings: Settings, home: Path) -> None:
        self.settings = settings
        self.random = random.Random(settings.seed)
        # Fast loops, but the platform's own patience: a controller keeps trying to report
        # for report_deadline_s (600 s), longer than any outage this run causes.
        config = {**FAST_CONFIG, "report_deadline_s": 600.0, "heartbeat_timeout_s": 30.0}
        config["nodes"] = [
            {"name": f"node-{i}", "gpus": 4, "cpus": 16, "memory": "64GiB", "gpu_type": "cpu"}
            for i in range(2)
        ]
        self.server = LiveServer(home=home, config=config)
        self.report = Report()
        self.submitted: dict[str, str] = {}  # job name -> model id acknowledged
        self.lock = threading.Lock()
        self.server_up = threading.Event()
        self.done = threading.Event()
        self.restarted_at: list[float] = []

    # -- clients ---------------------------------------------------------------------------

    def _client(self, names: list[str]) -> None:
        code = {"job.py": JOB_SCRIPT}
        for name in names:
            manifest = manifest_yaml(
                f"python job.py {name} {self.settings.lines}",
                name=name,
                memory="512MiB",
                max_restarts=3,
            )
            # One key and one archive per job: a retry must send the same bytes.
            key, archive = uuid.uuid4().hex, code_zip(code)
            while not self.done.is_set():
                self.server_up.wait()
                try:
                    response = self._submit(manifest, archive, key)
                except httpx.HTTPError:
                    time.sleep(0.2)  # the server is down: retry with the same key
                    continue
                if response.status_code in (200, 201):
                    with self.lock:
                        self.submitted[name] = str(response.json()["model_id"])
                    break
                if response.status_code >= 500:
                    time.sleep(0.2)
                    continue
                raise RuntimeError(f"submit of {name} refused: {response.text}")

    def _submit(self, manifest: str, archive: bytes, key: str) -> httpx.Response:
        with httpx.Client(base_url=self.server.url, timeout=30) as client:
            return client.post(
                "/v1/models",
                headers={"Authorization": f"Bearer {self.server.token}", "Idempotency-Key": key},
                files={
                    "manifest": ("manifest.yml", manifest.encode(), "application/x-yaml"),
                    "model_definition": ("model.zip", archive, "application/zip"),
                },
            )

    # -- chaos -----------------------------------------------------------------------------

    def _kill_server(self) -> None:
        self.server_up.clear()
        assert self.server.proc is not None
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait()
        self.server.proc = None
        self.server._client = None
        down = self.random.uniform(self.settings.down_min_s, self.settings.down_max_s)
        self.done.wait(down)
        started = time.monotonic()
        restarted_wall = time.time()
        self.server.start()
        self.report.recovery_health_s.append(time.monotonic() - started)
        self.restarted_at.append(restarted_wall)
        self.report.server_kills += 1
        self.server_up.set()

    def _running_jobs(self) -> list[str]:
        with self.lock:
            ids = list(self.submitted.values())
        running = []
        for job_id in ids:
            with contextlib.suppress(httpx.HTTPError, AssertionError):
                if self.server.status(job_id) == "PROCESSING":
                    running.append(job_id)
        return running

    def _kill_controller(self, job_id: str) -> None:
        pids = list((self.server.home / "jobs" / job_id / "learners").rglob("launched.pid"))
        if pids:
            with contextlib.suppress(ProcessLookupError, ValueError, OSError):
                os.kill(int(max(pids, key=lambda p: p.stat().st_mtime).read_text()), 9)
                self.report.controller_kills += 1

    def _kill_process(self, job_id: str) -> None:
        pids = sorted(job_pids(job_id))
        if pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[-1], signal.SIGKILL)
                self.report.process_kills += 1

    def _halt_and_resume(self, job_id: str) -> None:
        client = self.server.client
        if client.patch(f"/v1/models/{job_id}", json={"status": "halt"}).status_code != 202:
            return
        self.report.halts += 1
        with contextlib.suppress(AssertionError):
            self.server.wait_status(job_id, {"HALTED"}, timeout=60)
        client.patch(f"/v1/models/{job_id}", json={"status": "resume"})

    def _chaos(self) -> None:
        kills_left = self.settings.server_kills
        while not self.done.wait(self.random.expovariate(1 / self.settings.chaos_every_s)):
            if not self.server_up.is_set():
                continue
            action = self.random.choice(["server", "controller", "process", "halt"])
            try:
                if action == "server":
                    if kills_left > 0:
                        kills_left -= 1
                        self._kill_server()
                    continue
                running = self._running_jobs()
                if not running:
                    continue
                job_id = self.random.choice(running)
                if action == "controller":
                    self._kill_controller(job_id)
                elif action == "process":
                    self._kill_process(job_id)
                else:
                    self._halt_and_resume(job_id)
            except (httpx.HTTPError, AssertionError):
                continue  # the server went away under us; the next round tries again

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> Report:
        started = time.monotonic()
        self.server.start()
        self.server_up.set()
        names = [f"j{i:04d}" for i in range(self.settings.jobs)]
        shares = [names[i :: self.settings.clients] for i in range(self.settings.clients)]
        clients = [threading.Thread(target=self._client, args=(s,)) for s in shares]
        chaos = threading.Thread(target=self._chaos, daemon=True)
        for thread in clients:
            thread.start()
        chaos.start()
        try:
            for thread in clients:
                thread.join()
            self._wait_all_ended(started)
        finally:
            self.done.set()
            chaos.join(timeout=120)
            self.server_up.wait(timeout=120)
        try:
            self._collect()
            self.report.orphans = self._orphans()
        finally:
            self.server.stop()
            self.server.kill_learners()
        self.report.wall_s = time.monotonic() - started
        return self.report

    def _wait_all_ended(self, started: float) -> None:
        def all_ended() -> bool:
            if not self.server_up.is_set():
                return False
            try:
                models = self._models()
            except httpx.HTTPError:
                return False
            return all(m["training"]["training_status"]["status"] in TERMINAL for m in models)

        remaining = self.settings.deadline_s - (time.monotonic() - started)
        wait_for(all_ended, timeout=max(remaining, 60), interval=1.0, what="every job to end")

    def _models(self) -> list[dict[str, Any]]:
        return all_models(self.server.client)

    def _collect(self) -> None:
        report = self.report
        report.acknowledged = len(self.submitted)
        models = self._models()
        by_name: dict[str, list[dict[str, Any]]] = {}
        for model in models:
            by_name.setdefault(model["name"], []).append(model)
        report.stored = len(models)
        report.duplicated_jobs = sum(len(v) - 1 for v in by_name.values() if len(v) > 1)
        report.lost_jobs = sum(1 for name in self.submitted if name not in by_name)
        first_changes: list[float] = []
        for name, job_id in self.submitted.items():
            model = self.server.model(job_id)
            status = model["training"]["training_status"]["status"]
            report.completed += status == "COMPLETED"
            report.failed += status == "FAILED"
            report.restarts += int((model.get("restarts") or {}).get("taken") or 0)
            first_changes += [
                datetime.fromisoformat(e["time"]).timestamp() for e in model["events"]
            ]
            self._count_lines(name, job_id)
        for restarted in self.restarted_at:
            later = [t for t in first_changes if t >= restarted]
            if later:
                report.recovery_first_change_s.append(min(later) - restarted)

    def _count_lines(self, name: str, job_id: str) -> None:
        seen: set[tuple[str, int]] = set()
        steps: set[int] = set()
        for item in self.server.loglines(job_id):
            match = LINE.match(item["line"])
            if match is None or match["name"] != name:
                continue
            key = (match["token"], int(match["n"]))
            self.report.lines_delivered += 1
            if key in seen:
                self.report.lines_duplicated += 1
            seen.add(key)
            steps.add(key[1])
        self.report.lines_expected += self.settings.lines
        self.report.lines_missing += self.settings.lines - len(steps)

    def _orphans(self) -> int:
        # A job's processes end with it; give the last kills a moment to land.
        def none_left() -> bool:
            return not any(job_pids(job_id) for job_id in self.submitted.values())

        with contextlib.suppress(AssertionError):
            wait_for(none_left, timeout=15, interval=0.2, what="the jobs' processes to end")
        return sum(len(job_pids(job_id)) for job_id in self.submitted.values())


def run_chaos(settings: Settings, home: Path) -> Report:
    return Chaos(settings, home).run()


def print_report(settings: Settings, report: Report) -> None:
    r = report
    print(
        f"chaos: {settings.jobs} jobs × {settings.lines} lines from {settings.clients} clients, "
        f"{r.wall_s:.0f} s"
    )
    print(
        f"  faults: {r.server_kills} server kills (down {settings.down_min_s:g}–"
        f"{settings.down_max_s:g} s), {r.controller_kills} controller kills, "
        f"{r.process_kills} user-process kills, {r.halts} halt/resume"
    )
    print(
        f"  jobs: acknowledged {r.acknowledged}, stored {r.stored}, completed {r.completed}, "
        f"failed {r.failed}, duplicated {r.duplicated_jobs}, lost {r.lost_jobs}; "
        f"restarts taken {r.restarts}"
    )
    print(
        f"  log lines: expected {r.lines_expected}, delivered {r.lines_delivered}, "
        f"duplicated {r.lines_duplicated}, missing {r.lines_missing}"
    )
    if r.recovery_health_s:
        print(
            f"  recovery: restart → /health median {median(r.recovery_health_s):.2f} s, "
            f"max {max(r.recovery_health_s):.2f} s (goal < 2 s); restart → first status change "
            f"median {median(r.recovery_first_change_s):.2f} s"
        )
    print(f"  orphan processes after the run: {r.orphans}")
    print(f"  verdict: {'clean' if r.clean else 'NOT CLEAN'}")


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Settings()
    parser.add_argument("--jobs", type=int, default=defaults.jobs)
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--lines", type=int, default=defaults.lines)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--down-min", type=float, default=defaults.down_min_s)
    parser.add_argument("--down-max", type=float, default=defaults.down_max_s)
    parser.add_argument("--server-kills", type=int, default=defaults.server_kills)
    args, _unknown = parser.parse_known_args()
    settings = Settings(
        jobs=args.jobs,
        clients=args.clients,
        lines=args.lines,
        seed=args.seed,
        down_min_s=args.down_min,
        down_max_s=args.down_max,
        server_kills=args.server_kills,
    )
    with tempfile.TemporaryDirectory() as tmp:
        report = run_chaos(settings, Path(tmp) / "home")
    print_report(settings, report)
    return {"lost": report.lost_jobs, "missing_lines": report.lines_missing}


if __name__ == "__main__":
    main()
