"""The pool's master: gunicorn's arbiter with ffdl's workers, and the controller resizing it.

``run_pool`` runs gunicorn in this process as its arbiter (master): it holds the listening
socket and forks the workers (``worker.PoolWorker``, uvicorn-worker's ``UvicornWorker``).
Nothing of the app exists in the master: each worker builds its own (``create_app``) after
the fork, with its own database engine, backend and threads, and runs the app's lifespan,
loops included (the loops' leases decide which process runs each). What every worker would
otherwise race to do on a first start (migrate the schema, create the administrator and the
client config) is done once here first, on an engine disposed before any fork.

The controller is a thread of the master, started once gunicorn is ready. Every
``pool_interval_s`` it reads the workers' counter files (``counters.py``), measures the
window (``signals.py``), asks the policy (``policy.py``) and writes the pool's view
(``pool.json``, which ``/v1/cluster/pool`` serves from any worker). A change sets the
arbiter's ``num_workers`` and wakes its main loop, the way gunicorn's own control socket
(``gunicornc worker add|remove``) resizes a pool: an absolute target, so nothing is lost or
counted twice as SIGTTIN/SIGTTOU signals could be, and the arbiter alone, in its main
thread, forks or retires workers (the oldest first, with SIGTERM: a graceful drain).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication  # type: ignore[import-untyped]
from gunicorn.arbiter import Arbiter  # type: ignore[import-untyped]
from gunicorn.errors import AppImportError  # type: ignore[import-untyped]

from ffdl.server.announce import announce
from ffdl.server.heap import freeze_start_up_objects
from ffdl.server.pool.counters import LoadMiddleware, Publisher, WorkerCounters
from ffdl.server.pool.files import STATE_FILE, clear, remove, run_dir, worker_file, write_json
from ffdl.server.pool.policy import Change, Policy, PoolState, decide
from ffdl.server.pool.signals import LoadWindow, Measured, Sample, read_sample
from ffdl.server.pool.worker import LIFESPAN_GRACE_S, PoolWorker
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.transport import gunicorn_tls, hangup_check

log = logging.getLogger("ffdl.server.pool")

PUBLISH_INTERVAL_S = 0.5
KEPT_CHANGES = 50


def prepare(settings: Settings) -> None:
    """Migrate the schema, create the administrator, the client config and the secret, once
    and before any worker starts; nothing of it stays open across the forks."""
    from ffdl.server.app import prepare_home

    store = Store(settings.db_url)
    try:
        prepare_home(settings, store)
    finally:
        store.dispose()


class Controller:
    """Samples the workers and resizes the arbiter's pool by ``policy``."""

    def __init__(
        self,
        arbiter: Any,
        policy: Policy,
        settings: Settings,
        directory: Path,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.arbiter = arbiter
        self.policy = policy
        self.settings = settings
        self.directory = directory
        self.clock = clock
        self.window = LoadWindow(settings.pool_window_s)
        self.state = PoolState(size=policy.minimum)
        self.changes: deque[dict[str, Any]] = deque(maxlen=KEPT_CHANGES)
        self.totals: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pool-controller", daemon=True)

    def start(self) -> None:
        self.tick()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.pool_interval_s):
            try:
                self.tick()
            except Exception:
                # The pool keeps its size; the next sample may go better.
                log.exception("the API pool's controller failed a turn")

    def tick(self) -> None:
        now = self.clock()
        target = int(self.arbiter.num_workers)
        workers = self._workers()
        # The arbiter retires the oldest workers beyond its target: those are draining.
        retiring = {pid for pid, _age in workers[: max(0, len(workers) - target)]}
        samples = {pid: read_sample(self.directory, pid) for pid, _age in workers}
        self.window.add(sample for sample in samples.values() if sample is not None)
        staying = {pid: s for pid, s in samples.items() if pid not in retiring}
        serving = sum(1 for s in staying.values() if s and s.ready and not s.draining)
        booting = sum(1 for s in staying.values() if s is None or not s.ready)
        measured = self.window.measure(now, serving, booting)
        self.state, change = decide(
            self.policy, replace(self.state, size=target), measured.signals, now
        )
        if change is not None:
            self._apply(change)
            retiring = {pid for pid, _age in workers[: max(0, len(workers) - change.new)]}
        write_json(self.directory / STATE_FILE, self.view(measured, samples, retiring))

    def _workers(self) -> list[tuple[int, int]]:
        """The arbiter's workers as (pid, age), oldest first."""
        for _attempt in range(3):
            try:
                found = [(int(pid), int(w.age)) for pid, w in list(self.arbiter.WORKERS.items())]
            except RuntimeError:  # the arbiter changed its table while we read it
                continue
            return sorted(found, key=lambda item: item[1])
        return []

    def _apply(self, change: Change) -> None:
        self.arbiter.num_workers = change.new
        self.arbiter.wakeup()
        self.totals[change.direction] += 1
        log.info("API pool: %s", change.reason)
        self.changes.append(
            {
                "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "from": change.old,
                "to": change.new,
                "direction": change.direction,
                "reason": change.reason,
            }
        )

    def view(
        self, measured: Measured, samples: dict[int, Sample | None], retiring: set[int]
    ) -> dict[str, Any]:
        p = self.policy
        settings = self.settings
        return {
            "enabled": True,
            "master_pid": os.getpid(),
            "updated_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "size": self.state.size,
            "min": p.minimum,
            "max": p.maximum,
            "workers": [
                {
                    "pid": pid,
                    "state": _worker_state(sample, pid in retiring),
                    "in_flight": sample.all.in_flight if sample else 0,
                    "requests": sample.all.requests if sample else 0,
                }
                for pid, sample in samples.items()
            ],
            "signals": measured.to_json(),
            "policy": {
                "interval_s": settings.pool_interval_s,
                "window_s": settings.pool_window_s,
                "grow_after_s": p.grow_after_s,
                "shrink_after_s": p.shrink_after_s,
                "cooldown_s": p.cooldown_s,
                "step": p.step,
                "min_latency_samples": p.min_latency_samples,
                "thresholds": {
                    t.name: {"grow": t.grow, "shrink": t.shrink, "per_worker": t.per_worker}
                    for t in p.thresholds
                },
            },
            "changes_total": {"grow": self.totals["grow"], "shrink": self.totals["shrink"]},
            "changes": list(self.changes),
            "state": {k: v for k, v in asdict(self.state).items() if k != "size"},
        }


