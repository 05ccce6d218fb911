"""How far a training job has come and when it should end, from what it reports.

A job declares a total with its metrics (``ffdl.sdk.report(step, total_steps=...)``, or
``total_samples``, or ``total_epochs``) and reports how far it is. ``advance`` folds each
report into a small JSON-able state, kept on the job row:

- the unit measured is the first declared of steps, samples, epochs; ``fraction`` is the
  reported count over its total;
- ``rate`` (units per second) is measured over windows of at least ``RATE_WINDOW_S`` and
  smoothed (``SMOOTHING``), so one slow step does not swing the estimate;
- a new attempt (a resume, a restart, an elastic rescale) starts a new window: the pause
  between attempts is not counted as slow training, and the old rate stands until the new
  attempt has run one window; a rescale then replaces it with the new size's rate;
- ``remaining_s`` is what is left at that rate, and ``estimated_end_at`` (epoch seconds)
  when that runs out. Without a total, or before a rate, there is no estimate.

``samples_rate`` (samples per second) is measured the same way whenever the job reports
samples, total or not: it is the job's throughput.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Metric value names that carry progress, not a learning curve (charts leave them out).
PROGRESS_KEYS = frozenset({"samples", "total_steps", "total_samples", "epoch", "total_epochs"})

RATE_WINDOW_S = 5.0
SMOOTHING = 0.5  # weight of the newest window's rate

_UNITS = (("step", "total_steps"), ("samples", "total_samples"), ("epoch", "total_epochs"))


@dataclass(frozen=True, slots=True)
class Report:
    """One metrics record's progress fields (None: not reported)."""

    time: float
    step: int | None = None
    samples: int | None = None
    epoch: int | None = None
    total_steps: int | None = None
    total_samples: int | None = None
    total_epochs: int | None = None

    @classmethod
    def from_values(cls, time: float, iteration: int | None, values: dict[str, Any]) -> Report:
        def count(name: str) -> int | None:
            value = values.get(name)
            return int(value) if isinstance(value, int | float) and value >= 0 else None

        return cls(
            time=time,
            step=iteration,
            samples=count("samples"),
            epoch=count("epoch"),
            total_steps=count("total_steps"),
            total_samples=count("total_samples"),
            total_epochs=count("total_epochs"),
        )

    @property
    def has_progress(self) -> bool:
        counts = (self.step, self.samples, self.epoch)
        totals = (self.total_steps, self.total_samples, self.total_epochs)
        return any(value is not None for value in (*counts, *totals))


def advance(state: dict[str, Any] | None, report: Report, attempt: int) -> dict[str, Any]:
    """The progress state after ``report`` of attempt ``attempt``; ``state`` is not changed."""
    new: dict[str, Any] = dict(state or {})
    new_attempt = new.get("attempt") != attempt
    new["attempt"] = attempt
    for name in ("step", "samples", "epoch", "total_steps", "total_samples", "total_epochs"):
        value = getattr(report, name)
        if value is not None:
            new[name] = value
    unit = next(
        (count for count, total in _UNITS if new.get(count) is not None and new.get(total)),
        None,
    )
    if unit is not None and unit != new.get("unit"):
        new_attempt = True  # a unit chosen anew starts its windows anew
    new["unit"] = unit
    new["updated_at"] = report.time
    if unit is not None:
        _measure(new, "rate", new[unit], report.time, new_attempt)
    if report.samples is not None:
        _measure(new, "samples_rate", report.samples, report.time, new_attempt)
    _estimate(new, unit, report.time)
    return new


def _measure(state: dict[str, Any], key: str, value: float, now: float, restart: bool) -> None:
    anchor = state.get(f"{key}_anchor")
    if restart or anchor is None or value < anchor[1] or now < anchor[0]:
        state[f"{key}_anchor"] = [now, value]
        return
    elapsed = now - anchor[0]
    if elapsed < RATE_WINDOW_S:
        return
    measured = (value - anchor[1]) / elapsed
    previous = state.get(key)
    state[key] = measured if previous is None else SMOOTHING * measured + (1 - SMOOTHING) * previous
    state[f"{key}_anchor"] = [now, value]


def _estimate(state: dict[str, Any], unit: str | None, now: float) -> None:
    state["fraction"] = state["remaining_s"] = state["estimated_end_at"] = None
    if unit is None:
        return
    total = state[dict(_UNITS)[unit]]
    done = min(float(state[unit]), float(total))
    state["fraction"] = done / total
    rate = state.get("rate")
    if rate is None or rate <= 0:
        return
    remaining = (total - done) / rate
    state["remaining_s"] = remaining
    state["estimated_end_at"] = now + remaining


def remaining_now(state: dict[str, Any] | None, now: float) -> float | None:
    """Seconds left as of ``now``: the estimate counted down since it was made."""
    if not state or state.get("estimated_end_at") is None:
        return None
    return max(float(state["estimated_end_at"]) - now, 0.0)
