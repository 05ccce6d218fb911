"""The Ray backend on a real three-node Ray cluster on 127.0.0.1, with a real platform.

The tests share one cluster and one platform (in this order: the platform starts before
the cluster, to show it waits for it). Each test leaves every node undrained and no job of
its own running.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import views
from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    manifest_yaml,
    serving,
    wait_for,
)
from tests.integration.steps_job import steps_job
from tests.integration.test_object_stores import (
    DATA_BUCKET,
    RESULTS_BUCKET,
    TRAIN,
    ffdl_manifest,
)
from tests.ray_backend.cluster import NODES, RayTestCluster
from tests.s3server import S3Server, s3_server

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        server.make_bucket(DATA_BUCKET, {"numbers.txt": b"1 2 3 4\n"})
        server.make_bucket(RESULTS_BUCKET)
        yield server


@pytest.fixture(scope="module")
def platform(
    tmp_path_factory: pytest.TempPathFactory, ray_port: int, ray_root: Path, s3: S3Server
) -> Iterator[LiveServer]:
    config = {key: value for key, value in FAST_CONFIG.items() if key != "nodes"}
    config.update(
        backend="ray",
        ray_address=f"127.0.0.1:{ray_port}",
        ray_work_root=str(ray_root / "default-work-root"),
        checkpoint_store=f"file://{ray_root / 'checkpoint-store'}",
        checkpoint_sync_s=0.5,
        heartbeat_timeout_s=10.0,
        autoscaler_interval_s=0.5,
        min_rescale_interval_s=3600,
        object_store_endpoints=[s3.endpoint],
    )
    # The shared checkpoint store (a mount every node has, in production).
    (ray_root / "checkpoint-store").mkdir()
    home = tmp_path_factory.mktemp("platform") / "home"
    with serving(LiveServer(home=home, config=config)) as live:
        yield live


def _learner_nodes(model: dict[str, Any]) -> list[str]:
    return [str(lr["node"]) for lr in model["learners"]]


# -- the cluster is down at first -----------------------------------------------------------


def test_jobs_wait_for_an_unreachable_cluster_and_run_once_it_is_up(
    platform: LiveServer, request: pytest.FixtureRequest, ray_port: int
) -> None:
    assert platform.client.get("/v1/models").status_code == 200, "the API serves meanwhile"
    manifest, files = steps_job(5)
    job_id = platform.submit_ok(manifest, files)
    wanted = f"Ray cluster unreachable at 127.0.0.1:{ray_port}"

    def queued_with_reason() -> bool:
        model = platform.model(job_id)
        return (
            views.status(model) == "QUEUED" and (model.get("queue") or {}).get("reason") == wanted
        )

    wait_for(queued_with_reason, timeout=20, what="the unreachable reason")
    assert views.nodes(platform) == {}

    cluster: RayTestCluster = request.getfixturevalue("ray_cluster")
    model = platform.wait_status(job_id, {"COMPLETED"}, timeout=120)
    # The job may finish on the first nodes the platform sees; the rest join on its next
    # look at the cluster.
    wait_for(lambda: set(views.nodes(platform)) == set(NODES), timeout=30, what="every node listed")
    nodes = views.nodes(platform)
    for node in nodes.values():
        assert node["labels"]["address"] == "127.0.0.1", node
        assert node["gpus"] == 4
    assert {n["labels"]["rack"] for n in nodes.values()} == {"r1", "r2"}
    assert _learner_nodes(model)[0] in NODES
    assert cluster.address.endswith(str(ray_port))


# -- a job on the cluster -------------------------------------------------------------------


def test_a_job_runs_where_ffdl_placed_it_with_logs_metrics_and_model(
    platform: LiveServer, ray_cluster: RayTestCluster
) -> None:
    manifest, files = steps_job(12, learners=2, gpus=2)
    job_id = platform.submit_ok(manifest, files)
    model = platform.wait_status(job_id, {"COMPLETED"}, timeout=120)

    lines = views.lines(platform, job_id)
    assert views.steps(lines) == list(range(1, 13))
    records = platform.client.get(f"/v1/logs/{job_id}/emetrics", params={"pagesize": 100})
    iterations = [int(r["etimes"]["iteration"]["value"]) for r in records.json()["models"]]
    assert iterations == list(range(1, 13))
    assert views.trained_model(platform, job_id)["steps"] == 12

    # Each learner ran on the node ffdl placed it on: its state is in that node's work
    # root only, and its GPUs are the ones ffdl accounted to it.
    for learner in model["learners"]:
        index, node = learner["learner"], learner["node"]
        for name in NODES:
            state = ray_cluster.work_root(name) / "jobs" / job_id / "learners" / str(index)
            assert state.exists() == (name == node), (name, node)
        started = next(line for line in lines if line.startswith(f"learner {index}/2 start="))
        devices = ",".join(str(g) for g in learner["gpu_ids"])
        assert started.endswith(f"gpus={devices}"), (started, learner)


def test_an_object_store_job_gets_its_data_on_its_node_and_leaves_results_in_the_bucket(
    platform: LiveServer, ray_cluster: RayTestCluster, s3: S3Server
) -> None:
    job_id = platform.submit_ok(ffdl_manifest(s3.connection()), {"train.py": TRAIN})
    model = platform.wait_status(job_id, {"COMPLETED"}, timeout=120)
    (node,) = _learner_nodes(model)
    lines = views.lines(platform, job_id)
    assert "sum: 10" in lines
    staged = ray_cluster.work_root(node) / "jobs" / job_id / "data" / "numbers.txt"
    assert staged.read_bytes() == b"1 2 3 4\n", "staged onto the learner's node"
    stored = s3.objects(RESULTS_BUCKET, f"{job_id}/")
    assert stored[f"{job_id}/model/total.txt"] == b"10"
    assert b"sum: 10" in stored[f"{job_id}/learner-1/training-log.txt"]
    assert stored[f"{job_id}/_wml_checkpoints/epoch-1.ckpt"] == b"weights"
    assert f"{job_id}/_submitted_code/model.zip" in stored


PLACED = {"PENDING", "DOWNLOADING", "PROCESSING", "STORING"}


def test_the_talk_gang_scenario_runs_two_whole_gangs_on_two_nodes(
    platform: LiveServer, ray_cluster: RayTestCluster
) -> None:
    views.drain(platform, "c", True)
    ids: list[str] = []
    try:
        manifest, files = steps_job(30, pause=0.2, learners=4, gpus=1)
        ids = [platform.submit_ok(manifest, files) for _ in range(4)]

        # Placed, not yet running, counts: on a slow machine one gang may finish before
        # the other's learners have all started, but both are placed in the same pass.
        def two_placed() -> list[dict[str, Any]] | None:
            models = [platform.model(i) for i in ids]
            placed = [m for m in models if views.status(m) in PLACED]
            return models if len(placed) == 2 else None

        models = wait_for(two_placed, timeout=90, interval=0.1, what="two gangs placed")
        placed = [m["model_id"] for m in models if views.status(m) in PLACED]
        for model in models:
            if views.status(model) == "QUEUED":
                assert not model["learners"], "partial placement"
            else:
                assert model["model_id"] in placed or views.status(model) == "COMPLETED", model
        # Each placed gang starts whole, on the two undrained nodes.
        for job_id in placed:
            model = platform.wait_status(job_id, {"PROCESSING", "STORING", "COMPLETED"}, 90)
            assert len(model["learners"]) == 4, model["learners"]
            assert set(_learner_nodes(model)) <= {"a", "b"}
        for job_id in ids:
            platform.wait_status(job_id, {"COMPLETED"}, timeout=180)
    finally:
        # A failure here leaves no gang holding the nodes the next tests need.
        for job_id in ids:
            platform.client.delete(f"/v1/models/{job_id}")
        views.drain(platform, "c", False)


DDP = """
import json, os
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits

