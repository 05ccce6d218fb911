"""What the autoscaler loop reads from a stored job into the optimizer's view of it."""

from __future__ import annotations

import time
from pathlib import Path

from ffdl.core.manifest import ElasticSpec
from ffdl.core.resources import LearnerPlacement, Node, Placement
from ffdl.core.status import JobStatus
from ffdl.elastic.throughput import ThroughputModel, on_faster_gpus, prior
from ffdl.server.loops.autoscaler import job_state, model_on_type, reachable_gpus
from ffdl.server.services.snapshots import queued_job
from ffdl.server.store.models import Job
from tests.server.factories import make_job, make_store

ELASTIC = ElasticSpec.model_validate({"gpus": {"min": 1, "max": 8}})


def test_a_running_gang_brings_the_machines_it_spans(tmp_path: Path) -> None:
    store = make_store(tmp_path, "sqlite")
    spread = Placement(
        (
            LearnerPlacement(1, "node-a", (0, 1)),
            LearnerPlacement(2, "node-b", (0, 1)),
            LearnerPlacement(3, "node-b", (2, 3)),
        )
    )
    make_job(
        store,
        "training-spread",
        status=JobStatus.PROCESSING.value,
        learners=3,
        gpus=2,
        elastic=True,
        attempt=3,
        placement=spread.to_json(),
    )
    make_job(store, "training-queued", elastic=True)
    with store.read() as session:
        running = session.get(Job, "training-spread")
        queued = session.get(Job, "training-queued")
        assert running is not None and queued is not None
        now = time.time()
        state = job_state(running, ELASTIC, 6, now, epoch_now=4)
        waiting = job_state(queued, ELASTIC, 0, now, epoch_now=None)
    assert (state.current_gpus, state.current_nodes, state.restarts) == (6, 2, 2)
    assert state.epoch == 4 and state.gpus_per_learner == 2
    assert waiting.current_nodes is None and waiting.restarts == 0


def test_an_elastic_gang_reaches_the_gpus_of_one_type_it_accepts(tmp_path: Path) -> None:
    store = make_store(tmp_path, "sqlite")
    nodes = [
        Node("h1", 8, 64.0, 262144, "h100"),
        Node("h2", 8, 64.0, 262144, "h100"),
        Node("a1", 4, 64.0, 262144, "a100"),
        Node("a2", 4, 64.0, 262144, "a100", schedulable=False),
    ]
    make_job(store, "training-any", elastic=True)
    make_job(store, "training-a100", elastic=True, gpu_types=["a100"])
    make_job(store, "training-mixed", elastic=True, mix_gpu_types=True)
    with store.read() as session:
        reach = {
            job_id: reachable_gpus(job, nodes)
            for job_id in ("training-any", "training-a100", "training-mixed")
            if (job := session.get(Job, job_id)) is not None
        }
    # The largest type it may use, drained nodes left out; all of them when it may mix.
    assert reach == {"training-any": 16, "training-a100": 4, "training-mixed": 20}


def test_a_job_is_valued_on_each_gpu_type_by_what_it_measured_or_scaled_speeds() -> None:
    speeds = {"h100": 3.0, "a100": 1.0}
    on_a100 = ThroughputModel(alpha=0.01, beta=0.003, gamma=0.04, delta=0.02)
    on_h100 = ThroughputModel(alpha=0.002, beta=0.002, gamma=0.04, delta=0.02)
    # Never ran: the prior, three times as fast in compute on an H100.
    assert model_on_type({}, "h100", speeds) == on_faster_gpus(prior(), 3.0)
    assert model_on_type({}, "a100", speeds) == prior()
    # Ran on A100s only: that fit, scaled for the H100s; the exchange does not speed up.
    scaled = model_on_type({"a100": on_a100}, "h100", speeds)
    assert (scaled.alpha, scaled.beta) == (0.01 / 3.0, 0.003 / 3.0)
    assert (scaled.gamma, scaled.delta) == (0.04, 0.02)
    # Ran on both: each type's own fit, whatever the speeds say.
    both = {"a100": on_a100, "h100": on_h100}
    assert model_on_type(both, "h100", speeds) == on_h100
    assert model_on_type(both, "a100", speeds) == on_a100
    # A type not named in gpu_speeds counts 1.
    assert model_on_type({"h100": on_h100}, "t4", speeds) == on_faster_gpus(on_h100, 1.0 / 3.0)


def test_the_scheduler_is_told_the_type_a_waiting_elastic_job_was_planned_on(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path, "sqlite")
    make_job(store, "training-planned", elastic=True, rescale_target={"gpu_type": "a100"})
    make_job(store, "training-fixed", rescale_target={"gpu_type": "a100"})
    with store.read() as session:
        planned = session.get(Job, "training-planned")
        fixed = session.get(Job, "training-fixed")
        assert planned is not None and fixed is not None
        assert queued_job(planned).preferred_type == "a100"
        assert queued_job(fixed).preferred_type is None
        # Placed alone for a move, the type asked for is the only one.
        assert queued_job(planned, gpu_type="h100").gpu_types == ("h100",)