def _worker_state(sample: Sample | None, retiring: bool) -> str:
    """``draining`` (it said so), ``retiring`` (the arbiter is retiring it), ``booting``
    (no figures yet, or its app not started) or ``serving``."""
    if sample is not None and sample.draining:
        return "draining"
    if retiring:
        return "retiring"
    if sample is None or not sample.ready:
        return "booting"
    return "serving"


class PoolApplication(BaseApplication):  # type: ignore[misc]
    """gunicorn's application for the pool: its configuration, and the app each worker
    builds after the fork."""

    def __init__(self, settings: Settings, policy: Policy) -> None:
        self.settings = settings
        self.policy = policy
        self.directory = run_dir(settings.home, settings.port)
        self.controller: Controller | None = None
        # The pool's size when SIGHUP restarts the workers: as many come back.
        self.workers_now: int | None = None
        # Read by each ``PoolWorker``: how long a keep-alive connection serves.
        self.connection_max_s = settings.pool_connection_max_s
        super().__init__()

    def load_config(self) -> None:
        s = self.settings
        host = f"[{s.host}]" if ":" in s.host else s.host
        values: dict[str, Any] = {
            "bind": [f"{host}:{s.port}"],
            "workers": self.workers_now or self.policy.minimum,
            "worker_class": PoolWorker,
            "preload_app": False,
            "graceful_timeout": s.pool_graceful_s + LIFESPAN_GRACE_S,
            "keepalive": s.pool_keepalive_s,
            "loglevel": "warning",
            "errorlog": "-",
            "accesslog": None,
            "proc_name": f"ffdl-api-{s.port}",
            "control_socket_disable": True,
            "when_ready": self._when_ready,
            "child_exit": self._child_exit,
            "on_exit": self._on_exit,
            **gunicorn_tls(s),
        }
        for name, value in values.items():
            self.cfg.set(name, value)

    def run(self) -> None:
        try:
            PoolArbiter(self).run()
        except RuntimeError as exc:
            # As gunicorn's own ``run``: its arbiter's fatal errors are one line.
            raise SystemExit(f"ffdl: {exc}") from None

    def load(self) -> LoadMiddleware:
        """The worker's app (called in the worker, after the fork)."""
        from ffdl.server.app import STARTUP_ERRORS, create_app

        counters = WorkerCounters()
        try:
            app = create_app(self.settings)
        except STARTUP_ERRORS as exc:
            # gunicorn prints this and stops the whole pool, as one process would stop.
            raise AppImportError(f"ffdl: {exc}") from None
        Publisher(counters, worker_file(self.directory, os.getpid()), PUBLISH_INTERVAL_S).start()
        served = LoadMiddleware(app, counters)
        freeze_start_up_objects()
        return served

    def _when_ready(self, arbiter: Any) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        clear(self.directory)
        self.controller = Controller(arbiter, self.policy, self.settings, self.directory)
        self.controller.start()
        p, url = self.policy, self.settings.api_url
        kind = "an elastic pool of" if p.elastic else "a fixed pool of"
        size = f"{p.minimum}..{p.maximum}" if p.elastic else f"{p.minimum}"
        log.info("API served by %s %s workers; the pool at %s/v1/cluster/pool", kind, size, url)
        announce(self.settings)

    def _child_exit(self, _arbiter: Any, worker: Any) -> None:
        remove(worker_file(self.directory, int(worker.pid)))

    def _on_exit(self, _arbiter: Any) -> None:
        if self.controller is not None:
            self.controller.stop()
        clear(self.directory)


class PoolArbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's arbiter, whose SIGHUP takes up a renewed TLS certificate (checked first:
    a bad one is refused and the workers keep serving the current one) by restarting the
    workers gracefully, as many as serve now; ``ffdl.server.transport`` says the rest."""

    def handle_hup(self) -> None:
        app: PoolApplication = self.app
        refused = hangup_check(app.settings)
        if refused is not None:
            log.warning("%s", refused)
            return
        app.workers_now = int(self.num_workers)
        log.info(
            "SIGHUP: serving the certificate in %s; restarting %d workers gracefully",
            app.settings.tls_cert,
            app.workers_now,
        )
        super().handle_hup()


def run_pool(settings: Settings, policy: Policy) -> None:
    """Serve the API from the pool until gunicorn stops (SIGTERM, SIGINT)."""
    prepare(settings)
    PoolApplication(settings, policy).run()
