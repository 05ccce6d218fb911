"""What the loops do when the backend is in trouble: a problem that keeps learners from
starting, a backend unreachable for a while, GPU ids the backend bound itself, a learner
lost with a reason. Real SQLite store, the real loops' functions, and a double of a remote
backend (``TroubledBackend``) over the fake backend."""

from __future__ import annotations

import asyncio
import io
import logging
import threading
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from ffdl.core.jobdirs import JobDirs
from ffdl.core.resources import Node
from ffdl.core.status import JobStatus
from ffdl.server.app import create_app
from ffdl.server.auth import JobTokens
from ffdl.server.credentials import CredentialVault
from ffdl.server.loops.autoscaler import AutoscalerLoop
from ffdl.server.loops.lcm import lcm_pass
from ffdl.server.loops.monitor import monitor_pass
from ffdl.server.loops.scheduler import SchedulerLoop
from ffdl.server.platform import Platform
from ffdl.server.services.nodes import effective_nodes
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import DeployStep, Event, Job, Learner, NodeState
from ffdl.server.store.transitions import utcnow
from tests.server.factories import make_job, make_store, start_learner
from tests.server.troubled_backend import TroubledBackend

SECRET = b"s" * 32
TROUBLE = "Ray cluster unreachable at 10.0.0.9:6379"
MANIFEST: dict[str, Any] = {"name": "job", "framework": {"name": "custom", "command": "true"}}


def _nodes() -> list[Node]:
    return [
        Node(name="node-a", gpus=2, cpus=16, memory_mb=32768, gpu_type="A100"),
        Node(name="node-b", gpus=2, cpus=16, memory_mb=32768, gpu_type="A100"),
    ]


def _platform(tmp_path: Path, backend: TroubledBackend, **settings: Any) -> Platform:
    return Platform(
        settings=Settings(home=tmp_path / "home", sandbox=False, **settings),
        store=make_store(tmp_path),
        backend=backend,
        job_tokens=JobTokens(SECRET),
        credentials=CredentialVault(SECRET),
        # Long up, so that a silent controller counts as silent (see the monitor).
        started_at=utcnow() - timedelta(minutes=10),
    )


@pytest.fixture
def backend() -> TroubledBackend:
    return TroubledBackend(_nodes())


@pytest.fixture
def platform(tmp_path: Path, backend: TroubledBackend) -> Platform:
    return _platform(tmp_path, backend)


def _job(store: Store, job_id: str) -> Job:
    with store.read() as session:
        job = session.get(Job, job_id)
        assert job is not None
        session.expunge(job)
        return job


def _learners(store: Store, job_id: str) -> list[Learner]:
    with store.read() as session:
        rows = list(
            session.scalars(select(Learner).where(Learner.job_id == job_id).order_by(Learner.index))
        )
        for row in rows:
            session.expunge(row)
        return rows


def _reasons(store: Store, job_id: str) -> list[str]:
    with store.read() as session:
        return [
            e.reason or ""
            for e in session.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id))
        ]


def _placed_job(platform: Platform, job_id: str, placement: list[dict[str, Any]]) -> None:
    """A PENDING job on attempt 1 with ``placement``, its code archive in place."""
    make_job(
        platform.store,
        job_id,
        manifest=MANIFEST,
        learners=len(placement),
        status=JobStatus.PENDING.value,
        attempt=1,
        placement=placement,
        master_port=29500 if len(placement) > 1 else None,
    )
    archive = JobDirs.of(platform.settings.jobs_dir, job_id).archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("train.py", "print('hi')\n")
    archive.write_bytes(buffer.getvalue())


def _running_job(
    platform: Platform, job_id: str, handle: dict[str, Any], max_restarts: int = 0
) -> None:
    """A PROCESSING job on attempt 1 whose one learner on node-b has been silent a while."""
    make_job(
        platform.store,
        job_id,
        manifest={**MANIFEST, "max_restarts": max_restarts},
        placement=[{"learner": 1, "node": "node-b", "gpu_ids": [0]}],
    )
    start_learner(
        platform.store,
        job_id,
        node="node-b",
        gpu_ids=[0],
        handle=handle,
        last_heartbeat=utcnow() - timedelta(seconds=300),
    )


