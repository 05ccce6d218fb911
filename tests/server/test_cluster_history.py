"""The cluster's history: a sample per interval from the real store, thinned as it ages."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from ffdl.server.app import build_platform
from ffdl.server.services.history import DAY, HOUR, history, record_cluster_sample, thin
from ffdl.server.settings import NodeConfig, Settings
from ffdl.server.store.models import ClusterSample, Job, Learner
from tests.server.factories import make_job, start_learner


def test_a_sample_counts_gpus_the_queue_and_busy_gpus(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path / "home",
        sandbox=False,
        cluster_sample_s=10.0,
        nodes=[NodeConfig(name="node-a", gpus=4, cpus=8, memory="16GiB")],
    )
    platform = build_platform(settings)
    try:
        store = platform.store
        make_job(store, "training-run", tenant_id="default", user_id="admin", gpus=2)
        start_learner(store, "training-run", gpu_ids=[0, 1])
        with store.write() as session:
            job = session.get(Job, "training-run")
            assert job is not None
            job.placement = [{"learner": 1, "node": "node-a", "gpu_ids": [0, 1]}]
            session.scalars(select(Learner)).one().gpu_util = 75.0
        make_job(store, "training-wait", tenant_id="default", user_id="admin", gpus=4)
        assert record_cluster_sample(platform, now=1000.0)
        assert not record_cluster_sample(platform, now=1005.0)  # within the interval
        assert record_cluster_sample(platform, now=1010.0)
        with store.read() as session:
            samples = history(session, since=None)["samples"]
            assert history(session, since=1000.0)["samples"] == samples[1:]
        assert samples[0] == {
            "time": 1000.0,
            "span_s": 10.0,
            "gpus_total": 4,
            "gpus_allocated": 2,
            "gpus_busy": 1.5,
            "queue_length": 1,
            "running": 1,
        }
    finally:
        platform.close()


def test_old_samples_are_merged_and_the_oldest_dropped(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", sandbox=False)
    platform = build_platform(settings)
    now = 100 * DAY
    try:
        with platform.store.write() as session:
            # Every 10 s over the last 2 h, plus rows 2 days and 40 days old.
            times = [now - i * 10.0 for i in range(720)] + [now - 2 * DAY, now - 40 * DAY]
            for at in times:
                busy = 1.0 if at > now - HOUR else 3.0
                session.add(
                    ClusterSample(
                        time=at,
                        span_s=10.0,
                        gpus_total=8,
                        gpus_allocated=4,
                        gpus_busy=busy,
                        queue_length=2,
                        running=1,
                    )
                )
            session.flush()
            thin(session, now)
        with platform.store.read() as session:
            rows = session.scalars(select(ClusterSample).order_by(ClusterSample.time)).all()
        recent = [r for r in rows if r.time >= now - HOUR]
        older = [r for r in rows if now - DAY < r.time < now - HOUR]
        assert len(recent) == 361 and all(r.span_s == 10.0 for r in recent)
        assert 60 <= len(older) <= 61 and sum(r.span_s for r in older) == pytest.approx(3590.0)
        assert all(r.gpus_busy == 3.0 for r in older)
        assert [r.time for r in rows if r.time < now - DAY] == [now - 2 * DAY]
    finally:
        platform.close()
