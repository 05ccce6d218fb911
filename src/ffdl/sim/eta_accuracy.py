"""How good the platform's estimates are, measured on a simulated Philly-derived workload.

Two estimates are judged against what then happens in the simulation:

- **start-time ETAs**: the start time the queue shows a job the first time it computes one
  (the live scheduler's ``QueueSimulation``, through ``schedule``), against its real start;
- **time left** of running jobs: at every scheduling pass, each running job's estimated end
  against its real end.

Each is measured twice, the way the platform can know when a running job ends:

- ``declared``: from the duration users declare (``expected_duration``). Users guess: the
  declared duration is the true one times a log-normal factor (σ = ``DECLARED_SIGMA``, a
  median guess right, one in three off by more than 2×), seeded per job;
- ``progress``: from the job's own reports (``ffdl.core.progress``, fed the samples done so
  far against the total each job declares, every pass), as the live platform does once a
  job reports a total. Queued jobs still count on their declared durations in both modes.

Run it with ``python benchmarks/eta_accuracy.py``; ``docs/simulations/eta-accuracy.md``
holds the figures.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ffdl.core.progress import Report, advance
from ffdl.scheduler.policy import schedule
from ffdl.sim.engine import Simulator
from ffdl.sim.jobs import JobState, SimConfig
from ffdl.sim.philly import TraceFilter, load_philly
from ffdl.sim.policies import SchedulerPolicy
from ffdl.sim.snapshots import build_snapshot
from ffdl.sim.state import SimState
from ffdl.sim.workload import SimJob

DECLARED_SIGMA = 0.7
MODES = ("declared", "progress")


@dataclass(slots=True)
class EtaWatch(SchedulerPolicy):
    """The live scheduler's pass (backfill, preemption), noting every estimate it makes."""

    progress_based: bool = False
    first_eta: dict[str, float] = field(default_factory=dict)
    # (job id, at, estimated end) for every running job at every pass
    ends: list[tuple[str, float, float]] = field(default_factory=list)
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)

    def wants_pass(self, sim: SimState) -> bool:
        return bool(sim.queue) or bool(sim.running)

    def decide(self, sim: SimState) -> None:
        self._estimate_running(sim)
        records = list(sim.queued_in_order())
        built = build_snapshot(
            sim, records, backfill=True, preemption=True, placement=self.placement
        )
        if built is None:
            return
        sim.scheduler_calls += 1
        decisions = schedule(built.snapshot, backfill=True, preemption=True)
        for waiting in decisions.waiting:
            if waiting.eta_s is not None and waiting.job_id not in self.first_eta:
                self.first_eta[waiting.job_id] = sim.now + waiting.eta_s
        for preempt in decisions.preemptions:
            sim.preempt(sim.records[preempt.job_id])
        for start in decisions.starts:
            if start.job_id not in self.first_eta:
                self.first_eta[start.job_id] = sim.now  # started at its first look
            sim.start(sim.records[start.job_id], start.placement)

    def _estimate_running(self, sim: SimState) -> None:
        for record in sim.running.values():
            view = record.running_view
            if view is None or record.state != JobState.RUNNING:
                continue
            if self.progress_based:
                total = int(record.job.work)
                state = self.reports.get(record.id)
                if state is None or state.get("attempt") != record.attempt:
                    # A live job reports every few seconds from its start; passes come
                    # less often, so its first report of this attempt is taken as made then.
                    first = Report(time=record.productive_from, samples=int(record.done))
                    state = advance(state, replace(first, total_samples=total), record.attempt)
                worked = max(sim.now - record.productive_from, 0.0) * record.rate
                done = min(record.done + worked, record.job.work)
                state = advance(
                    state,
                    Report(time=sim.now, samples=int(done), total_samples=total),
                    record.attempt,
                )
                self.reports[record.id] = state
                end = state.get("estimated_end_at")
                record.running_view = replace(view, estimated_end_at=end)
            else:
                declared = record.job.expected_duration_s
                end = None if declared is None else view.started_at + declared
            if end is not None:
                self.ends.append((record.id, sim.now, float(end)))


@dataclass(frozen=True, slots=True)
class Accuracy:
    mode: str
    jobs: int
    started_after_waiting: int
    start_median_s: float
    start_p90_s: float
    remaining_median_s: float
    remaining_p90_s: float
    remaining_samples: int
    remaining_relative_median: float


def with_guessed_durations(jobs: Sequence[SimJob], seed: int) -> list[SimJob]:
    """``jobs`` with users' guesses for declared durations (see the module docstring)."""
    guessed = []
    for job in jobs:
        rng = random.Random(f"{seed}:{job.id}")
        factor = math.exp(rng.gauss(0.0, DECLARED_SIGMA))
        true = job.expected_duration_s or 1.0
        guessed.append(replace(job, expected_duration_s=max(true * factor, 1.0)))
    return guessed


def measure(nodes: Sequence[Any], jobs: Sequence[SimJob], mode: str) -> Accuracy:
    """Simulate ``jobs`` on ``nodes`` with estimates made the ``mode`` way; their errors."""
    watch = EtaWatch(name=f"eta-{mode}", progress_based=mode == "progress")
    # Every queued job in every pass (no snapshot reductions): every job gets its ETA.
    sim = Simulator(nodes, jobs, watch, SimConfig(reductions=False), label=mode)
    result = sim.run()
    outcomes = {o.id: o for o in result.outcomes}
    finish = {o.id: o.finish_s for o in result.outcomes if o.finish_s is not None}
    start_errors = [
        abs(started - eta)
        for job, eta in watch.first_eta.items()
        if (started := outcomes[job].first_start_s) is not None
        and started - outcomes[job].submit_s > 1.0  # it waited
    ]
    remaining = [
        (abs(end - finish[job]), finish[job] - at) for job, at, end in watch.ends if job in finish
    ]
    absolute = [error for error, _ in remaining]
    relative = [error / left for error, left in remaining if left > 60.0]
    return Accuracy(
        mode=mode,
        jobs=len(jobs),
        started_after_waiting=len(start_errors),
        start_median_s=_median(start_errors),
        start_p90_s=_quantile(start_errors, 0.9),
        remaining_median_s=_median(absolute),
        remaining_p90_s=_quantile(absolute, 0.9),
        remaining_samples=len(absolute),
        remaining_relative_median=_median(relative),
    )


def philly_workload(days: int = 2, sample: float = 0.1) -> list[SimJob]:
    """Submissions of the first ``days`` of the Philly window, sampled, for 64 GPUs."""
    start = datetime(2017, 10, 16)
    end = datetime(2017, 10, 16 + days)
    return load_philly(None, TraceFilter(start=start, end=end, sample=sample), max_gpus=64)


def report(results: Sequence[Accuracy]) -> str:
    lines = [
        f"{'estimates from':<16}{'start ETA error':>26}{'time-left error':>34}",
        f"{'':<16}{'median':>10}{'p90':>10}{'jobs':>6}{'median':>10}{'p90':>10}{'rel. median':>14}",
    ]
    for r in results:
        lines.append(
            f"{r.mode:<16}{_duration(r.start_median_s):>10}{_duration(r.start_p90_s):>10}"
            f"{r.started_after_waiting:>6}{_duration(r.remaining_median_s):>10}"
            f"{_duration(r.remaining_p90_s):>10}{r.remaining_relative_median:>13.0%}"
        )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
