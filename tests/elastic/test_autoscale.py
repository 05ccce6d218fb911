"""The autoscaler's pure decision: pins, holds, starts and the optimizer's own choices."""

from __future__ import annotations

from ffdl.elastic.autoscale import Candidate, autoscale
from ffdl.elastic.optimizer import ElasticJob
from ffdl.elastic.throughput import ThroughputModel

# Compute-bound with cheap synchronisation: more GPUs and larger batches always pay.
SCALES_WELL = ThroughputModel(alpha=0.005, beta=0.002, gamma=0.001, delta=0.001)


def job(job_id: str, current: int, batch: int | None = None, **fields: object) -> ElasticJob:
    values: dict[str, object] = {
        "id": job_id,
        "priority": 50,
        "gpu_range": (1, 4),
        "batch_range": (64, 256),
        "base_batch": 64,
        "model": SCALES_WELL,
        "current_gpus": current,
        "current_batch": batch,
    }
    values.update(fields)
    return ElasticJob(**values)  # type: ignore[arg-type]


def test_idle_gpus_grow_a_running_job() -> None:
    decisions = autoscale([Candidate(job("a", 1, 64))], capacity=4)
    assert [(d.job_id, d.from_gpus, d.to_gpus) for d in decisions] == [("a", 1, 4)]
    assert "grow 1→4" in decisions[0].reason


def test_a_held_job_keeps_gpus_and_batch() -> None:
    assert autoscale([Candidate(job("a", 1, 64), hold=True)], capacity=4) == []


def test_a_pin_at_the_current_size_is_a_hold_even_for_the_batch() -> None:
    assert autoscale([Candidate(job("a", 2, 64), pinned_gpus=2)], capacity=4) == []


def test_a_pin_moves_the_job_to_exactly_that_size() -> None:
    decisions = autoscale([Candidate(job("a", 4, 256), pinned_gpus=1)], capacity=4)
    assert [(d.from_gpus, d.to_gpus) for d in decisions] == [(4, 1)]


def test_a_queued_job_is_started_with_the_gpus_left() -> None:
    decisions = autoscale(
        [Candidate(job("run", 2, 128), hold=True), Candidate(job("new", 0))], capacity=4
    )
    starts = [d for d in decisions if d.job_id == "new"]
    assert [(d.from_gpus, d.to_gpus) for d in starts] == [(0, 2)]
    assert all(d.job_id != "run" for d in decisions)


def test_shrinking_capacity_shrinks_instead_of_stopping() -> None:
    decisions = autoscale([Candidate(job("a", 4, 256))], capacity=2)
    assert [(d.from_gpus, d.to_gpus) for d in decisions] == [(4, 2)]


def test_a_held_job_that_rebatches_in_place_keeps_its_gpus_but_not_its_batch() -> None:
    held = job("a", 2, 64, gpu_range=(1, 4), rebatch_in_place=True)
    for candidate in (Candidate(held, hold=True), Candidate(held, pinned_gpus=2)):
        decisions = autoscale([candidate], capacity=4)
        assert [(d.from_gpus, d.to_gpus, d.from_batch) for d in decisions] == [(2, 2, 64)]
        assert decisions[0].in_place and decisions[0].to_batch is not None
        assert decisions[0].to_batch > 64
        assert "in place on 2 GPUs" in decisions[0].reason


def test_a_small_gain_is_worth_a_batch_change_in_place_but_not_a_restart() -> None:
    # One GPU, nothing to synchronise: a larger batch gains only a few percent, under the
    # restart penalty (10% of the job's progress) and over a tenth of it.
    def one_gpu(in_place: bool) -> ElasticJob:
        return job("a", 1, 64, gpu_range=(1, 1), batch_range=(64, 512), rebatch_in_place=in_place)

    assert autoscale([Candidate(one_gpu(False))], capacity=4) == []
    decisions = autoscale([Candidate(one_gpu(True))], capacity=4)
    assert [(d.from_gpus, d.to_gpus, d.in_place) for d in decisions] == [(1, 1, True)]
    assert "+3% useful progress" in decisions[0].reason, decisions[0]