def _fake_handle(job_id: str) -> dict[str, Any]:
    return {"backend": "fake", "training_id": job_id, "learner": 1, "attempt": 1, "node": "node-b"}


# -- the scheduler and the autoscaler while the backend has a problem -----------------------


def test_queued_jobs_show_the_backends_problem_and_start_once_it_clears(
    platform: Platform, backend: TroubledBackend
) -> None:
    make_job(platform.store, "training-1")
    make_job(platform.store, "training-2")
    backend.trouble = TROUBLE
    loop = SchedulerLoop(platform)
    loop()
    first, second = _job(platform.store, "training-1"), _job(platform.store, "training-2")
    assert (first.status, first.reason) == ("QUEUED", TROUBLE)
    assert (second.status, second.reason) == ("QUEUED", TROUBLE)
    assert {first.queue_position, second.queue_position} == {1, 2}

    backend.trouble = None
    loop()
    assert _job(platform.store, "training-1").status == "PENDING"
    assert _job(platform.store, "training-2").status == "PENDING"


def test_nothing_is_preempted_while_the_backend_has_a_problem(
    platform: Platform, backend: TroubledBackend
) -> None:
    # A low-priority job holds all four GPUs; a high-priority one waits for them.
    make_job(
        platform.store,
        "training-low",
        status=JobStatus.PROCESSING.value,
        priority=10,
        learners=2,
        gpus=2,
        started_at=utcnow() - timedelta(hours=1),
        placement=[
            {"learner": 1, "node": "node-a", "gpu_ids": [0, 1]},
            {"learner": 2, "node": "node-b", "gpu_ids": [0, 1]},
        ],
    )
    make_job(platform.store, "training-high", priority=90, gpus=2)
    backend.trouble = TROUBLE
    loop = SchedulerLoop(platform)
    loop()
    assert _job(platform.store, "training-low").status == "PROCESSING"
    high = _job(platform.store, "training-high")
    assert (high.status, high.reason) == ("QUEUED", TROUBLE)

    backend.trouble = None
    loop()
    assert _job(platform.store, "training-low").status == "HALTING"


def test_the_autoscaler_does_nothing_while_the_backend_has_a_problem(
    platform: Platform, backend: TroubledBackend
) -> None:
    make_job(
        platform.store,
        "training-drained",
        status=JobStatus.PROCESSING.value,
        placement=[{"learner": 1, "node": "node-a", "gpu_ids": [0]}],
    )
    with platform.store.write() as session:
        session.add(
            NodeState(name="node-a", drained=True, reason="maintenance", changed_at=utcnow())
        )
    backend.trouble = TROUBLE
    loop = AutoscalerLoop(platform)
    loop()
    assert _job(platform.store, "training-drained").status == "PROCESSING"

    backend.trouble = None
    loop()
    assert _job(platform.store, "training-drained").status == "HALTING"


def test_an_unreachable_backend_offers_no_nodes(
    platform: Platform, backend: TroubledBackend
) -> None:
    assert [n.name for n in effective_nodes(platform)] == ["node-a", "node-b"]
    backend.unreachable = TROUBLE
    assert effective_nodes(platform) == []


# -- the lifecycle manager ------------------------------------------------------------------


