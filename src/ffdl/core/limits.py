"""Bounds on the numbers and text that reach the store, shared by the API and the learners.

SQLite keeps integers in 64 signed bits and Python's sqlite3 raises on anything larger, so
every integer from outside is checked against these bounds before it reaches a query; a
value outside them is the caller's error (HTTP 400 naming the field), never a server error.
Learner controllers apply the same bounds before they send, so a job writing absurd numbers
loses those metrics with a warning in its log instead of stalling its report stream.
"""

from __future__ import annotations

import math

from ffdl.core.errors import BadRequest

MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
# Counts a user may ask for (GPUs, learners, priorities, ...): storable as 32-bit integers.
MAX_COUNT = 2**31 - 1

# A metric's iteration is a step counter: never negative, and an INTEGER column holds it.
MAX_ITERATION = MAX_INT64
# Report times are Unix seconds; 9999-12-31T23:59:59Z is the last one ``datetime`` shows.
MAX_REPORT_TIME = 253_402_300_799.0
# A tuple, not ``int | float``: checked for every report item, and a union is built anew
# at each call.
_NUMBERS = (int, float)
# Far beyond float32's range, so no real metric reaches it, and small enough that sums and
# products of a few values stay finite where the platform aggregates them.
MAX_METRIC_MAGNITUDE = 1e100
MAX_METRIC_VALUES = 1000
MAX_METRIC_NAME = 200
MAX_GROUP_NAME = 100
MAX_LOG_TEXT = 100_000
MAX_REASON_TEXT = 10_000


def in_int64(value: int) -> bool:
    return MIN_INT64 <= value <= MAX_INT64


def iteration_problem(value: object) -> str | None:
    """Why ``value`` cannot be a metric's iteration, or None when it can (None included)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return "iteration must be an integer"
    if not 0 <= value <= MAX_ITERATION:
        return "iteration out of range"
    return None


def time_problem(value: object) -> str | None:
    """Why ``value`` cannot be a report time in Unix seconds, or None when it can."""
    if isinstance(value, bool) or not isinstance(value, _NUMBERS):
        return "time must be a number"
    if not math.isfinite(value) or not 0 <= value <= MAX_REPORT_TIME:
        return "time out of range"
    return None


def metric_value_problem(name: str, value: object) -> str | None:
    """Why ``value`` cannot be the metric ``name``'s value, or None when it can."""
    if isinstance(value, bool) or not isinstance(value, _NUMBERS):
        return f"value {name!r} is not a number"
    if isinstance(value, int) and not in_int64(value):
        return f"value {name!r} out of range"
    number = float(value)
    if not math.isfinite(number):
        return f"value {name!r} is not finite"
    if abs(number) > MAX_METRIC_MAGNITUDE:
        return f"value {name!r} out of range"
    return None


def bounded_int(value: object, field: str, low: int, high: int, *, code: str = "C100") -> int:
    """``value`` as an int within [low, high], or a 400 naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = repr(value) if isinstance(value, _NUMBERS) else type(value).__name__
        if len(shown) > 40:
            shown = shown[:37] + "..."
        raise BadRequest(
            f"{field} must be an integer from {low} to {high}, got {shown}",
            code=code,
            detail={"field": field},
        )
    return value
