"""The elastic pool's rule: from the load the workers see to the pool's next size.

A pure function, ``decide(policy, state, signals, now)``: no clock, no I/O, so the rule is
tested with plain numbers. The controller (``master.py``) calls it once a second.

The rule (every threshold is a setting, ``pool_*``; a grow threshold of 0 turns its signal
off):

- **Grow** by ``step`` (up to MAX) when *any* signal is above its grow threshold without a
  break for ``grow_after_s``: average in-flight requests per worker, the p95 latency of
  requests (time to the response's first byte), requests per second per worker, and the
  application's own pressure, the learner controllers' reports: their average in-flight
  count per worker and their p95 latency (what piles up when controllers report faster
  than the platform takes their reports in).
- **Shrink** by ``step`` (down to MIN) when *every* signal is below its shrink threshold
  for ``shrink_after_s``, the per-worker ones counted as if the pool had already shrunk
  (the load must fit in fewer workers, not merely be light in many).
- Shrink thresholds lie below grow thresholds (hysteresis: a load between the two changes
  nothing), and after each change the pool waits ``cooldown_s`` and until every worker
  it asked for serves before the next one.
- A latency counts only over at least ``min_latency_samples`` requests in the window; an
  idle window (no requests) is below every threshold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

MAX_WORKERS = 256
_BOUNDS = re.compile(r"^\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?$")


def parse_workers(text: str) -> tuple[int, int]:
    """``"MIN..MAX"`` or ``"N"`` (a fixed pool) as ``(MIN, MAX)``; ValueError naming the
    problem otherwise."""
    match = _BOUNDS.match(text)
    if match is None:
        raise ValueError(f"workers: expected MIN..MAX or N (e.g. 2..8, or 4), got {text!r}")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else low
    if low < 1:
        raise ValueError(f"workers: MIN must be at least 1, got {text!r}")
    if low > high:
        raise ValueError(f"workers: MIN {low} is greater than MAX {high} in {text!r}")
    if high > MAX_WORKERS:
        raise ValueError(f"workers: MAX {high} is more than {MAX_WORKERS} in {text!r}")
    return low, high


@dataclass(frozen=True)
class Thresholds:
    """A signal's two thresholds; ``grow`` 0 turns the signal off."""

    name: str  # as in the settings: ``pool_grow_<name>``, ``pool_shrink_<name>``
    label: str  # as in a change's reason
    unit: str
    grow: float
    shrink: float
    per_worker: bool

    @property
    def enabled(self) -> bool:
        return self.grow > 0

    def check(self) -> None:
        if self.grow < 0 or self.shrink < 0:
            raise ValueError(f"pool_grow_{self.name} and pool_shrink_{self.name} must be >= 0")
        if self.enabled and self.shrink >= self.grow:
            raise ValueError(
                f"pool_shrink_{self.name} ({self.shrink:g}) must be below "
                f"pool_grow_{self.name} ({self.grow:g}): the gap between them is the "
                "hysteresis that keeps the pool from flapping"
            )