def test_a_deploy_cut_short_by_an_unreachable_backend_launches_each_learner_once(
    platform: Platform, backend: TroubledBackend
) -> None:
    placement = [
        {"learner": 1, "node": "node-a", "gpu_ids": [0]},
        {"learner": 2, "node": "node-b", "gpu_ids": [1]},
    ]
    _placed_job(platform, "training-gang", placement)
    backend.launches_before_failing = 1  # learner 1 starts, learner 2's launch fails
    lcm_pass(platform)
    job = _job(platform.store, "training-gang")
    assert job.status == "PENDING" and job.error_code is None
    with platform.store.read() as session:
        steps = set(
            session.scalars(select(DeployStep.step).where(DeployStep.job_id == "training-gang"))
        )
    assert steps == {"prepare", "learner-1"}
    assert [lr.handle is not None for lr in _learners(platform.store, "training-gang")] == [
        True,
        False,
    ]

    lcm_pass(platform)
    assert dict(backend.launched) == {("training-gang", 1): 1, ("training-gang", 2): 1}
    assert all(lr.handle for lr in _learners(platform.store, "training-gang"))
    # Every launch carried the whole gang, so a backend can reserve it at once.
    gang = [(lp.learner, lp.node, lp.gpu_ids) for lp in backend.requests[0].gang]
    assert gang == [(1, "node-a", (0,)), (2, "node-b", (1,))]
    assert all(r.gang == backend.requests[0].gang for r in backend.requests)

    lcm_pass(platform)
    assert sum(backend.launched.values()) == 2


def test_jobs_deploy_side_by_side_so_a_slow_launch_holds_up_no_other(
    tmp_path: Path, backend: TroubledBackend
) -> None:
    platform = _platform(tmp_path, backend, deploy_concurrency=3)
    for n, (node, gpu) in enumerate((("node-a", 0), ("node-a", 1), ("node-b", 0))):
        _placed_job(platform, f"training-{n}", [{"learner": 1, "node": node, "gpu_ids": [gpu]}])
    # Each launch returns only once all three are under way: one deploy after another
    # would break the barrier and fail the jobs.
    backend.launch_barrier = threading.Barrier(3, timeout=30)
    lcm_pass(platform)
    assert dict(backend.launched) == {(f"training-{n}", 1): 1 for n in range(3)}
    for n in range(3):
        job = _job(platform.store, f"training-{n}")
        assert job.status == "PENDING" and job.error_code is None


def test_a_deploy_waits_while_the_backend_is_unreachable(
    platform: Platform, backend: TroubledBackend, caplog: pytest.LogCaptureFixture
) -> None:
    _placed_job(platform, "training-wait", [{"learner": 1, "node": "node-a", "gpu_ids": [0]}])
    backend.unreachable = TROUBLE
    with caplog.at_level(logging.WARNING, logger="ffdl.lcm"):
        lcm_pass(platform)
    job = _job(platform.store, "training-wait")
    assert job.status == "PENDING" and job.error_code is None
    waits = [r for r in caplog.records if r.name == "ffdl.lcm"]
    assert len(waits) == 1 and waits[0].levelno == logging.WARNING
    assert TROUBLE in waits[0].getMessage() and waits[0].exc_info is None

    backend.unreachable = None
    lcm_pass(platform)
    assert dict(backend.launched) == {("training-wait", 1): 1}


def test_gpu_ids_the_backend_bound_land_on_the_learner_and_the_placement(
    platform: Platform, backend: TroubledBackend
) -> None:
    placement = [
        {"learner": 1, "node": "node-a", "gpu_ids": [0]},
        {"learner": 2, "node": "node-b", "gpu_ids": [0]},
    ]
    _placed_job(platform, "training-bound", placement)
    backend.bound[("training-bound", 2)] = [1]
    lcm_pass(platform)
    learners = _learners(platform.store, "training-bound")
    assert [lr.gpu_ids for lr in learners] == [[0], [1]]
    assert _job(platform.store, "training-bound").placement == [
        {"learner": 1, "node": "node-a", "gpu_ids": [0]},
        {"learner": 2, "node": "node-b", "gpu_ids": [1]},
    ]


def test_learners_report_to_the_advertised_url(tmp_path: Path, backend: TroubledBackend) -> None:
    platform = _platform(tmp_path, backend, advertise_url="http://10.1.2.3:8080/")
    _placed_job(platform, "training-url", [{"learner": 1, "node": "node-a", "gpu_ids": [0]}])
    lcm_pass(platform)
    assert [r.spec.api_url for r in backend.requests] == ["http://10.1.2.3:8080"]


