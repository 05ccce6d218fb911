"""The pool's policy as the settings (``workers``, ``pool_*``) describe it."""

from __future__ import annotations

from ffdl.server.pool.policy import Policy, Thresholds, parse_workers
from ffdl.server.settings import Settings


def pool_bounds(settings: Settings) -> tuple[int, int] | None:
    """``(MIN, MAX)`` of the pool the settings ask for; None for one process, no pool."""
    if settings.workers is None:
        return None
    text = str(settings.workers).strip()
    return parse_workers(text) if text else None


def pool_policy(settings: Settings) -> Policy | None:
    """The settings' pool policy (None: no pool); ValueError naming a bad setting."""
    bounds = pool_bounds(settings)
    if bounds is None:
        return None
    s = settings
    return Policy(
        minimum=bounds[0],
        maximum=bounds[1],
        step=s.pool_step,
        grow_after_s=s.pool_grow_after_s,
        shrink_after_s=s.pool_shrink_after_s,
        cooldown_s=s.pool_cooldown_s,
        min_latency_samples=s.pool_min_latency_samples,
        in_flight=Thresholds(
            "in_flight", "in-flight", "", s.pool_grow_in_flight, s.pool_shrink_in_flight, True
        ),
        p95_ms=Thresholds("p95_ms", "p95", " ms", s.pool_grow_p95_ms, s.pool_shrink_p95_ms, False),
        rps=Thresholds("rps", "rate", " req/s", s.pool_grow_rps, s.pool_shrink_rps, True),
        report_in_flight=Thresholds(
            "report_in_flight",
            "report backlog",
            "",
            s.pool_grow_report_in_flight,
            s.pool_shrink_report_in_flight,
            True,
        ),
        report_p95_ms=Thresholds(
            "report_p95_ms",
            "report p95",
            " ms",
            s.pool_grow_report_p95_ms,
            s.pool_shrink_report_p95_ms,
            False,
        ),
    )