torch.manual_seed(0)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
digits = load_digits()
x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
y = torch.tensor(digits.target)
train_x, train_y, test_x, test_y = x[:1400], y[:1400], x[1400:], y[1400:]
shard = slice(rank * 700, (rank + 1) * 700)
model = torch.nn.Linear(64, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
for epoch in range(30):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(train_x[shard]), train_y[shard])
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
print(f"rank {rank} accuracy {accuracy:.6f} master {os.environ['MASTER_ADDR']}", flush=True)
dist.destroy_process_group()
"""


def test_a_two_learner_gloo_job_across_two_nodes_trains_as_on_one(
    platform: LiveServer, ray_cluster: RayTestCluster
) -> None:
    accuracy: dict[str, str] = {}
    for policy in ("spread", "pack"):
        manifest = manifest_yaml(
            "python ddp.py", learners=2, gpus=1, memory="1GiB", placement={"policy": policy}
        )
        job_id = platform.submit_ok(manifest, {"ddp.py": DDP})
        model = platform.wait_status(job_id, {"COMPLETED"}, timeout=180)
        nodes = _learner_nodes(model)
        assert len(set(nodes)) == (2 if policy == "spread" else 1), nodes
        found = [
            m.group(1)
            for line in views.lines(platform, job_id)
            if (m := re.match(r"rank \d accuracy (\S+) master 127\.0\.0\.1", line))
        ]
        assert len(found) == 2 and found[0] == found[1], found
        accuracy[policy] = found[0]
    assert accuracy["spread"] == accuracy["pack"]
    assert float(accuracy["spread"]) > 0.85


# -- faults ---------------------------------------------------------------------------------


def test_a_lost_node_restarts_its_job_from_the_checkpoint_elsewhere(
    platform: LiveServer, ray_cluster: RayTestCluster
) -> None:
    manifest, files = steps_job(60, pause=0.1, max_restarts=2)
    job_id = platform.submit_ok(manifest, files)
    platform.wait_status(job_id, {"PROCESSING"}, timeout=60)
    wait_for(lambda: 10 in views.steps(views.lines(platform, job_id)), timeout=60, what="step 10")
    lost = _learner_nodes(platform.model(job_id))[0]

    ray_cluster.remove(lost)
    try:
        wait_for(lambda: lost not in views.nodes(platform), timeout=30, what="capacity to shrink")
        model = platform.wait_status(job_id, {"COMPLETED"}, timeout=180)
        reasons = [str(e["reason"]) for e in model["events"]]
        assert any(f"node {lost} lost" in r for r in reasons), reasons
        last = max(lr["attempt"] for lr in model["learners"])
        assert all(lr["node"] != lost for lr in model["learners"] if lr["attempt"] == last)
        assert views.trained_model(platform, job_id)["done"] == list(range(1, 61))
    finally:
        ray_cluster.add(lost)
    wait_for(lambda: lost in views.nodes(platform), timeout=60, what="the node to come back")

    # The node that came back takes work again.
    others = [name for name in NODES if name != lost]
    for name in others:
        views.drain(platform, name, True)
    try:
        again, files = steps_job(3)
        back = platform.submit_ok(again, files)
        model = platform.wait_status(back, {"COMPLETED"}, timeout=120)
        assert _learner_nodes(model) == [lost]
    finally:
        for name in others:
            views.drain(platform, name, False)


NUMBERED = """
import sys, time
for i in range(1, TOTAL + 1):
    print(f"line {i}", flush=True)
    time.sleep(0.05)
"""


def test_a_control_plane_killed_and_restarted_reattaches_without_losing_a_line(
    platform: LiveServer, ray_cluster: RayTestCluster
) -> None:
    total = 200
    job_id = platform.submit_ok(
        manifest_yaml("python numbered.py"), {"numbered.py": NUMBERED.replace("TOTAL", str(total))}
    )
    platform.wait_status(job_id, {"PROCESSING"}, timeout=60)
    wait_for(lambda: len(views.lines(platform, job_id)) >= 20, timeout=60, what="first lines")
    platform.stop(signal.SIGKILL)
    platform.start()
    model = platform.wait_status(job_id, {"COMPLETED"}, timeout=120)
    assert len({lr["attempt"] for lr in model["learners"]}) == 1, "reattached, not restarted"
    numbered = [line for line in views.lines(platform, job_id) if line.startswith("line ")]
    assert numbered == [f"line {i}" for i in range(1, total + 1)]