@dataclass(frozen=True)
class Policy:
    minimum: int
    maximum: int
    in_flight: Thresholds
    p95_ms: Thresholds
    rps: Thresholds
    report_in_flight: Thresholds
    report_p95_ms: Thresholds
    step: int = 1
    grow_after_s: float = 3.0
    shrink_after_s: float = 30.0
    cooldown_s: float = 10.0
    min_latency_samples: int = 20

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(f"workers: need 1 <= MIN <= MAX, got {self.minimum}..{self.maximum}")
        if self.step < 1:
            raise ValueError(f"pool_step must be at least 1, got {self.step}")
        for name in ("grow_after_s", "shrink_after_s", "cooldown_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"pool_{name} must be >= 0, got {getattr(self, name)}")
        for thresholds in self.thresholds:
            thresholds.check()

    @property
    def thresholds(self) -> tuple[Thresholds, ...]:
        return (self.in_flight, self.p95_ms, self.rps, self.report_in_flight, self.report_p95_ms)

    @property
    def elastic(self) -> bool:
        return self.minimum < self.maximum


@dataclass(frozen=True)
class Signals:
    """The pool's load over the last window, as the controller measured it."""

    serving: int  # workers that serve and are not retiring
    booting: int = 0  # workers started and not serving yet
    rps: float = 0.0  # requests answered per second, all workers
    p95_ms: float | None = None  # None: fewer requests than a percentile needs
    in_flight: float = 0.0  # average requests in flight, all workers together
    report_rps: float = 0.0
    report_p95_ms: float | None = None
    report_in_flight: float = 0.0
    requests: int = 0  # in the window
    reports: int = 0

    def value(self, name: str) -> float | None:
        """The signal called ``name`` (a ``Thresholds.name``), totals for per-worker ones."""
        return {
            "in_flight": self.in_flight,
            "p95_ms": self.p95_ms,
            "rps": self.rps,
            "report_in_flight": self.report_in_flight,
            "report_p95_ms": self.report_p95_ms,
        }[name]


@dataclass(frozen=True)
class PoolState:
    size: int  # the number of workers the pool is set to
    grow_since: float | None = None  # since when a grow condition holds
    shrink_since: float | None = None
    last_change_at: float | None = None


@dataclass(frozen=True)
class Change:
    at: float
    old: int
    new: int
    reason: str

    @property
    def direction(self) -> str:
        return "grow" if self.new > self.old else "shrink"


def decide(
    policy: Policy, state: PoolState, signals: Signals, now: float
) -> tuple[PoolState, Change | None]:
    """The pool's next state, and the change to make now (None: keep the size)."""
    size = state.size
    if size < policy.minimum or size > policy.maximum:
        new = min(max(size, policy.minimum), policy.maximum)
        reason = f"{_verb(size, new)} {size}→{new}: outside {policy.minimum}..{policy.maximum}"
        return _changed(new, now), Change(now, size, new, reason)
    pressures = _pressures(policy, signals, size)
    grow = bool(pressures) and size < policy.maximum
    smaller = max(size - policy.step, policy.minimum)
    shrink = not pressures and size > policy.minimum and _fits(policy, signals, smaller)
    state = replace(
        state,
        grow_since=(state.grow_since if state.grow_since is not None else now) if grow else None,
        shrink_since=(
            (state.shrink_since if state.shrink_since is not None else now) if shrink else None
        ),
    )
    cooling = state.last_change_at is not None and now - state.last_change_at < policy.cooldown_s
    # A change still taking effect (a worker booting, or one not yet replaced) is not
    # judged: its load figures describe the old pool.
    if cooling or signals.serving != size or signals.booting:
        return state, None
    if state.grow_since is not None and now - state.grow_since >= policy.grow_after_s:
        new = min(size + policy.step, policy.maximum)
        held = now - state.grow_since
        reason = f"grow {size}→{new}: {', '.join(pressures)} for {held:.0f} s"
        return _changed(new, now), Change(now, size, new, reason)
    if state.shrink_since is not None and now - state.shrink_since >= policy.shrink_after_s:
        held = now - state.shrink_since
        below = ", ".join(_below(policy, signals, smaller))
        reason = f"shrink {size}→{smaller}: load fits {smaller} for {held:.0f} s ({below})"
        return _changed(smaller, now), Change(now, size, smaller, reason)
    return state, None


def _changed(size: int, now: float) -> PoolState:
    return PoolState(size=size, last_change_at=now)


def _verb(old: int, new: int) -> str:
    return "grow" if new > old else "shrink"


def _per(thresholds: Thresholds, total: float, workers: int) -> float:
    return total / max(workers, 1) if thresholds.per_worker else total


def _measured(policy: Policy, thresholds: Thresholds, signals: Signals) -> float | None:
    """The signal's value, or None when there is too little to judge (a latency over a
    handful of requests)."""
    value = signals.value(thresholds.name)
    if thresholds.name == "p95_ms" and signals.requests < policy.min_latency_samples:
        return None
    if thresholds.name == "report_p95_ms" and signals.reports < policy.min_latency_samples:
        return None
    return value


def _pressures(policy: Policy, signals: Signals, size: int) -> list[str]:
    """Every signal above its grow threshold, as it reads in a reason."""
    found = []
    for thresholds in policy.thresholds:
        value = _measured(policy, thresholds, signals)
        if not thresholds.enabled or value is None:
            continue
        value = _per(thresholds, value, size)
        if value > thresholds.grow:
            found.append(f"{_show(thresholds, value)} > {thresholds.grow:g}")
    return found


def _fits(policy: Policy, signals: Signals, workers: int) -> bool:
    for thresholds in policy.thresholds:
        value = _measured(policy, thresholds, signals)
        if (
            thresholds.enabled
            and value is not None
            and _per(thresholds, value, workers) >= thresholds.shrink
        ):
            return False
    return True


def _below(policy: Policy, signals: Signals, workers: int) -> list[str]:
    shown = []
    for thresholds in policy.thresholds:
        value = _measured(policy, thresholds, signals)
        if thresholds.enabled and value is not None:
            value = _per(thresholds, value, workers)
            shown.append(f"{_show(thresholds, value)} < {thresholds.shrink:g}")
    return shown or ["idle"]


def _show(thresholds: Thresholds, value: float) -> str:
    per = "/worker" if thresholds.per_worker else ""
    number = f"{value:.0f}" if value >= 100 else f"{value:.1f}"
    return f"{thresholds.label} {number}{thresholds.unit}{per}"
