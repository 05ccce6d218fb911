"""A pool worker's load counters: counted by an ASGI middleware, published to a file.

Each worker counts, for all requests and separately for the learner controllers' reports
(``POST /v1/internal/.../reports``, the platform's own measure of pressure): requests
answered, requests in flight now, the time integral of in flight (``busy_s``: its increase
over a window divided by the window is the average number in flight, however short-lived
each request) and a latency histogram. All are cumulative, so the controller takes
differences over any window it likes and adds workers' figures together (percentiles of
separate workers cannot be added; histograms can).

A request counts from when the app receives it until its response starts: the time to the
first byte. A follow stream (SSE) or a download is then no longer "in flight", and a slow
upload is, since reading it is the work.

A thread, not the event loop, writes the file every ``interval_s`` (a few hundred bytes,
replaced whole): a worker whose event loop is stuck still reports its growing in-flight
time, which is the load the controller must see.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ffdl.server.pool.files import remove, write_json

# Latency buckets: upper bounds in seconds, 1 ms growing by a quarter each to ~70 s; one
# more bucket holds everything slower. A percentile read from them is within 25%.
BOUNDS: tuple[float, ...] = tuple(0.001 * 1.25**i for i in range(51))
# The scope extension by which the server (``worker.DrainingH11Protocol``) marks a request
# as its connection's last: the worker retires, or the connection is old enough to hand
# its client to whichever worker accepts its next connection (the pool may have grown).
CLOSE_CONNECTION = "ffdl.close_connection"
_REPORTS = re.compile(r"^/v1/internal/.+/reports/?$")


def is_report(path: str) -> bool:
    """Whether ``path`` is where learner controllers post their reports."""
    return _REPORTS.match(path) is not None


def quantile(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) in seconds of a histogram over ``BOUNDS``; None if empty."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            low = BOUNDS[index - 1] if index > 0 else 0.0
            high = BOUNDS[index] if index < len(BOUNDS) else BOUNDS[-1] * 2
            return low + (high - low) * max(0.0, rank - seen) / count
        seen += count
    return BOUNDS[-1] * 2


class Track:
    """The counters of one class of requests."""

    def __init__(self, now: float) -> None:
        self.requests = 0
        self.in_flight = 0
        self.busy_s = 0.0
        self.latency = [0] * (len(BOUNDS) + 1)
        self._since = now

    def advance(self, now: float) -> None:
        self.busy_s += self.in_flight * max(0.0, now - self._since)
        self._since = now

    def finish(self, seconds: float) -> None:
        self.in_flight -= 1
        self.requests += 1
        self.latency[bisect.bisect_left(BOUNDS, seconds)] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "busy_s": self.busy_s,
            "latency": list(self.latency),
        }


class WorkerCounters:
    """One worker's counters. The event loop counts; the publisher thread reads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.started = clock()
        self.all = Track(self.started)
        self.reports = Track(self.started)
        # Set when the app has started (its lifespan) and when the worker begins to retire.
        self.ready = False
        self.draining = False

    def begin(self, report: bool) -> float:
        with self._lock:
            now = self._clock()
            self._advance(now)
            self.all.in_flight += 1
            if report:
                self.reports.in_flight += 1
            return now

    def end(self, began: float, report: bool) -> None:
        with self._lock:
            now = self._clock()
            self._advance(now)
            self.all.finish(now - began)
            if report:
                self.reports.finish(now - began)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            now = self._clock()
            self._advance(now)
            return {
                "pid": os.getpid(),
                "at": now,
                "started": self.started,
                "ready": self.ready,
                "draining": self.draining,
                "all": self.all.to_json(),
                "reports": self.reports.to_json(),
            }

    def _advance(self, now: float) -> None:
        self.all.advance(now)
        self.reports.advance(now)


class LoadMiddleware:
    """Counts every HTTP request of ``app`` in ``counters``; marks the worker ready when
    the app's lifespan has started; answers ``Connection: close`` where the server marked
    the request the last of its connection (``CLOSE_CONNECTION``), so that the client sends
    its next one on a new connection, knowing, instead of meeting a closed one."""

    def __init__(self, app: ASGIApp, counters: WorkerCounters) -> None:
        self.app = app
        self.counters = counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._lifespan_send(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        report = is_report(str(scope.get("path", "")))
        began = self.counters.begin(report)
        counting = True

        async def counted_send(message: Message) -> None:
            nonlocal counting
            if message["type"] == "http.response.start":
                if counting:
                    counting = False
                    self.counters.end(began, report)
                if CLOSE_CONNECTION in (scope.get("extensions") or {}):
                    message = _closing(message)
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        finally:
            if counting:  # no response (the client left, or the app failed)
                self.counters.end(began, report)

    def _lifespan_send(self, send: Send) -> Send:
        async def lifespan_send(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                self.counters.ready = True
            await send(message)

        return lifespan_send


def _closing(message: Message) -> Message:
    headers = [
        (name, value)
        for name, value in message.get("headers", [])
        if bytes(name).lower() != b"connection"
    ]
    return {**message, "headers": [*headers, (b"connection", b"close")]}


class Publisher:
    """Rewrites the worker's counters file every ``interval_s`` from a daemon thread."""

    def __init__(self, counters: WorkerCounters, path: Path, interval_s: float = 0.5) -> None:
        self.counters = counters
        self.path = path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pool-counters", daemon=True)

    def start(self) -> None:
        self.publish()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval_s)
        remove(self.path)

    def publish(self) -> None:
        # OSError: the run directory went away (the pool is stopping): no one to tell.
        with contextlib.suppress(OSError):
            write_json(self.path, self.counters.snapshot())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.publish()
