"""The controller's side of the load figures: the workers' files, turned into ``Signals``.

``LoadWindow`` keeps each worker's recent samples (what it published, see ``counters.py``)
and measures the pool over the last ``window_s``: the increase of each worker's cumulative
counters since the start of the window, added over workers. A worker that exited within
the window still counts with what it last published; one that started within it counts from
its start. Times are ``time.monotonic()`` readings, one clock for every process on Linux.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ffdl.server.pool.counters import BOUNDS, quantile
from ffdl.server.pool.files import read_json, worker_file
from ffdl.server.pool.policy import Signals

_EMPTY_LATENCY = (0,) * (len(BOUNDS) + 1)


@dataclass(frozen=True)
class TrackSample:
    requests: int = 0
    in_flight: int = 0
    busy_s: float = 0.0
    latency: tuple[int, ...] = _EMPTY_LATENCY

    @classmethod
    def parse(cls, data: Any) -> TrackSample:
        latency = tuple(int(n) for n in data["latency"])
        if len(latency) != len(_EMPTY_LATENCY):
            raise ValueError("latency buckets differ")
        return cls(int(data["requests"]), int(data["in_flight"]), float(data["busy_s"]), latency)

    def minus(self, other: TrackSample) -> TrackSample:
        return TrackSample(
            requests=self.requests - other.requests,
            in_flight=self.in_flight,
            busy_s=self.busy_s - other.busy_s,
            latency=tuple(a - b for a, b in zip(self.latency, other.latency, strict=True)),
        )

    def plus(self, other: TrackSample) -> TrackSample:
        return TrackSample(
            requests=self.requests + other.requests,
            in_flight=self.in_flight + other.in_flight,
            busy_s=self.busy_s + other.busy_s,
            latency=tuple(a + b for a, b in zip(self.latency, other.latency, strict=True)),
        )


@dataclass(frozen=True)
class Sample:
    """What one worker published once."""

    pid: int
    at: float
    started: float
    ready: bool
    draining: bool
    all: TrackSample
    reports: TrackSample


def read_sample(directory: Path, pid: int) -> Sample | None:
    """Worker ``pid``'s latest figures; None before its first ones (or if unreadable)."""
    data = read_json(worker_file(directory, pid))
    if data is None:
        return None
    try:
        return Sample(
            pid=int(data["pid"]),
            at=float(data["at"]),
            started=float(data["started"]),
            ready=bool(data["ready"]),
            draining=bool(data["draining"]),
            all=TrackSample.parse(data["all"]),
            reports=TrackSample.parse(data["reports"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Measured:
    """The window's signals, plus what the pool's view shows beside them."""

    signals: Signals
    in_flight_now: int
    report_in_flight_now: int

    def to_json(self) -> dict[str, Any]:
        s = self.signals
        return {
            "serving": s.serving,
            "booting": s.booting,
            "requests_per_s": round(s.rps, 2),
            "p95_ms": _round(s.p95_ms),
            "in_flight": round(s.in_flight, 2),
            "in_flight_per_worker": round(s.in_flight / max(s.serving, 1), 2),
            "in_flight_now": self.in_flight_now,
            "reports_per_s": round(s.report_rps, 2),
            "report_p95_ms": _round(s.report_p95_ms),
            "report_in_flight": round(s.report_in_flight, 2),
            "report_in_flight_now": self.report_in_flight_now,
            "requests_in_window": s.requests,
            "reports_in_window": s.reports,
        }


class LoadWindow:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._history: dict[int, deque[Sample]] = {}

    def add(self, samples: Iterable[Sample]) -> None:
        for sample in samples:
            history = self._history.setdefault(sample.pid, deque())
            if not history or sample.at > history[-1].at:
                history.append(sample)

    def measure(self, now: float, serving: int, booting: int) -> Measured:
        start = now - self.window_s
        self._prune(start)
        total_all = TrackSample()
        total_reports = TrackSample()
        now_all = now_reports = 0
        for history in self._history.values():
            last = history[-1]
            base = _baseline(history, start)
            total_all = total_all.plus(last.all.minus(base.all) if base else last.all)
            total_reports = total_reports.plus(
                last.reports.minus(base.reports) if base else last.reports
            )
            if last.at >= start:
                now_all += last.all.in_flight
                now_reports += last.reports.in_flight
        window = self.window_s
        signals = Signals(
            serving=serving,
            booting=booting,
            rps=total_all.requests / window,
            p95_ms=_ms(quantile(total_all.latency, 0.95)),
            in_flight=total_all.busy_s / window,
            report_rps=total_reports.requests / window,
            report_p95_ms=_ms(quantile(total_reports.latency, 0.95)),
            report_in_flight=total_reports.busy_s / window,
            requests=total_all.requests,
            reports=total_reports.requests,
        )
        return Measured(signals, now_all, now_reports)

    def _prune(self, start: float) -> None:
        for pid in list(self._history):
            history = self._history[pid]
            # Keep one sample at or before the window's start: the baseline.
            while len(history) > 1 and history[1].at <= start:
                history.popleft()
            if history[-1].at < start:
                del self._history[pid]


def _baseline(history: Sequence[Sample], start: float) -> Sample | None:
    """What to subtract from a worker's latest figures: its sample at the window's start,
    nothing if it started within the window, else its oldest sample."""
    first = history[0]
    if first.at <= start:
        return first
    if first.started >= start:
        return None
    return first


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
