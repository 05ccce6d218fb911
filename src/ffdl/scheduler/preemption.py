"""Choosing which running jobs a queued job may preempt, and checking that it then fits.

Owns the victim rules:

- Only ``preemptible`` running jobs, never one already chosen by another preemptor in the
  same pass, and never one of equal or higher priority than the preemptor, except jobs
  running on capacity *borrowed* beyond their tenant's quota, which any job within its
  quota may reclaim (that is what borrowing means).
- Borrowers go first: if reclaiming borrowed capacity alone makes room, only borrowers are
  chosen. Otherwise borrowers and lower-priority jobs are considered together.
- The fewest victims; among sets of that size, the preference order decides: borrowers,
  then lowest priority, then most recently started.
- No set that makes the job fit, no victims at all.

Fit is exact and cheap: a gang fits iff the learner slots on the nodes it may use (per label
value, with locality) add up to its learner count, so a candidate set is checked by
recounting slots on the few nodes its victims free. The minimum-count search tries sets of
growing size in preference order up to a budget of checks; past the budget it keeps the
greedy set with every victim that is not needed removed.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from ffdl.core.resources import Resources
from ffdl.scheduler.free import CapacityView, node_slots, slots_for
from ffdl.scheduler.snapshot import QueuedJob, RunningJob

DEFAULT_SEARCH_BUDGET = 400


@dataclass(frozen=True, slots=True)
class Candidate:
    job: RunningJob
    borrowing: str | None = None  # the quota it exceeds, when it runs on borrowed capacity

    def preference(self) -> tuple[int, int, float, str]:
        return (0 if self.borrowing else 1, self.job.priority, -self.job.started_at, self.job.id)


def eligible_victims(
    job: QueuedJob,
    running: Iterable[RunningJob],
    already_chosen: set[str],
    borrowers: dict[str, str],
) -> list[Candidate]:
    """Running jobs ``job`` may preempt, most preferred first."""
    candidates = [
        Candidate(victim, borrowers.get(victim.id))
        for victim in running
        if victim.preemptible
        and victim.id not in already_chosen
        and (victim.id in borrowers or victim.priority < job.priority)
    ]
    candidates.sort(key=Candidate.preference)
    return candidates


class _SlotCounter:
    """Learner slots for one job on the nodes it may use, grouped by locality value."""

    def __init__(self, view: CapacityView, job: QueuedJob) -> None:
        self.view = view
        self.job = job
        self.per = job.per_learner
        self.learners = job.learners
        self.base: dict[str, int] = {}
        self.group_base: dict[str, int] = {}
        label = job.same_label
        pools = (
            list(view.label_groups(label).values())
            if label is not None
            else [p for p in [view.pool_for(job.gpu_type)] if p is not None]
        )
        for pool in pools:
            # Nodes with fewer free GPUs than a learner needs hold no slot now.
            names = (
                (name for _level, name in pool.descending(self.per.gpus))
                if self.per.gpus
                else iter(pool.names)
            )
            for name in names:
                group = self.group_of(name)
                slots = node_slots(view.free[name], self.per) if group is not None else 0
                if group is not None and slots:
                    self.base[name] = slots
                    self.group_base[group] = self.group_base.get(group, 0) + slots

    def group_of(self, name: str) -> str | None:
        """The locality group of a node the job may use ("" without locality), else None."""
        item = self.view.free.get(name)
        if item is None or not item.node.schedulable:
            return None
        if self.job.gpu_type is not None and item.node.gpu_type != self.job.gpu_type:
            return None
        if self.job.same_label is None:
            return ""
        return item.node.labels.get(self.job.same_label)

    def usable_usage(self, victim: RunningJob) -> dict[str, Resources]:
        usage: dict[str, Resources] = {}
        for learner in victim.placement.learners:
            if self.group_of(learner.node) is not None:
                usage[learner.node] = usage.get(learner.node, Resources()) + victim.per_learner
        return usage

    def fits(self, freed: dict[str, Resources]) -> bool:
        delta: dict[str, int] = {}
        for name, extra in freed.items():
            item = self.view.free[name]
            slots = slots_for(
                item.gpus + extra.gpus,
                item.cpus + extra.cpus,
                item.memory_mb + extra.memory_mb,
                self.per,
            )
            group = self.group_of(name)
            assert group is not None
            delta[group] = delta.get(group, 0) + slots - self.base.get(name, 0)
        return any(self.group_base.get(g, 0) + d >= self.learners for g, d in delta.items())


def _freed_by(
    chosen: Sequence[Candidate], usage: dict[str, dict[str, Resources]]
) -> dict[str, Resources]:
    freed: dict[str, Resources] = {}
    for candidate in chosen:
        for name, amount in usage[candidate.job.id].items():
            freed[name] = freed.get(name, Resources()) + amount
    return freed


def choose_victims(
    job: QueuedJob,
    view: CapacityView,
    candidates: Sequence[Candidate],
    *,
    search_budget: int = DEFAULT_SEARCH_BUDGET,
) -> tuple[Candidate, ...] | None:
    """The victims to preempt so that ``job`` fits on ``view``, or None if no set does."""
    counter = _SlotCounter(view, job)
    usage = {c.job.id: counter.usable_usage(c.job) for c in candidates}
    helpful = [c for c in candidates if usage[c.job.id]]
    tiers = [[c for c in helpful if c.borrowing], helpful]
    for tier in tiers:
        chosen = _greedy(tier, counter, usage)
        if chosen is None:
            continue
        return _fewest(tier, chosen, counter, usage, search_budget)
    return None


def _greedy(
    tier: Sequence[Candidate], counter: _SlotCounter, usage: dict[str, dict[str, Resources]]
) -> list[Candidate] | None:
    chosen: list[Candidate] = []
    freed: dict[str, Resources] = {}
    for candidate in tier:
        chosen.append(candidate)
        for name, amount in usage[candidate.job.id].items():
            freed[name] = freed.get(name, Resources()) + amount
        if counter.fits(freed):
            return chosen
    return None


def _fewest(
    tier: Sequence[Candidate],
    greedy: list[Candidate],
    counter: _SlotCounter,
    usage: dict[str, dict[str, Resources]],
    budget: int,
) -> tuple[Candidate, ...]:
    for size in range(1, len(greedy)):
        for combo in combinations(tier, size):
            budget -= 1
            if budget < 0:
                return _without_spare(greedy, counter, usage)
            if counter.fits(_freed_by(combo, usage)):
                return combo
    return tuple(greedy)


def _without_spare(
    chosen: list[Candidate], counter: _SlotCounter, usage: dict[str, dict[str, Resources]]
) -> tuple[Candidate, ...]:
    kept = list(chosen)
    for candidate in reversed(chosen):
        trial = [c for c in kept if c is not candidate]
        if counter.fits(_freed_by(trial, usage)):
            kept = trial
    return tuple(kept)


# Per node: the resources victims hold there and their GPU ids.
VictimUsage = dict[str, tuple[Resources, list[int]]]


def victim_usage(chosen: Sequence[Candidate], known_nodes: Container[str]) -> VictimUsage:
    freed: VictimUsage = {}
    for victim in chosen:
        for learner in victim.job.placement.learners:
            if learner.node not in known_nodes:
                continue
            amount, ids = freed.get(learner.node, (Resources(), []))
            freed[learner.node] = (amount + victim.job.per_learner, [*ids, *learner.gpu_ids])
    return freed


def _excess(amount: Resources, covered: Resources) -> Resources:
    return Resources(
        max(0, amount.gpus - covered.gpus),
        max(0.0, amount.cpus - covered.cpus),
        max(0, amount.memory_mb - covered.memory_mb),
    )


def split_claim(
    needs: Iterable[tuple[str, Resources]], freed: VictimUsage
) -> tuple[dict[str, Resources], Resources]:
    """Split a preemptor's trial placement: per node, what it must take from free capacity
    beyond the victims' share; and in total, the victims' resources it leaves unused."""
    from_free: dict[str, Resources] = {}
    used: dict[str, Resources] = {}
    for name, need in needs:
        used[name] = need
        extra = _excess(need, freed.get(name, (Resources(), []))[0])
        if extra != Resources():
            from_free[name] = extra
    left = Resources()
    for name, (amount, _ids) in freed.items():
        left = left + _excess(amount, used.get(name, Resources()))
    return from_free, left
