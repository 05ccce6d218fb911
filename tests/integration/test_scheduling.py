"""Scheduling on declared virtual nodes with real learner processes: gangs, preemption, quotas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    code_zip,
    manifest_yaml,
    serving,
    wait_for,
)

EIGHT_GPUS = [
    {
        "name": "node-a",
        "gpus": 4,
        "cpus": 16,
        "memory": "32GiB",
        "gpu_type": "cpu",
        "labels": {"rack": "r1"},
    },
    {
        "name": "node-b",
        "gpus": 4,
        "cpus": 16,
        "memory": "32GiB",
        "gpu_type": "cpu",
        "labels": {"rack": "r2"},
    },
]

STEPS = """
import sys, time
from ffdl.sdk.api import context, load_checkpoint, report, save_checkpoint, should_stop

ctx = context()
restored = load_checkpoint()
step = 0 if restored is None else restored[1]["step"]
print(f"learner {ctx.learner_id} start={step}", flush=True)
while step < TOTAL:
    step += 1
    time.sleep(0.05)
    if ctx.learner_id == 1:
        report(step=step, progress=step / TOTAL)
        save_checkpoint({"step": step}, step, keep=2)
    if should_stop():
        sys.exit(0)
print(f"learner {ctx.learner_id} done", flush=True)
"""


def steps_job(total: int, **fields: Any) -> tuple[str, dict[str, str]]:
    return manifest_yaml("python steps.py", **fields), {
        "steps.py": STEPS.replace("TOTAL", str(total))
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LiveServer]:
    config = {**FAST_CONFIG, "nodes": EIGHT_GPUS}
    with serving(LiveServer(home=tmp_path / "home", config=config)) as live:
        yield live


def _status(model: dict[str, Any]) -> str:
    return str(model["training"]["training_status"]["status"])


def test_talk_gang_scenario_runs_two_whole_gangs_and_queues_two(cluster: LiveServer) -> None:
    manifest, files = steps_job(60, learners=4, gpus=1)
    ids = [cluster.submit_ok(manifest, files) for _ in range(4)]

    def two_running() -> list[dict[str, Any]] | None:
        models = [cluster.model(i) for i in ids]
        running = [m for m in models if _status(m) == "PROCESSING"]
        return models if len(running) == 2 else None

    models = wait_for(two_running, timeout=60, interval=0.1, what="two gangs running")
    for model in models:
        if _status(model) == "PROCESSING":
            assert len(model["learners"]) == 4
            assert len(model["placement"]) == 4
        else:
            assert _status(model) == "QUEUED"
            assert not model["learners"] and not model["placement"], "partial placement"
            assert model["queue"]["reason"]
            assert model["queue"]["position"] in (1, 2)
    used = sum(n["used"]["gpus"] for n in cluster.client.get("/v1/nodes").json()["nodes"])
    assert used == 8
    for job_id in ids:
        cluster.wait_status(job_id, {"COMPLETED"}, timeout=120)


def test_quota_holds_a_tenants_third_job_with_a_reason(cluster: LiveServer) -> None:
    created = cluster.client.post("/v1/tenants", json={"id": "team-q", "max_running_jobs": 2})
    assert created.status_code == 201
    user = cluster.client.post("/v1/tenants/team-q/users", json={"name": "quinn"}).json()
    team = httpx.Client(
        base_url=cluster.url, headers={"Authorization": f"Bearer {user['token']}"}, timeout=30
    )
    manifest, files = steps_job(2000, learners=1, gpus=2)
    ids = []
    for _ in range(3):
        response = team.post(
            "/v1/models",
            files={
                "manifest": ("m.yml", manifest.encode()),
                "model_definition": ("c.zip", code_zip(files)),
            },
        )
        assert response.status_code == 201, response.text
        ids.append(response.json()["model_id"])
    # Nobody else waits, so the third job borrows idle capacity beyond the quota...
    wait_for(
        lambda: all(_status(team.get(f"/v1/models/{i}").json()) == "PROCESSING" for i in ids),
        timeout=60,
        what="three team-q jobs running",
    )
    # ...until another tenant needs a whole node: the borrowed capacity is reclaimed.
    blocker_manifest, blocker_files = steps_job(40, learners=1, gpus=4)
    blocker = cluster.submit_ok(blocker_manifest, blocker_files)
    cluster.wait_status(blocker, {"PROCESSING", "STORING", "COMPLETED"}, timeout=60)

    def third_held() -> dict[str, Any] | None:
        models = [team.get(f"/v1/models/{i}").json() for i in ids]
        held = [m for m in models if _status(m) == "QUEUED"]
        running = [m for m in models if _status(m) == "PROCESSING"]
        if len(running) == 2 and len(held) == 1:
            return held[0]
        return None

    held = wait_for(third_held, timeout=60, interval=0.1, what="third job back in the queue")
    # Any team-q job may be the one reclaimed: the one whose node the blocker can then use.
    reasons = [e["reason"] for e in held["events"] if e["learner"] is None]
    assert any("reclaim" in r and "borrowed" in r for r in reasons), reasons
    reason = held["queue"]["reason"]
    assert "team-q" in reason and "quota" in reason and "2 running jobs" in reason, reason
    queue = team.get("/v1/queue").json()["queue"]
    assert [e["model_id"] for e in queue] == [held["model_id"]]
    for job_id in [*ids, blocker]:
        cluster.client.delete(f"/v1/models/{job_id}")
    team.close()
