"""The comparison's engine for clusters of several GPU types: rounds of decisions, each job
at the speed Gavel measured for its model on the GPUs it holds.

Every ``interval_s`` (6 minutes, Gavel's round; its jobs run for hours to days) the policy
is shown every arrived, unfinished job (``MixedView``)
and answers a ``MixedDecision`` for each: its GPUs by type. The engine then

1. **checks** the answer: known types, no type given more GPUs than it has, no job more GPUs
   than its model was measured on on each type it is given (``PolicyError`` otherwise);
2. **charges restarts**: a job that starts, resumes, or whose GPUs change (count or type)
   makes no progress for ``restart_s`` (30 s) after the round. A job given the same GPUs
   again keeps running;
3. **advances** every running job at its rate (``GavelTable.rate``) to the next round. A
   gang given GPUs of two types runs every worker at the slower type's pace, as
   synchronous data-parallel training does. A job that completes its work mid-round ends at
   that instant; its GPUs are free from the next round on.

There are no machines within a type: Gavel's simulation, whose figures these are, measured
and scheduled consolidated gangs, and so does this engine.

Each job's **finish-time fairness** (Themis's and Gavel's ``rho``) is its JCT over the time
its work would have taken on an equal share of the cluster: ``1/N`` of every type's GPUs,
``N`` being the mean number of jobs in the cluster while it was there, at most its own GPUs
at a time (time-shared across types in proportion, as Gavel's isolated allocation is). A
``rho`` of 1 is exactly its share; above 1, worse.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ffdl.sim.compare.engine import PolicyError
from ffdl.sim.compare.gavel import GavelJob, GavelTable

DEFAULT_INTERVAL_S = 360.0
DEFAULT_RESTART_S = 30.0


@dataclass(frozen=True)
class MixedCluster:
    """GPUs by type, and the type a job's work is counted on (its ``reference``)."""

    name: str
    gpus: Mapping[str, int]
    reference: str

    def __post_init__(self) -> None:
        if not self.gpus or any(count < 1 for count in self.gpus.values()):
            raise ValueError(f"cluster {self.name}: every type needs at least one GPU")
        if self.reference not in self.gpus:
            raise ValueError(f"cluster {self.name}: reference type {self.reference!r} not in it")

    @property
    def total(self) -> int:
        return sum(self.gpus.values())


def isolated_shares(cluster: MixedCluster, gpus: int, sharing: float) -> dict[str, float]:
    """Gavel's isolated allocation: the share of its time a job of ``gpus`` GPUs spends on
    each type when it has ``1/sharing`` of every type, ``GPUs_t / sharing / gpus``, scaled
    down so that the shares sum to at most 1."""
    shares = {t: count / max(sharing, 1.0) / gpus for t, count in cluster.gpus.items()}
    scale = max(sum(shares.values()), 1.0)
    return {t: x / scale for t, x in shares.items()}


def isolated_rate(table: GavelTable, cluster: MixedCluster, job: GavelJob, sharing: float) -> float:
    """Steps/s of ``job`` on ``1/sharing`` of every type (``isolated_shares``)."""
    shares = isolated_shares(cluster, job.gpus, sharing)
    return sum(x * table.rate(job.model, t, job.gpus) for t, x in shares.items())


@dataclass(frozen=True, slots=True)
class MixedDecision:
    """GPUs by type for one job (none: it waits)."""

    gpus: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def on(cls, gpu_type: str, count: int) -> MixedDecision:
        return cls({gpu_type: count} if count else {})

    @property
    def count(self) -> int:
        return sum(self.gpus.values())


WAIT = MixedDecision()


@dataclass(frozen=True, slots=True)
class MixedView:
    """A job as a policy sees it at one round."""

    job: GavelJob
    steps_done: float
    gpus: Mapping[str, int]  # held now, by type; empty while it waits
    time_on: Mapping[str, float]  # seconds it has run on each type
    attained_gpu_s: float
    waited_s: float  # since it last held GPUs, or since it arrived
    age_s: float
    running_s: float  # since it last started or changed GPUs (0 while waiting)
    restarts: int

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def steps_left(self) -> float:
        return max(self.job.steps - self.steps_done, 0.0)

    @property
    def count(self) -> int:
        return sum(self.gpus.values())

    @property
    def gpu_type(self) -> str | None:
        """The one type it runs on (None: waiting, or spread over several)."""
        return next(iter(self.gpus)) if len(self.gpus) == 1 else None


