"""The load figures: what a worker counts (``counters.py``), what it publishes, and what
the controller measures from them over a window (``signals.py``)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ffdl.server.pool.counters import (
    BOUNDS,
    CLOSE_CONNECTION,
    LoadMiddleware,
    Publisher,
    WorkerCounters,
    is_report,
    quantile,
)
from ffdl.server.pool.signals import LoadWindow, Sample, TrackSample, read_sample


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_reports_are_the_controllers_report_posts_only() -> None:
    assert is_report("/v1/internal/jobs/training-abc/learners/1/reports")
    assert not is_report("/v1/internal/jobs/training-abc/code")
    assert not is_report("/v1/internal/jobs/training-abc/learners/1/results")
    assert not is_report("/v1/models/reports")


def test_a_histogram_percentile_is_within_a_bucket_of_the_truth() -> None:
    counters = WorkerCounters(clock=Clock())
    track = counters.all
    durations = [0.002 * i for i in range(1, 101)]  # 2 ms .. 200 ms, p95 = 190 ms
    for seconds in durations:
        track.in_flight += 1
        track.finish(seconds)
    p95 = quantile(track.latency, 0.95)
    assert p95 is not None and 190e-3 / 1.25 <= p95 <= 190e-3 * 1.25
    assert quantile([0] * (len(BOUNDS) + 1), 0.95) is None


def test_busy_time_integrates_the_requests_in_flight() -> None:
    clock = Clock(0.0)
    counters = WorkerCounters(clock=clock)
    first = counters.begin(report=False)  # t=0: 1 in flight
    clock.now = 1.0
    second = counters.begin(report=True)  # t=1: 2 in flight
    clock.now = 3.0
    counters.end(first, report=False)  # t=3: 1 in flight
    clock.now = 4.0
    counters.end(second, report=True)
    snap = counters.snapshot()
    # 1 s x 1 + 2 s x 2 + 1 s x 1 = 6 request-seconds, 4 s of it with a report in flight.
    assert snap["all"]["busy_s"] == 6.0 and snap["reports"]["busy_s"] == 3.0
    assert snap["all"]["requests"] == 2 and snap["reports"]["requests"] == 1
    assert snap["all"]["in_flight"] == 0


def sample(
    pid: int, at: float, requests: int, busy_s: float, *, started: float = 0.0, **extra: Any
) -> Sample:
    latency = [0] * (len(BOUNDS) + 1)
    latency[10] = requests  # all about 9 ms
    track = TrackSample(requests, extra.pop("in_flight", 0), busy_s, tuple(latency))
    return Sample(pid, at, started, True, False, track, extra.pop("reports", TrackSample()))


def test_the_window_adds_workers_and_takes_differences_over_it() -> None:
    window = LoadWindow(window_s=5.0)
    window.add([sample(1, 10.0, 100, 20.0), sample(2, 10.0, 40, 5.0)])
    window.add([sample(1, 15.0, 600, 45.0, in_flight=3), sample(2, 15.0, 140, 10.0)])
    measured = window.measure(15.0, serving=2, booting=0)
    s = measured.signals
    assert s.requests == 600 and s.rps == 120.0  # (500 + 100) / 5 s
    assert s.in_flight == 6.0  # (25 + 5) request-seconds / 5 s
    assert s.p95_ms is not None and 6 < s.p95_ms < 10
    assert measured.in_flight_now == 3
    view = measured.to_json()
    assert view["in_flight_per_worker"] == 3.0 and view["requests_per_s"] == 120.0


def test_a_worker_started_in_the_window_counts_from_zero_and_a_gone_one_still_counts() -> None:
    window = LoadWindow(window_s=5.0)
    window.add([sample(1, 10.0, 100, 10.0)])
    window.add([sample(1, 12.0, 150, 12.0)])  # worker 1 exits after this
    window.add([sample(2, 14.0, 30, 2.0, started=11.0)])
    s = window.measure(15.0, serving=1, booting=0).signals
    assert s.requests == 50 + 30
    # Once out of the window, the gone worker is forgotten.
    window.add([sample(2, 20.0, 60, 4.0, started=11.0)])
    s = window.measure(20.0, serving=1, booting=0).signals
    assert s.requests == 30


def test_a_published_file_reads_back_as_a_sample(tmp_path: Path) -> None:
    clock = Clock(50.0)
    counters = WorkerCounters(clock=clock)
    began = counters.begin(report=True)
    clock.now = 50.25
    counters.end(began, report=True)
    counters.ready = True
    path = tmp_path / f"worker-{os.getpid()}.json"
    publisher = Publisher(counters, path, interval_s=60)
    publisher.start()
    try:
        read = read_sample(tmp_path, os.getpid())
        assert read is not None and read.ready and not read.draining
        assert read.all.requests == 1 and read.reports.requests == 1 and read.at == 50.25
        assert json.loads(path.read_text())["pid"] == os.getpid()
    finally:
        publisher.stop()
    assert not path.exists(), "a stopped publisher removes its file"
    path.write_text("{half a fi")
    assert read_sample(tmp_path, os.getpid()) is None


def test_the_middleware_counts_requests_marks_ready_and_closes_where_asked() -> None:
    release = asyncio.Event()

    async def slow(_request: Request) -> PlainTextResponse:
        await release.wait()
        return PlainTextResponse("done")

    async def fast(_request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    inner = Starlette(
        routes=[
            Route("/slow", slow),
            Route("/v1/internal/jobs/j/learners/1/reports", fast, methods=["POST"]),
            Route("/fast", fast),
        ]
    )
    counters = WorkerCounters()
    app = LoadMiddleware(inner, counters)

    async def server(scope: Scope, receive: Receive, send: Send) -> None:
        # What ``DrainingH11Protocol`` does to a connection's last request.
        if scope["type"] == "http" and (b"x-last", b"1") in scope["headers"]:
            scope.setdefault("extensions", {})[CLOSE_CONNECTION] = {}
        await app(scope, receive, send)

    async def scenario() -> None:
        await lifespan_startup(app)
        assert counters.ready
        transport = httpx.ASGITransport(app=server)
        async with httpx.AsyncClient(transport=transport, base_url="http://pool") as client:
            pending = asyncio.create_task(client.get("/slow"))
            while counters.all.in_flight == 0:
                await asyncio.sleep(0.01)
            assert counters.all.in_flight == 1
            release.set()
            assert (await pending).text == "done"
            report = await client.post("/v1/internal/jobs/j/learners/1/reports")
            assert report.status_code == 200 and "connection" not in report.headers
            closing = await client.get("/fast", headers={"x-last": "1"})
            assert closing.headers["connection"] == "close"
            assert "connection" not in (await client.get("/fast")).headers
        assert (counters.all.requests, counters.reports.requests) == (4, 1)
        assert counters.all.in_flight == 0

    asyncio.run(scenario())


async def lifespan_startup(app: LoadMiddleware) -> None:
    sent: list[dict[str, Any]] = []
    messages = iter([{"type": "lifespan.startup"}])
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        try:
            return next(messages)
        except StopIteration:
            await done.wait()
            return {"type": "lifespan.shutdown"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "lifespan.startup.complete":
            done.set()

    await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