def test_a_cancel_waits_while_the_backend_is_unreachable(
    platform: Platform, backend: TroubledBackend
) -> None:
    _running_job(platform, "training-cancel", _fake_handle("training-cancel"))
    with platform.store.write() as session:
        job = session.get(Job, "training-cancel")
        assert job is not None
        job.desired = "cancel"
    backend.unreachable = TROUBLE
    lcm_pass(platform)
    assert _job(platform.store, "training-cancel").status == "PROCESSING"

    backend.unreachable = None
    lcm_pass(platform)
    assert _job(platform.store, "training-cancel").status == "CANCELLED"


# -- the monitor ----------------------------------------------------------------------------


def test_the_monitor_skips_learners_while_the_backend_is_unreachable(
    platform: Platform, backend: TroubledBackend, caplog: pytest.LogCaptureFixture
) -> None:
    _running_job(platform, "training-skip", _fake_handle("training-skip"))
    backend.lost[("training-skip", 1)] = "node node-b lost"
    backend.unreachable = TROUBLE
    with caplog.at_level(logging.DEBUG, logger="ffdl.monitor"):
        monitor_pass(platform)
    assert _job(platform.store, "training-skip").status == "PROCESSING"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    backend.unreachable = None
    monitor_pass(platform)
    assert _job(platform.store, "training-skip").status == "FAILED"


def test_a_learner_lost_with_a_reason_fails_its_job_with_that_reason(
    platform: Platform, backend: TroubledBackend
) -> None:
    _running_job(platform, "training-lost", _fake_handle("training-lost"))
    backend.lost[("training-lost", 1)] = "node node-b lost"
    monitor_pass(platform)
    job = _job(platform.store, "training-lost")
    assert (job.status, job.error_code) == ("FAILED", "S201")
    assert "node node-b lost" in (job.reason or "")
    assert _learners(platform.store, "training-lost")[0].reason == "node node-b lost"


def test_a_restart_after_a_lost_node_names_it(platform: Platform, backend: TroubledBackend) -> None:
    _running_job(platform, "training-again", _fake_handle("training-again"), max_restarts=2)
    backend.lost[("training-again", 1)] = "node node-b lost"
    monitor_pass(platform)
    assert _job(platform.store, "training-again").status == "QUEUED"
    assert "restart 1 of 2 after node node-b lost" in _reasons(platform.store, "training-again")


# -- the platform's shutdown ----------------------------------------------------------------


def test_the_backend_is_closed_when_the_platform_shuts_down(
    tmp_path: Path, backend: TroubledBackend
) -> None:
    app = create_app(Settings(home=tmp_path / "home", sandbox=False), backend)

    async def run_and_stop() -> None:
        # The app's own lifespan: the loops start, then stop as at a server's shutdown.
        async with app.router.lifespan_context(app):
            assert not backend.closed

    asyncio.run(run_and_stop())
    assert backend.closed


@pytest.mark.parametrize(("posts_per_s", "polled"), [(0.5, False), (0.0, True)])
def test_the_monitor_leaves_alone_a_learner_quiet_for_less_than_twice_its_pace(
    tmp_path: Path, backend: TroubledBackend, posts_per_s: float, polled: bool
) -> None:
    # Two learners on one replica at 0.5 posts a second: each is asked a gap of 4 s between
    # posts, so 5 s of quiet is its pace, not trouble; unpaced, it is past two heartbeats.
    platform = _platform(tmp_path, backend, heartbeat_s=1.0, report_posts_per_s=posts_per_s)
    for job_id, node in (("training-p1", "node-a"), ("training-p2", "node-b")):
        make_job(
            platform.store,
            job_id,
            manifest=MANIFEST,
            placement=[{"learner": 1, "node": node, "gpu_ids": [0]}],
        )
        handle = {**_fake_handle(job_id), "node": node}
        start_learner(
            platform.store,
            job_id,
            node=node,
            gpu_ids=[0],
            handle=handle,
            last_heartbeat=utcnow() - timedelta(seconds=5),
        )
        backend.lost[(job_id, 1)] = f"node {node} lost"
    monitor_pass(platform)
    statuses = {_job(platform.store, j).status for j in ("training-p1", "training-p2")}
    assert statuses == ({"FAILED"} if polled else {"PROCESSING"})