class MixedPolicy(Protocol):
    name: str

    def decide(
        self, now: float, jobs: Sequence[MixedView], cluster: MixedCluster, table: GavelTable
    ) -> Mapping[str, MixedDecision]: ...


@dataclass(slots=True)
class _Running:
    job: GavelJob
    done: float = 0.0
    gpus: dict[str, int] = field(default_factory=dict)
    time_on: dict[str, float] = field(default_factory=dict)
    gpu_s: float = 0.0
    paused_until: float = 0.0
    last_held_s: float | None = None
    run_started_s: float | None = None
    first_start_s: float | None = None
    restarts: int = 0
    crowd_s: float = 0.0  # integral of the number of jobs in the cluster while it was there


@dataclass(frozen=True, slots=True)
class MixedOutcome:
    id: str
    tenant: str
    model: str
    submit_s: float
    first_start_s: float | None
    finish_s: float | None
    restarts: int
    gpu_s: float
    rho: float | None

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.submit_s


@dataclass(frozen=True, slots=True)
class MixedResult:
    policy: str
    cluster: str
    outcomes: tuple[MixedOutcome, ...]
    end_s: float

    def jcts(self) -> list[float]:
        return [o.jct_s for o in self.outcomes if o.jct_s is not None]

    def rhos(self) -> list[float]:
        return [o.rho for o in self.outcomes if o.rho is not None]

    @property
    def completed(self) -> int:
        return sum(1 for o in self.outcomes if o.finish_s is not None)

    @property
    def makespan_s(self) -> float:
        first = min((o.submit_s for o in self.outcomes), default=0.0)
        return self.end_s - first

    def gpu_hours_by_tenant(self) -> dict[str, float]:
        hours: dict[str, float] = {}
        for o in self.outcomes:
            hours[o.tenant] = hours.get(o.tenant, 0.0) + o.gpu_s / 3600
        return dict(sorted(hours.items()))


def simulate_mixed(
    jobs: Sequence[GavelJob],
    policy: MixedPolicy,
    cluster: MixedCluster,
    table: GavelTable,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    restart_s: float = DEFAULT_RESTART_S,
    horizon_s: float = math.inf,
) -> MixedResult:
    """Run ``jobs`` under ``policy`` until every job has finished or ``horizon_s``."""
    if interval_s <= 0 or restart_s < 0:
        raise ValueError("interval_s must be > 0 and restart_s >= 0")
    pending = sorted(jobs, key=lambda j: (j.submit_s, j.id))
    if len({j.id for j in pending}) != len(pending):
        raise ValueError("job ids must be unique")
    unknown = sorted({j.model for j in pending} - set(table.models))
    if unknown:
        raise ValueError(f"models not in the table: {', '.join(unknown)}")
    active: dict[str, _Running] = {}
    outcomes: dict[str, MixedOutcome] = {}
    now = math.floor(pending[0].submit_s / interval_s) * interval_s if pending else 0.0
    arrived = 0
    while (arrived < len(pending) or active) and now < horizon_s:
        while arrived < len(pending) and pending[arrived].submit_s <= now:
            active[pending[arrived].id] = _Running(job=pending[arrived])
            arrived += 1
        if not active:
            now = math.ceil(pending[arrived].submit_s / interval_s) * interval_s
            continue
        views = [_view(state, now) for state in active.values()]
        decisions = policy.decide(now, views, cluster, table)
        _apply(active, decisions, cluster, table, now, restart_s)
        end = min(now + interval_s, horizon_s)
        crowd = len(active)
        for state in list(active.values()):
            finish_s = _advance(state, table, now, end)
            state.crowd_s += crowd * ((end if finish_s is None else finish_s) - now)
            if finish_s is not None:
                outcomes[state.job.id] = _outcome(state, finish_s, table, cluster)
                del active[state.job.id]
        now = end
    for state in active.values():
        outcomes[state.job.id] = _outcome(state, None, table, cluster)
    for job in pending[arrived:]:
        outcomes[job.id] = MixedOutcome(
            job.id, job.tenant, job.model, job.submit_s, None, None, 0, 0.0, None
        )
    finishes = [o.finish_s for o in outcomes.values() if o.finish_s is not None]
    end_s = now if len(finishes) < len(outcomes) else max(finishes, default=now)
    return MixedResult(policy.name, cluster.name, tuple(outcomes[j.id] for j in pending), end_s)


