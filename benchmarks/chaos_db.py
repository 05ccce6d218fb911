"""Chaos with the database as the fault: PostgreSQL killed and failed over while jobs run.

``python benchmarks/chaos_db.py`` (``make chaos-db``) starts a PostgreSQL primary and a
synchronous streaming-replication standby on 127.0.0.1, and ``--replicas`` ``ffdl up``
processes sharing them through one multi-host URL (``target_session_attrs=read-write``).
``--clients`` threads submit ``--jobs`` jobs through the Python client, spread over the
run, so that submits also arrive while the database is away; each job prints numbered
lines ``chaos <job> run <token> line <n>`` (``token`` drawn anew by each start of its
process, so a job started twice shows two). A follow stream is open on every third job
from its submit to its end.

Meanwhile the primary is killed (as ``pg_ctl stop -m immediate`` does) for each of
``--kills`` seconds in turn and started again; then (unless ``--no-failover``) it is killed
for good and the standby promoted ``--promote-after`` seconds later. After each fault it
measures the time from the database's return to every loop being led again.

At the end it prints jobs acknowledged / completed / failed / duplicated / lost; log lines
expected / delivered / duplicated / missing (from the API, and from the follow streams);
restarts taken; API errors by status; lease tokens taken by two replicas; and the times to
recover. Goal: 0 failed, lost, duplicated or missing, no 500, every job COMPLETED.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from _server import FAST_CONFIG, LiveServer, all_models, wait_for
from tests.postgres import USER, PostgresServer

from ffdl.client.http import ApiError, Client
from ffdl.server.leases import LOOPS

JOB_SCRIPT = """
import sys, time, uuid
name, lines, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
token = uuid.uuid4().hex[:8]
for n in range(1, lines + 1):
    print(f"chaos {name} run {token} line {n}", flush=True)
    time.sleep(pause)
