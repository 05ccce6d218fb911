"""What the autoscaler loop reads from a stored job into the optimizer's view of it."""

from __future__ import annotations

import time
from pathlib import Path

from ffdl.core.manifest import ElasticSpec
from ffdl.core.resources import LearnerPlacement, Node, Placement
from ffdl.core.status import JobStatus
from ffdl.server.loops.autoscaler import job_state, reachable_gpus
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
