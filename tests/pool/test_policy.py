"""The pool's rule (``ffdl.server.pool.policy``): bounds, hold times, hysteresis, cool-down,
the projection a shrink must pass, and the reasons it gives."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from ffdl.server.pool.config import pool_policy
from ffdl.server.pool.policy import (
    Change,
    Policy,
    PoolState,
    Signals,
    Thresholds,
    decide,
    parse_workers,
)
from ffdl.server.settings import Settings


def policy(**overrides: object) -> Policy:
    values: dict[str, object] = {
        "minimum": 1,
        "maximum": 4,
        "grow_after_s": 3.0,
        "shrink_after_s": 10.0,
        "cooldown_s": 5.0,
        "min_latency_samples": 20,
        "in_flight": Thresholds("in_flight", "in-flight", "", 4.0, 1.0, True),
        "p95_ms": Thresholds("p95_ms", "p95", " ms", 500.0, 100.0, False),
        "rps": Thresholds("rps", "rate", " req/s", 0.0, 0.0, True),
        "report_in_flight": Thresholds("report_in_flight", "report backlog", "", 2.0, 0.5, True),
        "report_p95_ms": Thresholds("report_p95_ms", "report p95", " ms", 1000.0, 200.0, False),
    }
    values.update(overrides)
    return Policy(**values)  # type: ignore[arg-type]


def run(
    rule: Policy, state: PoolState, signals: Signals, times: list[float]
) -> tuple[PoolState, list[Change]]:
    """``decide`` at each of ``times`` under the same signals."""
    changes = []
    for now in times:
        state, change = decide(rule, state, signals, now)
        if change is not None:
            changes.append(change)
    return state, changes


# -- bounds ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bounds"),
    [("1..3", (1, 3)), ("4", (4, 4)), (" 2 .. 5 ", (2, 5)), ("1..1", (1, 1))],
)
def test_workers_take_min_max_or_a_fixed_size(text: str, bounds: tuple[int, int]) -> None:
    assert parse_workers(text) == bounds


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("3..1", "MIN 3 is greater than MAX 1"),
        ("0..2", "MIN must be at least 1"),
        ("0", "MIN must be at least 1"),
        ("two", "expected MIN..MAX or N"),
        ("1..", "expected MIN..MAX or N"),
        ("-1..2", "expected MIN..MAX or N"),
        ("1-3", "expected MIN..MAX or N"),
        ("1..1000", "MAX 1000 is more than 256"),
    ],
)
def test_bad_workers_are_refused_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_workers(text)


def test_a_shrink_threshold_at_or_above_its_grow_threshold_is_refused() -> None:
    with pytest.raises(
        ValueError, match=re.escape("pool_shrink_in_flight (4) must be below pool_grow")
    ):
        policy(in_flight=Thresholds("in_flight", "in-flight", "", 4.0, 4.0, True))
    # A signal turned off (grow 0) has no hysteresis to check.
    policy(rps=Thresholds("rps", "rate", " req/s", 0.0, 50.0, True))


def test_the_settings_make_the_policy_and_no_workers_means_no_pool() -> None:
    assert pool_policy(Settings(workers=None)) is None
    rule = pool_policy(Settings(workers="2..6", pool_grow_in_flight=8, pool_shrink_in_flight=2))
    assert rule is not None
    assert (rule.minimum, rule.maximum, rule.in_flight.grow, rule.in_flight.shrink) == (2, 6, 8, 2)
    fixed = pool_policy(Settings(workers=3))
    assert fixed is not None and (fixed.minimum, fixed.maximum, fixed.elastic) == (3, 3, False)
    with pytest.raises(ValueError, match="pool_shrink_p95_ms"):
        pool_policy(Settings(workers="1..2", pool_grow_p95_ms=100, pool_shrink_p95_ms=300))


# -- growing ---------------------------------------------------------------------------


def test_grows_once_the_pressure_has_held_for_grow_after_s_and_says_why() -> None:
    busy = Signals(serving=2, in_flight=15.0)  # 7.5 per worker
    state, changes = run(policy(), PoolState(size=2), busy, [0.0, 1.0, 2.0, 2.9])
    assert changes == [] and state.grow_since == 0.0
    state, change = decide(policy(), state, busy, 3.0)
    assert change is not None and (change.old, change.new, change.direction) == (2, 3, "grow")
    assert change.reason == "grow 2→3: in-flight 7.5/worker > 4 for 3 s"
    assert state == PoolState(size=3, last_change_at=3.0)


def test_a_break_in_the_pressure_restarts_the_hold() -> None:
    busy, calm = Signals(serving=1, in_flight=6.0), Signals(serving=1, in_flight=2.0)
    state, _ = run(policy(), PoolState(size=1), busy, [0.0, 2.0])
    state, change = decide(policy(), state, calm, 2.5)
    assert change is None and state.grow_since is None
    state, changes = run(policy(), state, busy, [3.0, 5.0])
    assert changes == []
    _, change = decide(policy(), state, busy, 6.0)
    assert change is not None and change.new == 2


def test_latency_grows_the_pool_only_over_enough_requests() -> None:
    slow_few = Signals(serving=1, p95_ms=900.0, requests=5)
    _, changes = run(policy(), PoolState(size=1), slow_few, [0.0, 5.0])
    assert changes == []
    slow_many = replace(slow_few, requests=200)
    _, changes = run(policy(), PoolState(size=1), slow_many, [0.0, 3.0])
    assert [c.reason for c in changes] == ["grow 1→2: p95 900 ms > 500 for 3 s"]


def test_the_controllers_report_backlog_grows_the_pool() -> None:
    backlog = Signals(serving=2, report_in_flight=5.0, report_p95_ms=1500.0, reports=50)
    _, changes = run(policy(), PoolState(size=2), backlog, [0.0, 3.0])
    assert [c.reason for c in changes] == [
        "grow 2→3: report backlog 2.5/worker > 2, report p95 1500 ms > 1000 for 3 s"
    ]


def test_every_signal_above_its_threshold_is_named() -> None:
    rule = policy(rps=Thresholds("rps", "rate", " req/s", 100.0, 20.0, True))
    busy = Signals(serving=2, in_flight=10.0, rps=500.0, p95_ms=750.0, requests=2500)
    _, changes = run(rule, PoolState(size=2), busy, [0.0, 3.0])
    assert changes[0].reason == (
        "grow 2→3: in-flight 5.0/worker > 4, p95 750 ms > 500, rate 250 req/s/worker > 100 for 3 s"
    )


def test_never_grows_past_max_and_steps_by_step() -> None:
    rule = policy(step=2, maximum=5)
    busy = Signals(serving=4, in_flight=40.0)
    state, changes = run(rule, PoolState(size=4), busy, [0.0, 3.0])
    assert [(c.old, c.new) for c in changes] == [(4, 5)]
    _, changes = run(rule, state, replace(busy, serving=5), [10.0, 20.0, 30.0])
    assert changes == [], "at MAX the pool stays"


# -- cool-down and changes taking effect ------------------------------------------------


def test_after_a_change_the_pool_cools_down_before_the_next() -> None:
    rule = policy(grow_after_s=0.0, cooldown_s=5.0)
    busy = Signals(serving=1, in_flight=10.0)
    state, change = decide(rule, PoolState(size=1), busy, 0.0)
    assert change is not None and change.new == 2
    busy = replace(busy, serving=2)
    state, changes = run(rule, state, busy, [1.0, 2.0, 4.9])
    assert changes == []
    _, change = decide(rule, state, busy, 5.0)
    assert change is not None and change.new == 3


def test_waits_while_a_worker_boots_or_the_pool_is_not_yet_its_size() -> None:
    rule = policy(grow_after_s=0.0, cooldown_s=0.0)
    booting = Signals(serving=2, booting=1, in_flight=30.0)
    _, change = decide(rule, PoolState(size=3), booting, 0.0)
    assert change is None
    short = Signals(serving=2, in_flight=30.0)
    _, change = decide(rule, PoolState(size=3), short, 0.0)
    assert change is None
    _, change = decide(rule, PoolState(size=3), replace(short, serving=3), 0.0)
    assert change is not None and change.new == 4


# -- shrinking -------------------------------------------------------------------------


def test_shrinks_when_the_load_fits_fewer_workers_for_shrink_after_s() -> None:
    light = Signals(serving=3, in_flight=1.5, p95_ms=20.0, requests=400)
    state, changes = run(policy(), PoolState(size=3), light, [0.0, 5.0, 9.9])
    assert changes == [] and state.shrink_since == 0.0
    state, change = decide(policy(), state, light, 10.0)
    assert change is not None and (change.old, change.new, change.direction) == (3, 2, "shrink")
    assert change.reason == (
        "shrink 3→2: load fits 2 for 10 s "
        "(in-flight 0.8/worker < 1, p95 20.0 ms < 100, report backlog 0.0/worker < 0.5)"
    )


def test_a_load_light_for_many_workers_but_too_heavy_for_fewer_keeps_them() -> None:
    # 0.8 per worker at 3 (below 1), but 1.2 per worker at 2: shrinking would not fit.
    load = Signals(serving=3, in_flight=2.4)
    _, changes = run(policy(), PoolState(size=3), load, [0.0, 20.0, 40.0])
    assert changes == []


def test_between_the_thresholds_nothing_changes() -> None:
    # 3 per worker: below grow (4), above shrink (1): the hysteresis band.
    band = Signals(serving=2, in_flight=6.0)
    state, changes = run(policy(), PoolState(size=2), band, [float(t) for t in range(0, 60, 5)])
    assert changes == [] and state.grow_since is None and state.shrink_since is None


def test_a_slow_p95_keeps_the_pool_from_shrinking() -> None:
    slowish = Signals(serving=2, in_flight=0.2, p95_ms=300.0, requests=100)
    _, changes = run(policy(), PoolState(size=2), slowish, [0.0, 20.0, 40.0])
    assert changes == []


def test_an_idle_pool_shrinks_to_min_and_no_further() -> None:
    rule = policy(minimum=2, shrink_after_s=1.0, cooldown_s=1.0)
    idle = Signals(serving=4)
    state = PoolState(size=4)
    sizes = []
    for now in range(0, 20):
        state, change = decide(rule, state, replace(idle, serving=state.size), float(now))
        if change is not None:
            idle_reason = "(in-flight 0.0/worker < 1, report backlog 0.0/worker < 0.5)"
            assert change.reason.endswith(idle_reason)
            sizes.append(change.new)
    assert sizes == [3, 2]


def test_a_size_outside_the_bounds_is_brought_back_at_once() -> None:
    rule = policy(minimum=2, maximum=3)
    _, change = decide(rule, PoolState(size=5), Signals(serving=5), 0.0)
    assert change is not None and change.new == 3 and change.reason == "shrink 5→3: outside 2..3"
    _, change = decide(rule, PoolState(size=1), Signals(serving=1), 0.0)
    assert change is not None and change.new == 2 and change.reason == "grow 1→2: outside 2..3"


def test_a_fixed_pool_never_changes() -> None:
    rule = policy(minimum=2, maximum=2, grow_after_s=0.0, shrink_after_s=0.0, cooldown_s=0.0)
    for signals in (Signals(serving=2, in_flight=100.0), Signals(serving=2)):
        _, changes = run(rule, PoolState(size=2), signals, [0.0, 10.0, 100.0])
        assert changes == []