"""
LINE = re.compile(r"^chaos (?P<name>\S+) run (?P<token>\S+) line (?P<n>\d+)$")
LEADS = re.compile(r"replica (?P<replica>\S+) leads (?P<loop>\w+) \(token (?P<token>\d+)\)")
ENDED = ("COMPLETED", "FAILED", "CANCELLED")


@dataclass
class Settings:
    jobs: int = 60
    clients: int = 4
    replicas: int = 2
    lines: int = 40
    pause_s: float = 0.25
    kills: tuple[float, ...] = (5.0, 30.0, 120.0)
    failover: bool = True
    promote_after_s: float = 5.0
    # Between faults, and before the first: jobs run and submits arrive meanwhile.
    gap_s: float = 15.0
    follow_every: int = 3
    heartbeat_timeout_s: float = 10.0
    lease_ttl_s: float = 3.0
    seed: int = 1
    deadline_s: float = 1800.0


@dataclass
class Report:
    acknowledged: int = 0
    stored: int = 0
    completed: int = 0
    failed: int = 0
    duplicated_jobs: int = 0
    lost_jobs: int = 0
    double_deploys: int = 0
    restarts: int = 0
    lines_expected: int = 0
    lines_delivered: int = 0
    lines_duplicated: int = 0
    lines_missing: int = 0
    followed: int = 0
    followed_missing: int = 0
    followed_duplicated: int = 0
    api_statuses: Counter[int] = field(default_factory=Counter)
    tokens_taken_twice: int = 0
    faults: list[str] = field(default_factory=list)
    recovery_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.api_statuses.items() if status >= 500 and status != 503)

    def clean(self) -> bool:
        return (
            self.completed == self.acknowledged == self.stored
            and not self.failed
            and not self.duplicated_jobs
            and not self.lost_jobs
            and not self.double_deploys
            and not self.lines_duplicated
            and not self.lines_missing
            and not self.followed_missing
            and not self.followed_duplicated
            and not self.server_errors
            and not self.tokens_taken_twice
            and not self.failures
        )


class CountingTransport(httpx.HTTPTransport):
    """Counts the error statuses every client of the run was answered."""

    def __init__(self, statuses: Counter[int], lock: threading.Lock) -> None:
        super().__init__()
        self._statuses = statuses
        self._lock = lock

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if response.status_code >= 400:
            with self._lock:
                self._statuses[response.status_code] += 1
        return response


class DatabaseChaos:
    def __init__(self, settings: Settings, home: Path) -> None:
        self.settings = settings
        self.home = home
        self.primary = PostgresServer(crash_safe=True)
        self.standby: PostgresServer | None = None
        self.replicas: list[LiveServer] = []
        self.report = Report()
        self.lock = threading.Lock()
        self.submitted: dict[str, str] = {}
        self.followed: dict[str, list[tuple[str, int]]] = {}
        self.threads: list[threading.Thread] = []

    # -- set-up -------------------------------------------------------------------------

    def _start(self) -> None:
        self.primary.start()
        url = self._database_url_after_standby()
        config = {
            **FAST_CONFIG,
            "database_url": url,
            "lease_ttl_s": self.settings.lease_ttl_s,
            "heartbeat_timeout_s": self.settings.heartbeat_timeout_s,
            "nodes": [
                {"name": f"node-{n}", "gpus": 4, "cpus": 16, "memory": "32GiB", "gpu_type": "cpu"}
                for n in "ab"
            ],
        }
        for n in range(self.settings.replicas):  # one after another: the first makes the schema
            replica = LiveServer(home=self.home, config=dict(config), log_name=f"r{n}.log")
            replica.start()
            self.replicas.append(replica)

    def _database_url_after_standby(self) -> str:
        # The database first, so that the standby's copy holds it.
        database = self.primary.create_database().rsplit("/", 1)[1]
        self.standby = self.primary.standby()
        hosts = "&".join(f"host=127.0.0.1:{server.port}" for server in (self.primary, self.standby))
        return f"postgresql+psycopg://{USER}@/{database}?{hosts}&target_session_attrs=read-write"

    def _client(self, replica: LiveServer) -> Client:
        return Client(
            replica.url,
            replica.token,
            transport=CountingTransport(self.report.api_statuses, self.lock),
        )

    # -- clients ------------------------------------------------------------------------

    def _submitter(self, names: list[str], rng: random.Random, spread_s: float) -> None:
        code = self.home.parent / f"code-{names[0]}"
        code.mkdir(parents=True, exist_ok=True)
        (code / "job.py").write_text(JOB_SCRIPT)
        for name in names:
            time.sleep(rng.uniform(0, 2 * spread_s))  # the pace of arrivals, not a wait
            manifest = code / f"{name}.yml"
            manifest.write_text(manifest_text(name, self.settings.lines, self.settings.pause_s))
            replica = rng.choice(self.replicas)
            try:
                with self._client(replica) as client:
                    created = client.submit(manifest, code, retries=8)
            except ApiError as exc:
                with self.lock:
                    self.report.failures.append(f"submit of {name}: {exc.message}")
                continue
            job_id = str(created["model_id"])
            with self.lock:
                self.submitted[name] = job_id
            if len(self.submitted) % self.settings.follow_every == 0:
                follower = threading.Thread(
                    target=self._follow, args=(name, job_id, replica), daemon=True
                )
                with self.lock:
                    self.threads.append(follower)
                follower.start()

    def _follow(self, name: str, job_id: str, replica: LiveServer) -> None:
        seen: list[tuple[str, int]] = []
        try:
            with self._client(replica) as client:
                for event in client.follow(job_id, reconnect_window=60.0, read_timeout=30.0):
                    if event.kind != "log":
                        continue
                    match = LINE.match(str(event.data.get("line", "")))
                    if match is not None and match["name"] == name:
                        seen.append((match["token"], int(match["n"])))
        except ApiError as exc:
            with self.lock:
                self.report.failures.append(f"follow of {name}: {exc.message}")
        with self.lock:
            self.followed[name] = seen

    # -- faults ---------------------------------------------------------------------------

    def _leases(self) -> dict[str, Any] | None:
        for replica in self.replicas:
            with contextlib.suppress(httpx.HTTPError):
                answer = replica.client.get("/v1/replicas", timeout=5)
                if answer.status_code == 200:
                    body: dict[str, Any] = answer.json()
                    return body
        return None

    def _all_led_since(self, returned: datetime) -> bool:
        """Whether every loop's lease was renewed or taken since ``returned`` (naive UTC)."""
        view = self._leases()
        if view is None:
            return False
        alive = {r["id"] for r in view["replicas"] if r["alive"]}
        renewed_after = returned + timedelta(seconds=self.settings.lease_ttl_s)
        leases = {lease["name"]: lease for lease in view["leases"]}
        return all(
            loop in leases
            and leases[loop]["holder"] in alive
            and datetime.fromisoformat(leases[loop]["expires_at"].rstrip("Z")) > renewed_after
            for loop in LOOPS
        )

    def _recovered(self, what: str) -> None:
        returned, started = datetime.now(UTC).replace(tzinfo=None), time.monotonic()
        wait_for(
            lambda: self._all_led_since(returned),
            timeout=120,
            interval=0.05,
            what=f"every loop led after {what}",
        )
        self.report.recovery_s.append(time.monotonic() - started)
        self.report.faults.append(what)

    def _faults(self, done: threading.Event) -> None:
        for seconds in self.settings.kills:
            if done.wait(self.settings.gap_s):
                return
            self.primary.kill()
            time.sleep(seconds)  # the outage's length: the fault itself
            self.primary.start_again()
            self._recovered(f"kill {seconds:g} s")
        if self.settings.failover:
            if done.wait(self.settings.gap_s):
                return
            assert self.standby is not None
            self.primary.kill()
            # What a failover manager takes to notice the primary is gone and promote.
            time.sleep(self.settings.promote_after_s)
            self.standby.promote()
            self._recovered("failover")

    # -- the run --------------------------------------------------------------------------

    def run(self) -> Report:
        settings = self.settings
        done = threading.Event()
        try:
            self._start()
            names = [f"job{n:03d}" for n in range(settings.jobs)]
            run_s = sum(settings.kills) + settings.gap_s * (len(settings.kills) + 2)
            spread = run_s / max(1, settings.jobs / settings.clients) / 2
            submitters = [
                threading.Thread(
                    target=self._submitter,
                    args=(names[i :: settings.clients], random.Random(settings.seed + i), spread),
                )
                for i in range(settings.clients)
            ]
            faults = threading.Thread(target=self._faults, args=(done,))
            faults.start()
            for thread in submitters:
                thread.start()
            for thread in submitters:
                thread.join()
            faults.join()
            wait_for(self._all_ended, timeout=settings.deadline_s, interval=1.0, what="every job")
            for thread in list(self.threads):
                thread.join(timeout=120)
            self._collect()
        finally:
            done.set()
            for replica in self.replicas:
                replica.stop()
            if self.replicas:
                self.replicas[0].kill_learners()
            if self.standby is not None:
                self.standby.stop()
            self.primary.stop()
        return self.report

    def _all_ended(self) -> bool:
        with self.lock:
            ids = list(self.submitted.values())
        with contextlib.suppress(httpx.HTTPError, AssertionError):
            replica = self.replicas[0]
            return all(replica.status(job_id) in ENDED for job_id in ids)
        return False

    def _collect(self) -> None:
        report = self.report
        replica = self.replicas[0]
        report.acknowledged = len(self.submitted)
        models = all_models(replica.client)
        by_name = Counter(str(model["name"]) for model in models)
        report.stored = len(models)
        report.duplicated_jobs = sum(n - 1 for n in by_name.values())
        report.lost_jobs = sum(1 for name in self.submitted if name not in by_name)
        for name, job_id in self.submitted.items():
            model = replica.model(job_id)
            status = model["training"]["training_status"]["status"]
            report.completed += status == "COMPLETED"
            report.failed += status == "FAILED"
            report.restarts += int((model.get("restarts") or {}).get("taken") or 0)
            delivered = [
                (m["token"], int(m["n"]))
                for item in replica.loglines(job_id)
                if (m := LINE.match(item["line"])) is not None and m["name"] == name
            ]
            report.lines_expected += self.settings.lines
            report.lines_delivered += len(delivered)
            report.lines_duplicated += len(delivered) - len(set(delivered))
            report.lines_missing += self.settings.lines - len({n for _, n in delivered})
            report.double_deploys += max(0, len({token for token, _ in delivered}) - 1)
        for seen in self.followed.values():
            report.followed += 1
            report.followed_duplicated += len(seen) - len(set(seen))
            report.followed_missing += self.settings.lines - len({n for _, n in seen})
        report.tokens_taken_twice = tokens_taken_twice(self.home, len(self.replicas))


