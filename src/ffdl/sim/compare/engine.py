"""The policy comparison's engine: scheduling rounds on a cluster of identical nodes.

Every ``interval_s`` (60 s) the policy is shown every arrived, unfinished job (``JobView``) and
answers a ``Decision`` for each: GPUs and global batch. The engine then

1. **checks** the answer: GPUs within the cluster, and every running job's local batch
   ``batch / gpus`` inside its family's per-GPU limits (``PolicyError`` otherwise), so that
   no policy can run a batch that would not fit in GPU memory;
2. **places** the GPUs on nodes (``placement.place``): a job whose GPU count is unchanged
   keeps its nodes; the others are packed onto as few nodes as possible;
3. **charges restarts**: a job that starts, or whose GPU count or nodes change, makes no
   progress for ``restart_s`` (30 s) after the round (a checkpoint-restart). A change of batch
   size alone is free: a data-parallel job can take a new batch at its next step;
4. **advances** time to the next round in steps of ``step_s``, each running job moving at its
   goodput ``T(g, b, nodes) * E(b)``, with ``E`` read at the job's progress (the gradient
   noise scale grows as it trains). A job that completes its work mid-step ends at the
   interpolated instant; its GPUs are free from the next round on. Each round a job runs
   records the step time it ran at (``JobView.observed``), for policies that learn speeds.

The engine knows nothing of any policy beyond the ``Policy`` protocol.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ffdl.elastic.throughput import StepObservation
from ffdl.sim.compare.jobs import CompareJob, Decision, JobView, SeenSteps
from ffdl.sim.compare.placement import place

DEFAULT_INTERVAL_S = 60.0
DEFAULT_RESTART_S = 30.0
DEFAULT_STEP_S = 15.0
# Step times kept per job, as the live autoscaler keeps them.
MAX_OBSERVATIONS = 200


class PolicyError(ValueError):
    """A policy answered something the cluster cannot run."""


class Policy(Protocol):
    """A scheduling policy: one decision per job shown, every round."""

    name: str

    def decide(
        self, now: float, jobs: Sequence[JobView], total_gpus: int, gpus_per_node: int
    ) -> Mapping[str, Decision]: ...


@dataclass(frozen=True, slots=True)
class ClusterShape:
    nodes: int = 16
    gpus_per_node: int = 4

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(slots=True)
class _Running:
    job: CompareJob
    done: float = 0.0  # useful samples
    gpus: int = 0
    batch: int = 0
    placement: dict[int, int] = field(default_factory=dict)  # node -> GPUs
    paused_until: float = 0.0
    attained_gpu_s: float = 0.0
    last_held_s: float | None = None
    run_started_s: float | None = None
    last_run_s: float = 0.0
    first_start_s: float | None = None
    restarts: int = 0
    observed: SeenSteps = field(default_factory=SeenSteps)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    id: str
    family: str
    submit_s: float
    first_start_s: float | None
    finish_s: float | None
    restarts: int

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.submit_s


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    outcomes: tuple[JobOutcome, ...]
    gpu_seconds_held: float  # GPU-seconds allocated to jobs over the run
    end_s: float  # when the last job finished, or the horizon

    def jcts(self) -> list[float]:
        return [o.jct_s for o in self.outcomes if o.jct_s is not None]

    @property
    def completed(self) -> int:
        return sum(1 for o in self.outcomes if o.finish_s is not None)

    @property
    def restarts(self) -> int:
        return sum(o.restarts for o in self.outcomes)

    @property
    def makespan_s(self) -> float:
        first = min((o.submit_s for o in self.outcomes), default=0.0)
        return self.end_s - first


def simulate(
    jobs: Sequence[CompareJob],
    policy: Policy,
    shape: ClusterShape,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    restart_s: float = DEFAULT_RESTART_S,
    step_s: float = DEFAULT_STEP_S,
    horizon_s: float = math.inf,
    stop: Callable[[float], bool] | None = None,
) -> RunResult:
    """Run ``jobs`` under ``policy`` until every job has finished, ``horizon_s``, or ``stop``
    (asked at every round with the virtual time) answers True."""
    if interval_s <= 0 or step_s <= 0 or restart_s < 0:
        raise ValueError("interval_s and step_s must be > 0 and restart_s >= 0")
    pending = sorted(jobs, key=lambda j: (j.submit_s, j.id))
    if len({j.id for j in pending}) != len(pending):
        raise ValueError("job ids must be unique")
    active: dict[str, _Running] = {}
    outcomes: dict[str, JobOutcome] = {}
    now = math.floor(pending[0].submit_s / interval_s) * interval_s if pending else 0.0
    held = 0.0
    next_arrival = 0
    while (next_arrival < len(pending) or active) and now < horizon_s:
        if stop is not None and stop(now):
            break
        while next_arrival < len(pending) and pending[next_arrival].submit_s <= now:
            job = pending[next_arrival]
            active[job.id] = _Running(job=job, batch=job.requested_batch)
            next_arrival += 1
        if not active:
            now = math.ceil(pending[next_arrival].submit_s / interval_s) * interval_s
            continue
        views = [_view(state, now) for state in active.values()]
        decisions = policy.decide(now, views, shape.gpus, shape.gpus_per_node)
        _apply(active, decisions, shape, now, restart_s)
        end = min(now + interval_s, horizon_s)
        for state in active.values():
            held += state.gpus * (end - now)
        finished = _advance(active, now, end, step_s)
        for state, finish_s in finished:
            held -= state.gpus * (end - finish_s)
            outcomes[state.job.id] = _outcome(state, finish_s)
            del active[state.job.id]
        now = end
    for state in active.values():
        outcomes[state.job.id] = _outcome(state, None)
    for job in pending[next_arrival:]:
        outcomes[job.id] = JobOutcome(job.id, job.family.name, job.submit_s, None, None, 0)
    finishes = [o.finish_s for o in outcomes.values() if o.finish_s is not None]
    end_s = now if len(finishes) < len(outcomes) else max(finishes, default=now)
    ordered = tuple(outcomes[j.id] for j in pending)
    return RunResult(policy.name, ordered, held, end_s)


def _view(state: _Running, now: float) -> JobView:
    job = state.job
    since = state.last_held_s if state.last_held_s is not None else job.submit_s
    return JobView(
        job=job,
        progress=min(state.done / job.work, 1.0),
        gpus=state.gpus,
        batch=state.batch,
        nodes=len(state.placement),
        attained_gpu_s=state.attained_gpu_s,
        waited_s=0.0 if state.gpus else now - since,
        age_s=now - job.submit_s,
        last_run_s=state.last_run_s,
        running_s=now - (state.run_started_s or now) if state.gpus else 0.0,
        restarts=state.restarts,
        observed=state.observed,
    )


def _apply(
    active: dict[str, _Running],
    decisions: Mapping[str, Decision],
    shape: ClusterShape,
    now: float,
    restart_s: float,
) -> None:
    unknown = sorted(set(decisions) - set(active))
    if unknown:
        raise PolicyError(f"decisions for jobs not shown: {', '.join(unknown[:3])}")
    wanted: dict[str, Decision] = {}
    for job_id, state in active.items():
        decision = decisions.get(job_id, Decision(0, state.batch))
        if decision.gpus < 0:
            raise PolicyError(f"job {job_id}: negative GPUs")
        if decision.gpus:
            problem = state.job.family.batch_problem(decision.gpus, decision.batch)
            if problem is not None:
                raise PolicyError(f"job {job_id}: {problem}")
        wanted[job_id] = decision
    total = sum(d.gpus for d in wanted.values())
    if total > shape.gpus:
        raise PolicyError(f"{total} GPUs decided on a cluster of {shape.gpus}")
    current = {job_id: state.placement for job_id, state in active.items() if state.gpus}
    placements = place({k: d.gpus for k, d in wanted.items()}, current, shape)
    for job_id, state in active.items():
        decision, placement = wanted[job_id], placements.get(job_id, {})
        if decision.gpus and (decision.gpus != state.gpus or placement != state.placement):
            # A start, a resume or a move: a checkpoint-restart before it makes progress.
            state.paused_until = now + restart_s
            if state.first_start_s is None:
                state.first_start_s = now
            else:
                state.restarts += 1
            state.run_started_s = now
        if not decision.gpus and state.gpus:
            state.last_run_s = now - (state.run_started_s or now)
            state.last_held_s = now
        if decision.gpus:
            state.last_held_s = now
        state.gpus, state.batch, state.placement = decision.gpus, decision.batch, placement


def _advance(
    active: dict[str, _Running], start: float, end: float, step_s: float
) -> list[tuple[_Running, float]]:
    finished: list[tuple[_Running, float]] = []
    for state in active.values():
        if not state.gpus:
            continue
        state.attained_gpu_s += state.gpus * (end - start)
        family, nodes = state.job.family, len(state.placement)
        t = max(start, state.paused_until)
        if t < end:
            seconds_per_step = state.batch / family.speed.throughput(state.gpus, state.batch, nodes)
            seen = StepObservation(state.gpus, state.batch, nodes, seconds_per_step)
            state.observed = state.observed.added(seen, MAX_OBSERVATIONS)
        while t < end:
            dt = min(step_s, end - t)
            rate = family.goodput(state.gpus, nodes, state.batch, state.done / state.job.work)
            if state.done + rate * dt >= state.job.work:
                finish = t + (state.job.work - state.done) / rate
                state.done = state.job.work
                finished.append((state, finish))
                break
            state.done += rate * dt
            t += dt
    return finished


def _outcome(state: _Running, finish_s: float | None) -> JobOutcome:
    job = state.job
    return JobOutcome(
        job.id, job.family.name, job.submit_s, state.first_start_s, finish_s, state.restarts
    )
