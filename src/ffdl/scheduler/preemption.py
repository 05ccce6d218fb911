"""Choosing which running jobs a queued job may preempt, and checking that it then fits.

Owns the victim rules:

- Only ``preemptible`` running jobs, never one already chosen by another preemptor in the
  same pass, and never one of equal or higher priority than the preemptor, except jobs of
  a tenant running beyond its quota on *borrowed* capacity, which any job within its quota
  may reclaim (that is what borrowing means): any of that tenant's jobs, as long as all the
  pass takes from it leaves it no lower than its quota (``quota.Overdraft``).
- Borrowers go first: if reclaiming borrowed capacity alone makes room, only borrowers are
  chosen. Otherwise borrowers and lower-priority jobs are considered together.
- The fewest victims; among sets of that size, the preference order decides: borrowers,
  then lowest priority, then most recently started.
- No set that makes the job fit, no victims at all.

Fit is exact and cheap: a gang fits iff the learner slots on the nodes it may use (per label
value with locality, and per GPU type for a gang of one type) add up to its learner count,
so a candidate set is checked by recounting slots on the few nodes its victims free.

The search for the fewest victims: first single victims, in preference order (a single
victim that makes room is the best answer). Otherwise per node: on each node, victims are
taken largest first until the node gains slots; a node that alone makes the job fit costs
that many victims, otherwise nodes are combined best gain-per-victim first. The set is then
checked exactly, any victim that is not needed is dropped, and when there are few
candidates every smaller set is also tried in preference order, so the count is the true
minimum there (beyond that it is a close, not a proven, minimum).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from operator import attrgetter
from typing import NamedTuple

from ffdl.core.resources import Resources
from ffdl.scheduler.free import CapacityView, FreeState, node_slots, slots_for
from ffdl.scheduler.placement import find_nodes
from ffdl.scheduler.quota import Overdraft
from ffdl.scheduler.snapshot import QueuedJob, RunningJob

# Victims tried one by one, most preferred first, before searching node by node.
SINGLE_VICTIM_SCAN = 32
# Up to this many candidates, all smaller victim sets are tried (within the budget).
EXACT_SEARCH_CANDIDATES = 12
EXACT_SEARCH_BUDGET = 5000

# A victim's usage per usable node: (node, GPUs, CPUs, memory MiB).
_Usage = tuple[tuple[str, int, float, int], ...]


class _Evaluator:
    """Learner slots for one job on the nodes it may use, as victims are added or removed."""

    def __init__(self, view: CapacityView, job: QueuedJob) -> None:
        self.view = view
        self.job = job
        self.per = job.per_learner
        self.learners = job.learners
        self.slots: dict[str, int] = {}
        self.group_total: dict[str, int] = {}
        self.freed: dict[str, list[float]] = {}
        self._groups: dict[str, str | None] = {}
        label = job.same_label
        pools = (
            list(view.label_groups(label).values())
            if label is not None
            else [p for p in [view.pool_for(job.gpu_types)] if p is not None]
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
                if group is None:
                    continue
                slots = node_slots(view.free[name], self.per)
                if slots:
                    self.slots[name] = slots
                    self.group_total[group] = self.group_total.get(group, 0) + slots

    def group_of(self, name: str) -> str | None:
        """The locality group of a node the job may use ("" without locality), else None."""
        if name in self._groups:
            return self._groups[name]
        item = self.view.free.get(name)
        group: str | None = None
        if item is not None and item.node.schedulable and self.job.accepts(item.node.gpu_type):
            label = self.job.same_label
            group = "" if label is None else item.node.labels.get(label)
            if group is not None and not self.job.spans_types:
                group = f"{item.node.gpu_type}\x00{group}"  # a gang of one GPU type
        self._groups[name] = group
        return group

    def _apply(self, usage: _Usage, sign: int) -> None:
        for name, gpus, cpus, memory in usage:
            group = self.group_of(name)
            if group is None:
                continue
            freed = self.freed.get(name)
            if freed is None:
                freed = self.freed[name] = [0, 0.0, 0]
            freed[0] += sign * gpus
            freed[1] += sign * cpus
            freed[2] += sign * memory
            item = self.view.free[name]
            slots = slots_for(
                item.gpus + int(freed[0]),
                item.cpus + freed[1],
                item.memory_mb + int(freed[2]),
                self.per,
            )
            self.group_total[group] = (
                self.group_total.get(group, 0) + slots - self.slots.get(name, 0)
            )
            self.slots[name] = slots

    def helps(self, usage: _Usage) -> bool:
        return any(self.group_of(name) is not None for name, _g, _c, _m in usage)

    def add(self, usage: _Usage) -> None:
        self._apply(usage, 1)

    def remove(self, usage: _Usage) -> None:
        self._apply(usage, -1)

    def fits(self) -> bool:
        return any(total >= self.learners for total in self.group_total.values())

    def fits_with(self, usages: Iterable[_Usage]) -> bool:
        """Whether the job fits once all of ``usages`` are freed (the state is unchanged)."""
        added = list(usages)
        for usage in added:
            self.add(usage)
        fits = self.fits()
        for usage in added:
            self.remove(usage)
        return fits


class Candidate(NamedTuple):
    """A running job that may be preempted (a tuple: a pass makes one per running job)."""

    job: RunningJob
    borrowing: str | None = None  # the quota its tenant exceeds, when it borrows capacity


# Whether a set of victims takes back no more than their tenants borrowed.
_Allowed = Callable[[Sequence[Candidate]], bool]


class VictimIndex:
    """The pass's preemptible running jobs, in preference order and per node largest first.

    Built once per pass; ``choose`` is asked for each preempting job and ``mark_chosen``
    keeps a victim from being chosen twice.
    """

    def __init__(self, running: Iterable[RunningJob], overdrafts: Mapping[str, Overdraft]) -> None:
        # Preference: borrowers, then lowest priority, then most recently started, then id
        # (stable sorts on one key each, least significant first).
        self.overdrafts = overdrafts
        self.ordered = [
            Candidate(j, overdraft.reason if (overdraft := overdrafts.get(j.tenant)) else None)
            for j in running
            if j.preemptible
        ]
        self.ordered.sort(key=attrgetter("job.id"))
        self.ordered.sort(key=attrgetter("job.started_at"), reverse=True)
        self.ordered.sort(key=attrgetter("job.priority"))
        self.ordered.sort(key=lambda c: c.borrowing is None)
        self.rank = {c.job.id: index for index, c in enumerate(self.ordered)}
        self.borrowing_count = sum(1 for c in self.ordered if c.borrowing)
        # Priorities along ``ordered``; borrowers read as below any priority (they come first).
        self.ordered_priorities = [-1 if c.borrowing else c.job.priority for c in self.ordered]
        self.chosen: set[str] = set()
        self.reclaimed: dict[str, list[RunningJob]] = {}  # per borrowing tenant, this pass
        self.usage: dict[str, _Usage] = {}
        # Per node, largest first then most preferred: (-gpus, -cpus, -memory, rank, id,
        # candidate, gpus, cpus, memory); ranks are unique, so tuples sort without ties.
        self.on_node: dict[str, list[tuple[int, float, int, int, str, Candidate, int, float, int]]]
        self.on_node = {}
        for rank, candidate in enumerate(self.ordered):
            counts: dict[str, int] = {}
            for learner in candidate.job.placement.learners:
                counts[learner.node] = counts.get(learner.node, 0) + 1
            per = candidate.job.per_learner
            usage = tuple(
                (name, per.gpus * n, per.cpus * n, per.memory_mb * n) for name, n in counts.items()
            )
            self.usage[candidate.job.id] = usage
            for name, gpus, cpus, memory in usage:
                self.on_node.setdefault(name, []).append(
                    (-gpus, -cpus, -memory, rank, candidate.job.id, candidate, gpus, cpus, memory)
                )
        for entries in self.on_node.values():
            entries.sort()

    def _eligible_up_to(self, job: QueuedJob) -> int:
        """How far into ``ordered`` ``job`` may look: borrowers come first, then the others
        by priority, so its victims are a prefix (less those already chosen)."""
        return bisect_left(self.ordered_priorities, job.priority, lo=self.borrowing_count)

    def mark_chosen(self, victims: Iterable[Candidate]) -> None:
        for candidate in victims:
            self.chosen.add(candidate.job.id)
            if candidate.borrowing:
                self.reclaimed.setdefault(candidate.job.tenant, []).append(candidate.job)

    def _takes_only_borrowed(self, job: QueuedJob, victims: Sequence[Candidate]) -> bool:
        """Whether the victims that only borrowing makes eligible (priority not below
        ``job``'s) leave each tenant no lower than its quota. Victims taken anyway, by
        priority or by earlier preemptors, count as gone first."""
        earlier: dict[str, list[RunningJob]] = {}
        borrowed: dict[str, list[RunningJob]] = {}
        for candidate in victims:
            if candidate.borrowing:
                only_borrowing = candidate.job.priority >= job.priority
                side = borrowed if only_borrowing else earlier
                side.setdefault(candidate.job.tenant, []).append(candidate.job)
        return all(
            self.overdrafts[tenant].allows(
                [*self.reclaimed.get(tenant, ()), *earlier.get(tenant, ())], jobs
            )
            for tenant, jobs in borrowed.items()
        )

    def choose(self, job: QueuedJob, view: CapacityView) -> tuple[Candidate, ...] | None:
        """The victims to preempt so that ``job`` fits on ``view``, or None if no set does."""
        eligible_end = self._eligible_up_to(job)
        if not any(c.job.id not in self.chosen for c in self.ordered[:eligible_end]):
            return None
        evaluator = _Evaluator(view, job)
        usage = self.usage

        def allowed(victims: Sequence[Candidate]) -> bool:
            return self._takes_only_borrowed(job, victims)

        # Borrowers first: only if reclaiming them cannot make room, everyone eligible.
        for end in sorted({self.borrowing_count, eligible_end} - {0}):
            tier = self.ordered[:end]
            single = _single(evaluator, tier, usage, self.chosen, allowed)
            if single is not None:
                return (single,)  # one victim is the fewest, and the first is preferred
            found = self._by_nodes(job, evaluator, end)
            if found is None:
                remaining = [c for c in tier if c.job.id not in self.chosen]
                if not remaining or not evaluator.fits_with(usage[c.job.id] for c in remaining):
                    continue
                found = _in_order(evaluator, remaining, usage)
            # Checked once spare victims are dropped: a smaller set takes less from a tenant.
            found = _without_spare(evaluator, found, usage)
            chosen = found if allowed(found) else None
            helpful: list[Candidate] = []
            for candidate in tier:
                if candidate.job.id not in self.chosen and evaluator.helps(usage[candidate.job.id]):
                    helpful.append(candidate)
                    if len(helpful) > EXACT_SEARCH_CANDIDATES:
                        break
            if len(helpful) <= EXACT_SEARCH_CANDIDATES:
                upto = len(found) if chosen is not None else len(helpful)
                chosen = _exhaustive(evaluator, helpful, usage, upto, allowed) or chosen
            if chosen is None:
                continue
            return tuple(sorted(chosen, key=lambda c: self.rank[c.job.id]))
        return None

    def _by_nodes(self, job: QueuedJob, evaluator: _Evaluator, end: int) -> list[Candidate] | None:
        """Victims chosen node by node among ``ordered[:end]``; None if that finds none."""
        chosen_already = self.chosen
        per = job.per_learner
        whole: dict[str, list[Candidate]] = {}  # per group: one node that suffices alone
        partial: dict[str, list[tuple[float, int, list[Candidate]]]] = {}
        group_of = evaluator.group_of
        for name, entries in self.on_node.items():
            group = group_of(name)
            if group is None:
                continue
            need = job.learners - evaluator.group_total.get(group, 0)
            item = evaluator.view.free[name]
            gpus, cpus, memory = item.gpus, item.cpus, item.memory_mb
            base = evaluator.slots.get(name, 0)
            picked: list[Candidate] = []
            best: tuple[float, int, list[Candidate]] | None = None
            for _g, _c, _m, rank, job_id, candidate, more_gpus, more_cpus, more_memory in entries:
                if rank >= end or job_id in chosen_already:
                    continue
                picked.append(candidate)
                gpus, cpus, memory = gpus + more_gpus, cpus + more_cpus, memory + more_memory
                gain = slots_for(gpus, cpus, memory, per) - base
                if gain >= need:
                    if group not in whole or len(picked) < len(whole[group]):
                        whole[group] = list(picked)
                    break
                if gain > 0 and (best is None or gain / len(picked) > best[0]):
                    best = (gain / len(picked), gain, list(picked))
            if best is not None:
                partial.setdefault(group, []).append(best)
        options: list[list[Candidate]] = list(whole.values())
        for group, plans in partial.items():
            need = job.learners - evaluator.group_total.get(group, 0)
            combined: dict[str, Candidate] = {}
            for _efficiency, gain, victims in sorted(plans, key=lambda p: (-p[0], -p[1])):
                combined.update((c.job.id, c) for c in victims)
                need -= gain
                if need <= 0:
                    options.append(list(combined.values()))
                    break
        options.sort(key=lambda o: (len(o), sorted(self.rank[c.job.id] for c in o)))
        for option in options:
            if evaluator.fits_with(self.usage[c.job.id] for c in option):
                return option
        return None


def _single(
    evaluator: _Evaluator,
    tier: Sequence[Candidate],
    usage: dict[str, _Usage],
    chosen: Container[str],
    allowed: _Allowed,
) -> Candidate | None:
    """The most preferred victim that makes room on its own, looking only at the first
    ``SINGLE_VICTIM_SCAN`` candidates (the search by node covers the rest)."""
    looked = 0
    for candidate in tier:
        if candidate.job.id in chosen or not allowed((candidate,)):
            continue
        looked += 1
        if looked > SINGLE_VICTIM_SCAN:
            return None
        if evaluator.fits_with((usage[candidate.job.id],)):
            return candidate
    return None


def _in_order(
    evaluator: _Evaluator, tier: Sequence[Candidate], usage: dict[str, _Usage]
) -> list[Candidate]:
    """Victims in preference order until the job fits (the tier is known to suffice)."""
    chosen: list[Candidate] = []
    for candidate in tier:
        chosen.append(candidate)
        evaluator.add(usage[candidate.job.id])
        if evaluator.fits():
            break
    for candidate in chosen:
        evaluator.remove(usage[candidate.job.id])
    return chosen


def _without_spare(
    evaluator: _Evaluator, chosen: list[Candidate], usage: dict[str, _Usage]
) -> list[Candidate]:
    """Drop, least preferred first, every victim the job fits without."""
    kept = list(chosen)
    for candidate in kept:
        evaluator.add(usage[candidate.job.id])
    for candidate in reversed(chosen):
        evaluator.remove(usage[candidate.job.id])
        if evaluator.fits():
            kept.remove(candidate)
        else:
            evaluator.add(usage[candidate.job.id])
    for candidate in kept:
        evaluator.remove(usage[candidate.job.id])
    return kept


def _exhaustive(
    evaluator: _Evaluator,
    tier: Sequence[Candidate],
    usage: dict[str, _Usage],
    upto: int,
    allowed: _Allowed,
) -> list[Candidate] | None:
    """The first allowed set in preference order, of the smallest size up to ``upto``, that
    fits."""
    budget = EXACT_SEARCH_BUDGET
    for size in range(1, upto + 1):
        for combo in combinations(tier, size):
            budget -= 1
            if budget < 0:
                return None
            if allowed(combo) and evaluator.fits_with(usage[c.job.id] for c in combo):
                return list(combo)
    return None


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
) -> tuple[dict[str, Resources], dict[str, Resources]]:
    """Split a preemptor's trial placement: per node, what it must take from free capacity
    beyond the victims' share, and what of the victims' resources it leaves unused."""
    from_free: dict[str, Resources] = {}
    used: dict[str, Resources] = {}
    for name, need in needs:
        used[name] = need
        extra = _excess(need, freed.get(name, (Resources(), []))[0])
        if extra != Resources():
            from_free[name] = extra
    left = {
        name: _excess(amount, used.get(name, Resources())) for name, (amount, _) in freed.items()
    }
    return from_free, left


@dataclass(frozen=True, slots=True)
class Hold:
    """A preemptor's claim on the capacity it will start on once its victims have halted."""

    job: QueuedJob
    victims: tuple[Candidate, ...]
    from_free: dict[str, Resources]  # what it takes from capacity that is free now
    victims_left: dict[str, Resources]  # what it does not need, free once the victims halt
    placement: tuple[tuple[str, Resources], ...]  # its trial placement, per node


def preempt_for(job: QueuedJob, policy: str, state: FreeState, index: VictimIndex) -> Hold | None:
    """Choose victims for ``job``, check by placing it that it then fits, and hold what
    that placement needs on ``state`` (victims' capacity stays taken until they halt)."""
    chosen = index.choose(job, state)
    if chosen is None:
        return None
    freed = victim_usage(chosen, state.free)
    for name, (amount, ids) in freed.items():
        state.release(name, amount, ids)
    choice = find_nodes(state, job, policy)
    for name, (amount, ids) in freed.items():
        state.claim(name, amount, ids)
    if choice is None:
        return None
    placement = tuple((name, job.per_learner.scaled(count)) for name, count in choice)
    from_free, victims_left = split_claim(placement, freed)
    for name, extra in from_free.items():
        state.claim(name, extra, state.free[name].gpu_ids[: extra.gpus])
    index.mark_chosen(chosen)
    return Hold(job, chosen, from_free, victims_left, placement)