def _view(state: _Running, now: float) -> MixedView:
    since = state.last_held_s if state.last_held_s is not None else state.job.submit_s
    return MixedView(
        job=state.job,
        steps_done=state.done,
        gpus=dict(state.gpus),
        time_on=dict(state.time_on),
        attained_gpu_s=state.gpu_s,
        waited_s=0.0 if state.gpus else now - since,
        age_s=now - state.job.submit_s,
        running_s=now - (state.run_started_s or now) if state.gpus else 0.0,
        restarts=state.restarts,
    )


def _apply(
    active: dict[str, _Running],
    decisions: Mapping[str, MixedDecision],
    cluster: MixedCluster,
    table: GavelTable,
    now: float,
    restart_s: float,
) -> None:
    unknown = sorted(set(decisions) - set(active))
    if unknown:
        raise PolicyError(f"decisions for jobs not shown: {', '.join(unknown[:3])}")
    used = dict.fromkeys(cluster.gpus, 0)
    for job_id, decision in decisions.items():
        model = active[job_id].job.model
        for gpu_type, count in decision.gpus.items():
            if gpu_type not in used:
                raise PolicyError(f"job {job_id}: no GPU type {gpu_type!r} in {cluster.name}")
            if count < 0:
                raise PolicyError(f"job {job_id}: negative GPUs")
            used[gpu_type] += count
            most = table.max_gpus(model, gpu_type)
            if count and decision.count > most:
                raise PolicyError(
                    f"job {job_id}: {decision.count} GPUs, {model} runs on at most {most} "
                    f"{gpu_type} GPUs"
                )
    for gpu_type, count in used.items():
        if count > cluster.gpus[gpu_type]:
            raise PolicyError(
                f"{count} {gpu_type} GPUs decided, {cluster.name} has {cluster.gpus[gpu_type]}"
            )
    for job_id, state in active.items():
        wanted = {t: n for t, n in decisions.get(job_id, WAIT).gpus.items() if n}
        if wanted and wanted != state.gpus:
            state.paused_until = now + restart_s
            if state.first_start_s is None:
                state.first_start_s = now
            else:
                state.restarts += 1
            state.run_started_s = now
        if wanted or state.gpus:
            state.last_held_s = now
        state.gpus = wanted


def gang_rate(table: GavelTable, model: str, gpus: Mapping[str, int]) -> float:
    """Steps/s of a gang holding ``gpus``: every worker at the slowest type's pace."""
    count = sum(gpus.values())
    if not count:
        return 0.0
    return min(table.rate(model, t, count) for t, n in gpus.items() if n)


def _advance(state: _Running, table: GavelTable, start: float, end: float) -> float | None:
    if not state.gpus:
        return None
    rate = gang_rate(table, state.job.model, state.gpus)
    t = max(start, state.paused_until)
    finish_s = None
    if t < end and rate > 0:
        left = state.job.steps - state.done
        if state.done + rate * (end - t) >= state.job.steps:
            finish_s = t + left / rate
            state.done = state.job.steps
        else:
            state.done += rate * (end - t)
    until = end if finish_s is None else finish_s
    for gpu_type, count in state.gpus.items():
        state.time_on[gpu_type] = state.time_on.get(gpu_type, 0.0) + (until - start)
        state.gpu_s += count * (until - start)
    return finish_s


def _outcome(
    state: _Running, finish_s: float | None, table: GavelTable, cluster: MixedCluster
) -> MixedOutcome:
    job = state.job
    rho = None
    if finish_s is not None:
        jct = finish_s - job.submit_s
        sharing = state.crowd_s / jct if jct > 0 else 1.0
        rho = jct * isolated_rate(table, cluster, job, sharing) / job.steps
    return MixedOutcome(
        job.id,
        job.tenant,
        job.model,
        job.submit_s,
        state.first_start_s,
        finish_s,
        state.restarts,
        state.gpu_s,
        rho,
    )
