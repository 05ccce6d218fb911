"""Fairness between tenants with real learner processes: under ``tenant_fairness: max_min`` a
tenant running one elastic job gets about as many GPUs as a tenant running three, where
without it each job gets an even share; every elastic job shows its finish-time fairness (rho), and
``GET /v1/queue`` and ``ffdl queue`` each tenant's GPUs against those it is entitled to."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.live import (
    LiveServer,
    manifest_yaml,
    serving,
    wait_for,
)
from tests.integration.test_cli import ffdl
from tests.integration.test_elastic import elastic_config

# One machine: no gang pays for crossing the network, so speed grows with GPUs alone.
EIGHT_GPUS = [{"name": "node-a", "gpus": 8, "cpus": 16, "memory": "32GiB", "gpu_type": "cpu"}]
# Steps at a fixed pace on any number of GPUs, reporting samples in proportion to its GPUs:
# a job whose speed grows with its GPUs, as the optimizer learns from its reports.
SCALING = """
import os, sys, time
from ffdl.sdk.api import context, load_checkpoint, report, save_checkpoint, should_stop

ctx = context()
gpus = int(os.environ["FFDL_GPUS"])
restored = load_checkpoint()
step, samples = (0, 0) if restored is None else (restored[1]["step"], restored[1]["samples"])
while step < 1000:
    step += 1
    samples += 64 * gpus
    time.sleep(0.2)
    if ctx.learner_id == 1:
        report(step=step, samples=samples)
        save_checkpoint({"step": step, "samples": samples}, step, keep=2)
    if should_stop():
        sys.exit(0)
"""
TEAM_B = "team-b"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    config = {
        **elastic_config(min_rescale_interval_s=1.0),
        "nodes": EIGHT_GPUS,
        "tenant_fairness": "max_min",
    }
    home = Path(tmp_path_factory.mktemp("tenant-fairness")) / "home"
    with serving(LiveServer(home=home, config=config)) as live:
        yield live


def _elastic() -> tuple[str, dict[str, str]]:
    manifest = manifest_yaml("python scaling.py", elastic={"gpus": {"min": 1, "max": 8}})
    return manifest, {"scaling.py": SCALING}


def _gpus(live: LiveServer) -> dict[str, int]:
    models = live.client.get("/v1/models", params={"status": "PROCESSING"}).json()["models"]
    return {m["model_id"]: m["training"]["learners"] * m["training"]["gpus"] for m in models}


def test_a_tenant_with_one_job_gets_about_as_many_gpus_as_a_tenant_with_three(
    cluster: LiveServer,
) -> None:
    assert cluster.client.post("/v1/tenants", json={"id": TEAM_B}).status_code == 201
    user = cluster.client.post(f"/v1/tenants/{TEAM_B}/users", json={"name": "bea"})
    assert user.status_code == 201, user.text
    token = str(user.json()["token"])

    ours = [cluster.submit_ok(*_elastic()) for _ in range(3)]

    def spread_over_all() -> dict[str, int] | None:
        held = _gpus(cluster)
        return held if sum(held.get(job_id, 0) for job_id in ours) == 8 else None

    wait_for(spread_over_all, timeout=90, interval=0.2, what="the default tenant's 8 GPUs")
    theirs = cluster.submit_ok(*_elastic(), token=token)

    # Per job, 2 GPUs each would be best (the optimizer's proportional objective); per
    # tenant, team-b's one job weighs as much as the default tenant's three together.
    def fair() -> dict[str, int] | None:
        held = _gpus(cluster)
        return held if held.get(theirs, 0) >= 3 else None

    held = wait_for(fair, timeout=120, interval=0.2, what="team-b's job on 3 GPUs or more")
    assert sum(held.get(job_id, 0) for job_id in ours) <= 5

    # Every running elastic job has its rho; the queue view has each tenant's share.
    def with_rho() -> dict[str, Any] | None:
        model = cluster.model(theirs)
        return model if isinstance(model.get("rho"), float) else None

    model = wait_for(with_rho, timeout=30, interval=0.2, what="team-b's job's rho")
    assert model["rho"] > 0
    tenants = {row["tenant"]: row for row in cluster.client.get("/v1/queue").json()["tenants"]}
    assert tenants[TEAM_B]["entitled_gpus"] == tenants["default"]["entitled_gpus"] == 4.0
    assert tenants[TEAM_B]["gpus"] >= 1
    shown = ffdl(cluster, "queue")
    assert shown.returncode == 0, shown.stderr
    assert re.search(rf"{TEAM_B}\s.*\b4\b", shown.stdout), shown.stdout

    for job_id in (*ours, theirs):
        cluster.client.patch(f"/v1/models/{job_id}", json={"status": "cancel"})
    for job_id in (*ours, theirs):
        cluster.wait_status(job_id, {"CANCELLED", "COMPLETED"}, timeout=60)