def manifest_text(name: str, lines: int, pause_s: float) -> str:
    return (
        f"name: {name}\nversion: '1.0'\nlearners: 1\ngpus: 1\ncpus: 1\nmemory: 256MiB\n"
        f"framework:\n  name: custom\n  version: '1'\n"
        f"  command: python job.py {name} {lines} {pause_s}\n"
    )


def tokens_taken_twice(home: Path, replicas: int) -> int:
    """Lease tokens that two replicas each say they took: a loop led twice at once."""
    takers: dict[tuple[str, int], set[str]] = {}
    for n in range(replicas):
        log = (home / f"r{n}.log").read_text(errors="replace")
        for match in LEADS.finditer(log):
            key = (match["loop"], int(match["token"]))
            takers.setdefault(key, set()).add(match["replica"])
    return sum(1 for replicas_ in takers.values() if len(replicas_) > 1)


def run_chaos(settings: Settings, home: Path) -> Report:
    return DatabaseChaos(settings, home).run()


def print_report(settings: Settings, report: Report, took_s: float) -> None:
    kills = ", ".join(f"{s:g} s" for s in settings.kills) or "none"
    print(
        f"database chaos: {settings.jobs} jobs × {settings.lines} lines from "
        f"{settings.clients} clients, {settings.replicas} replicas on a PostgreSQL primary "
        f"and standby, {took_s:.0f} s"
    )
    print(f"  faults: primary killed for {kills}; failover: {'yes' if settings.failover else 'no'}")
    for what, seconds in zip(report.faults, report.recovery_s, strict=True):
        print(f"  database back → every loop led again ({what}): {seconds:.2f} s")
    print(
        f"  jobs: acknowledged {report.acknowledged}, stored {report.stored}, completed "
        f"{report.completed}, failed {report.failed}, duplicated {report.duplicated_jobs}, "
        f"lost {report.lost_jobs}; double deploys {report.double_deploys}; restarts taken "
        f"{report.restarts}"
    )
    print(
        f"  log lines: expected {report.lines_expected}, delivered {report.lines_delivered}, "
        f"duplicated {report.lines_duplicated}, missing {report.lines_missing}"
    )
    print(
        f"  follow streams: {report.followed}, lines missing {report.followed_missing}, "
        f"duplicated {report.followed_duplicated}"
    )
    statuses = ", ".join(f"{s}: {n}" for s, n in sorted(report.api_statuses.items())) or "none"
    print(f"  API errors by status: {statuses}")
    print(f"  lease tokens taken by two replicas: {report.tokens_taken_twice}")
    for failure in report.failures:
        print(f"  failure: {failure}")
    print(f"  verdict: {'clean' if report.clean() else 'NOT CLEAN'}")


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    parser.add_argument("--jobs", type=int, default=defaults.jobs)
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--replicas", type=int, default=defaults.replicas)
    parser.add_argument("--lines", type=int, default=defaults.lines)
    parser.add_argument(
        "--kills",
        default=",".join(f"{s:g}" for s in defaults.kills),
        help="seconds the primary stays down, comma-separated, one kill each",
    )
    parser.add_argument("--no-failover", action="store_true")
    parser.add_argument("--promote-after", type=float, default=defaults.promote_after_s)
    parser.add_argument("--gap", type=float, default=defaults.gap_s)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args, _ = parser.parse_known_args()
    try:
        kills = tuple(float(s) for s in args.kills.split(",") if s.strip())
    except ValueError:
        parser.error(f"--kills takes seconds separated by commas, not {args.kills!r}")
    if any(s <= 0 for s in kills):
        parser.error("--kills: every outage lasts more than 0 seconds")
    settings = Settings(
        jobs=args.jobs,
        clients=args.clients,
        replicas=args.replicas,
        lines=args.lines,
        kills=kills,
        failover=not args.no_failover,
        promote_after_s=args.promote_after,
        gap_s=args.gap,
        seed=args.seed,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        report = run_chaos(settings, Path(tmp) / "home")
    print_report(settings, report, time.monotonic() - started)
    return {
        "jobs_completed": float(report.completed),
        "lines_missing": float(report.lines_missing),
        "server_errors": float(report.server_errors),
        "clean": float(report.clean()),
    }


if __name__ == "__main__":
    raise SystemExit(0 if main()["clean"] else 1)
