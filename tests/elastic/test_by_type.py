"""The optimizer over GPU types (``optimize_types``) and its autoscaler glue: the same plan as
``optimize`` on one type, moves to a faster type only when worth a restart, gangs on one
type, pins and holds honoured."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from ffdl.elastic.autoscale import Candidate, TypedCandidate, autoscale_types
from ffdl.elastic.by_type import TypedJob, TypedPlan, optimize_types
from ffdl.elastic.optimizer import OBJECTIVES, ElasticJob, Objective, optimize
from ffdl.elastic.throughput import ThroughputModel, on_faster_gpus

SLOW = ThroughputModel(alpha=0.005, beta=0.002, gamma=0.02, delta=0.03)
FAST = on_faster_gpus(SLOW, 4.0)
PER_NODE = {"h100": 4, "a100": 4}


def job(
    job_id: str = "a", *, gpus: int = 0, batch: int | None = None, **fields: object
) -> ElasticJob:
    values: dict[str, object] = {
        "id": job_id,
        "priority": 50,
        "gpu_range": (1, 4),
        "batch_range": (64, 512),
        "base_batch": 64,
        "model": SLOW,
        "current_gpus": gpus,
        "current_batch": batch if gpus else None,
        "age_s": 3600.0,
        "running_s": 3600.0 if gpus else 0.0,
    }
    values.update(fields)
    return ElasticJob(**values)


def on_both(base: ElasticJob, current: str | None = None) -> TypedJob:
    return TypedJob({"h100": replace(base, model=FAST), "a100": base}, current)


def solve(
    jobs: list[TypedJob], h100: int, a100: int, objective: Objective = "proportional"
) -> TypedPlan:
    return optimize_types(
        jobs,
        {"h100": h100, "a100": a100},
        objective=objective,
        restart_cost_s=30.0,
        gpus_per_node=PER_NODE,
    )


def random_jobs(rng: random.Random, count: int) -> list[ElasticJob]:
    jobs = []
    for index in range(count):
        gang = rng.choice((1, 1, 2))
        current = rng.choice((0, 0, gang, 2 * gang))
        jobs.append(
            ElasticJob(
                id=f"j{index}",
                priority=rng.choice((0, 50, 100)),
                gpu_range=(gang, 8 * gang),
                batch_range=(32, 1024),
                base_batch=32,
                gpus_per_learner=gang,
                model=ThroughputModel(
                    alpha=rng.uniform(0.001, 0.01),
                    beta=rng.uniform(0.0005, 0.003),
                    gamma=0.02,
                    delta=0.03,
                ),
                local_batch_range=(4, 128),
                current_gpus=current,
                current_batch=64 if current else None,
                current_nodes=1 if current else None,
                waited_s=rng.uniform(0.0, 1200.0),
                running_s=rng.uniform(0.0, 1200.0),
                age_s=rng.uniform(0.0, 7200.0),
            )
        )
    return jobs


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_on_one_type_it_plans_as_the_optimizer_does(objective: Objective) -> None:
    rng = random.Random(5)
    for _ in range(15):
        jobs = random_jobs(rng, rng.randint(1, 25))
        alone = optimize(jobs, 48, objective=objective, restart_cost_s=30.0, admit_after_s=60.0)
        typed = optimize_types(
            [TypedJob({"a100": j}, "a100" if j.running else None) for j in jobs],
            {"a100": 48},
            objective=objective,
            restart_cost_s=30.0,
            admit_after_s=60.0,
        )
        assert typed.plan.objective == pytest.approx(alone.objective, rel=1e-9)
        assert [a.gpus for a in typed.plan.allocations] == [a.gpus for a in alone.allocations]
        assert typed.plan.changed == alone.changed
        assert typed.plan.yielded == alone.yielded
        assert set(typed.gpu_types) <= {"a100", None}


def test_a_running_job_moves_to_the_faster_type_when_it_has_room() -> None:
    running = on_both(job(gpus=4, batch=256), current="a100")
    busy = solve([running], h100=0, a100=4)
    assert busy.gpu_types == ("a100",)
    free = solve([running], h100=4, a100=4)
    assert free.gpu_types == ("h100",)
    assert free.plan.allocations[0].gpus == 4
    assert free.plan.changed == ("a",)


def test_a_move_that_gains_less_than_its_restart_is_not_made() -> None:
    # On a type only 1 % faster, a young job (a restart is dear to it) stays where it is.
    young = job(gpus=4, batch=512, age_s=30.0, running_s=30.0)
    barely = TypedJob(
        {"h100": replace(young, model=on_faster_gpus(SLOW, 1.01)), "a100": young}, "a100"
    )
    plan = solve([barely], h100=4, a100=4)
    assert plan.gpu_types == ("a100",)
    assert plan.plan.changed == ()


def test_queued_jobs_go_where_they_are_worth_most_and_gangs_stay_on_one_type() -> None:
    jobs = [on_both(job(f"q{i}", gpu_range=(1, 8))) for i in range(3)]
    plan = solve(jobs, h100=4, a100=4)
    used: dict[str, int] = {}
    for allocation, kind in zip(plan.plan.allocations, plan.gpu_types, strict=True):
        assert allocation.gpus <= 4  # no type has more: a gang never spans two
        if kind is not None:
            used[kind] = used.get(kind, 0) + allocation.gpus
    assert used == {"h100": 4, "a100": 4}


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_the_fast_type_goes_to_the_queued_job_that_gains_most_from_it_whatever_the_order(
    objective: Objective,
) -> None:
    # One GPU of each type; one job runs 1.1x faster on the H100, the other 4x.
    little = TypedJob(
        {"h100": job("little", model=on_faster_gpus(SLOW, 1.1)), "a100": job("little")}
    )
    much = on_both(job("much"))
    for order in ([little, much], [much, little]):
        plan = solve(order, h100=1, a100=1, objective=objective)
        types = dict(zip((j.id for j in order), plan.gpu_types, strict=True))
        assert types == {"much": "h100", "little": "a100"}


def test_a_job_that_accepts_one_type_never_gets_another() -> None:
    only_a100 = TypedJob({"a100": job("only")})
    plan = solve([only_a100], h100=8, a100=0)
    assert plan.plan.allocations[0].gpus == 0 and plan.gpu_types == (None,)
    plan = solve([only_a100], h100=8, a100=2)
    assert plan.gpu_types == ("a100",) and plan.plan.allocations[0].gpus == 2


def test_every_move_raises_the_objective() -> None:
    rng = random.Random(9)
    for _ in range(10):
        jobs = random_jobs(rng, 12)
        kinds = [rng.choice(("h100", "a100")) if j.running else None for j in jobs]
        typed = [
            TypedJob({"h100": replace(j, model=on_faster_gpus(j.model, 2.0)), "a100": j}, kind)
            for j, kind in zip(jobs, kinds, strict=True)
        ]
        staying = [
            TypedJob({kind: t.variants[kind]}, kind) if kind else t
            for t, kind in zip(typed, kinds, strict=True)
        ]
        free = solve(typed, h100=24, a100=24)
        fixed = solve(staying, h100=24, a100=24)
        assert free.plan.objective >= fixed.plan.objective - 1e-9


def test_autoscale_types_honours_a_pin_and_a_hold() -> None:
    base = job(gpus=4, batch=256)
    variants = {"h100": Candidate(replace(base, model=FAST)), "a100": Candidate(base)}
    kwargs: dict[str, Any] = {
        "gpus_per_node": PER_NODE,
        "objective": "proportional",
        "restart_cost_s": 30.0,
    }
    [move] = autoscale_types([TypedCandidate(variants, "a100")], {"h100": 4, "a100": 4}, **kwargs)
    assert move.gpu_type == "h100" and move.reason.startswith("move a100→h100 GPUs")
    # Pinned to the slower type, it moves there all the same.
    pinned = TypedCandidate(
        {"h100": Candidate(replace(base, model=FAST)), "a100": Candidate(base)}, "h100", "a100"
    )
    [back] = autoscale_types([pinned], {"h100": 4, "a100": 4}, **kwargs)
    assert back.gpu_type == "a100" and "pinned by ffdl scale --gpu-type" in back.reason
    # Held (restarted too recently): it stays, type and size.
    held = {t: replace(c, hold=True) for t, c in variants.items()}
    assert autoscale_types([TypedCandidate(held, "a100")], {"h100": 4, "a100": 4}, **kwargs) == []


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="share one id"):
        TypedJob({"h100": job("a"), "a100": job("b")})
    with pytest.raises(ValueError, match="needs its current_type"):
        TypedJob({"a100": job(gpus=2, batch=64)})
    with pytest.raises(ValueError, match=">= 0"):
        solve([on_both(job())], h100=-1, a100=4)
    with pytest.raises(ValueError, match="unique"):
        solve([on_both(job()), on_both(job())], h100=4, a100=4)
    with pytest.raises(ValueError, match="finite number > 0"):
        on_faster_gpus(SLOW, 0.0)
