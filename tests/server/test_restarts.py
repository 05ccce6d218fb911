"""Restarts, back-off, resume of a FAILED job and the monitor's silence rule, on a real SQLite
store with the real loops' functions (the scheduler over the fake backend's nodes, the
monitor over the local backend)."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from ffdl.backends.base import Backend
from ffdl.backends.factory import open_backend
from ffdl.backends.fake import FakeBackend
from ffdl.core.errors import IllegalTransition
from ffdl.core.resources import Node
from ffdl.core.status import JobStatus, LearnerStatus, Via
from ffdl.server.auth import JobTokens
from ffdl.server.credentials import CredentialVault
from ffdl.server.loops.monitor import monitor_pass
from ffdl.server.loops.scheduler import SchedulerLoop
from ffdl.server.platform import Platform
from ffdl.server.services.aggregate import aggregate_job, aggregate_job_failure
from ffdl.server.services.queries import job_attempts
from ffdl.server.services.restarts import BACKOFF_MAX_S, backoff_s
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import Event, Job, Learner
from ffdl.server.store.transitions import set_job_status, utcnow
from tests.server.factories import make_job, make_store, on_both_databases, start_learner

SECRET = b"s" * 32
MANIFEST: dict[str, Any] = {"name": "job", "framework": {"name": "custom", "command": "true"}}


def _platform(tmp_path: Path, store: Store, backend: Backend, **fields: Any) -> Platform:
    settings = Settings(home=tmp_path / "home")
    return Platform(
        settings=settings,
        store=store,
        backend=backend,
        job_tokens=JobTokens(SECRET),
        credentials=CredentialVault(SECRET),
        **fields,
    )


def _running_job(store: Store, job_id: str, max_restarts: int, **fields: Any) -> None:
    """A job in PROCESSING on attempt 1 with one PROCESSING learner."""
    make_job(store, job_id, manifest={**MANIFEST, "max_restarts": max_restarts}, **fields)
    start_learner(store, job_id)


def _fail_learner(store: Store, job_id: str, reason: str = "learner 1 exited with code 1") -> None:
    with store.write() as session:
        job = session.get(Job, job_id)
        learner = session.scalars(select(Learner).where(Learner.job_id == job_id)).first()
        assert job is not None and learner is not None
        learner.status = LearnerStatus.FAILED.value
        learner.reason = reason
        learner.exit_code = 1
        aggregate_job_failure(session, job, learner)


def _job(store: Store, job_id: str) -> Job:
    with store.read() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def test_back_off_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [5.0, 10.0, 20.0, 40.0]
    assert backoff_s(30) == BACKOFF_MAX_S
    assert backoff_s(10_000) == BACKOFF_MAX_S


@on_both_databases
def test_a_failure_with_restarts_left_requeues_with_a_back_off(
    tmp_path: Path, database: str
) -> None:
    store = make_store(tmp_path, database)
    _running_job(store, "training-a", max_restarts=2)
    before = utcnow()
    _fail_learner(store, "training-a")
    after = utcnow()
    job = _job(store, "training-a")
    assert job.status == "QUEUED" and job.restarts == 1 and job.placement is None
    assert job.not_before is not None
    # The back-off counts from the failure, which happened between the two readings (a
    # busy machine can take seconds over them).
    back_off = timedelta(seconds=backoff_s(1))
    assert before + back_off <= job.not_before <= after + back_off
    assert job.reason.startswith("restarting after learner 1 exited with code 1; back-off until")
    with store.read() as session:
        last = session.scalars(select(Event).order_by(Event.id.desc())).first()
    assert last is not None and last.to_status == "QUEUED"
    assert last.reason == "restart 1 of 2 after learner 1 exited with code 1"


@on_both_databases
def test_no_restarts_left_fails_the_job_with_the_cause(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    _running_job(store, "training-b", max_restarts=1, restarts=1)
    _fail_learner(store, "training-b", "learner 1 exited with code 1; last lines: boom")
    job = _job(store, "training-b")
    assert job.status == "FAILED" and job.error_code == "C201" and job.exit_code == 1
    assert job.reason == "learner 1 exited with code 1; last lines: boom"


@on_both_databases
def test_stopping_jobs_are_never_restarted(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    _running_job(store, "training-cancel", max_restarts=3, desired="cancel")
    _fail_learner(store, "training-cancel")
    # The cancellation is the lifecycle manager's to finish: it ends CANCELLED, not FAILED.
    assert _job(store, "training-cancel").status == "PROCESSING"

    _running_job(store, "training-halt", max_restarts=3)
    with store.write() as session:
        job = session.get(Job, "training-halt")
        assert job is not None
        job.desired = "halt"
        set_job_status(session, job, JobStatus.HALTING, "halt requested by user")
    _fail_learner(store, "training-halt")
    job = _job(store, "training-halt")
    assert job.status == "FAILED" and (job.restarts or 0) == 0


@on_both_databases
def test_only_a_restart_or_a_resume_takes_the_way_back_to_the_queue(
    tmp_path: Path, database: str
) -> None:
    store = make_store(tmp_path, database)
    _running_job(store, "training-c", max_restarts=0)
    with pytest.raises(IllegalTransition), store.write() as session:
        job = session.get(Job, "training-c")
        assert job is not None
        set_job_status(session, job, JobStatus.QUEUED, "requeue without a cause")
    with store.write() as session:
        job = session.get(Job, "training-c")
        assert job is not None
        set_job_status(session, job, JobStatus.FAILED, "crashed", error_code="C201")
    for via in (None, Via.RESTART):
        with pytest.raises(IllegalTransition), store.write() as session:
            job = session.get(Job, "training-c")
            assert job is not None
            set_job_status(session, job, JobStatus.QUEUED, "back", via=via)
    with store.write() as session:
        job = session.get(Job, "training-c")
        assert job is not None
        set_job_status(session, job, JobStatus.QUEUED, "resumed by user", via=Via.RESUME)
    job = _job(store, "training-c")
    assert job.status == "QUEUED" and job.error_code is None and job.finished_at is None


@on_both_databases
def test_the_scheduler_places_no_job_before_its_back_off_ends(
    tmp_path: Path, database: str
) -> None:
    store = make_store(tmp_path, database)
    node = Node(name="node-a", gpus=4, cpus=16, memory_mb=32768, gpu_type="cpu")
    platform = _platform(tmp_path, store, FakeBackend([node]))
    loop = SchedulerLoop(platform)
    _running_job(store, "training-d", max_restarts=1)
    _fail_learner(store, "training-d")
    reason = _job(store, "training-d").reason

    snapshot, _ = loop.snapshot()
    assert snapshot.queued == ()
    loop()
    job = _job(store, "training-d")
    assert job.status == "QUEUED" and job.reason == reason, "it keeps its restart reason"

    with store.write() as session:
        row = session.get(Job, "training-d")
        assert row is not None and row.not_before is not None
        row.not_before = utcnow() - timedelta(seconds=1)
    loop()
    job = _job(store, "training-d")
    assert job.status == "PENDING" and job.attempt == 2 and job.not_before is None


@on_both_databases
def test_attempts_are_read_from_the_events(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    _running_job(store, "training-e", max_restarts=1)
    _fail_learner(store, "training-e")
    with store.write() as session:
        job = session.get(Job, "training-e")
        assert job is not None
        job.attempt = 2
        set_job_status(session, job, JobStatus.PENDING, "placed on node-a")
        set_job_status(session, job, JobStatus.PROCESSING, "training")
    with store.read() as session:
        events = session.scalars(select(Event).order_by(Event.id)).all()
    attempts = job_attempts(events)
    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, "FAILED"), (2, "PROCESSING")]
    assert attempts[0]["reason"].startswith("restart 1 of 1 after")
    assert attempts[0]["ended"] is not None and attempts[1]["ended"] is None


def _silent_learner(store: Store, job_id: str, handle: dict[str, Any], silent_s: float) -> None:
    _running_job(store, job_id, max_restarts=0)
    with store.write() as session:
        learner = session.scalars(select(Learner).where(Learner.job_id == job_id)).one()
        learner.handle = handle
        learner.last_heartbeat = utcnow() - timedelta(seconds=silent_s)


def _gone_handle(tmp_path: Path, name: str) -> dict[str, Any]:
    """The handle of a controller that exited without leaving a result."""
    state_dir = tmp_path / name
    state_dir.mkdir()
    # Above the kernel's largest pid (pid_max is at most 2**22): no process has it.
    return {"pid": 1 << 22, "state_dir": str(state_dir), "spec": str(state_dir / "spec.json")}


@on_both_databases
def test_silence_counts_from_the_control_planes_start(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    _silent_learner(store, "training-f", _gone_handle(tmp_path, "f"), silent_s=300)
    settings = Settings(home=tmp_path / "home")
    just_started = _platform(tmp_path, store, open_backend(settings.backend_config()))
    monitor_pass(just_started)
    assert _job(store, "training-f").status == "PROCESSING", "nobody could hear it till now"

    started_long_ago = _platform(
        tmp_path,
        store,
        open_backend(settings.backend_config()),
        started_at=utcnow() - timedelta(minutes=10),
    )
    monitor_pass(started_long_ago)
    job = _job(store, "training-f")
    assert job.status == "FAILED" and job.error_code == "S201"


def test_a_controller_that_never_reported_has_the_deploy_timeout_not_the_heartbeats(
    tmp_path: Path,
) -> None:
    """A worker still being spawned on a busy node has not spoken yet: it is not silent."""
    store = make_store(tmp_path)
    state_dir = tmp_path / "starting"
    state_dir.mkdir()
    spec = state_dir / "spec.json"
    # A live process whose command line names the spec, leading its own process group: what
    # the local backend's controllers are.
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", str(spec)], start_new_session=True
    )
    try:
        _silent_learner(
            store,
            "training-s",
            {"pid": process.pid, "state_dir": str(state_dir), "spec": str(spec)},
            0,
        )
        settings = Settings(home=tmp_path / "home", heartbeat_timeout_s=30, deploy_timeout_s=120)
        platform = _platform(
            tmp_path,
            store,
            open_backend(settings.backend_config()),
            started_at=utcnow() - timedelta(minutes=10),
        )

        def launched_ago(seconds: float) -> None:
            with store.write() as session:
                learner = session.scalars(
                    select(Learner).where(Learner.job_id == "training-s")
                ).one()
                learner.last_heartbeat = None
                learner.updated_at = utcnow() - timedelta(seconds=seconds)

        launched_ago(60)  # past the heartbeat timeout, within the deploy timeout
        monitor_pass(platform)
        assert _job(store, "training-s").status == "PROCESSING"
        assert process.poll() is None

        launched_ago(200)
        monitor_pass(platform)
        job = _job(store, "training-s")
        assert (job.status, job.error_code) == ("FAILED", "S201")
        assert "never reported" in (job.reason or ""), job.reason
        assert process.wait(timeout=30) == -9, "the monitor kills it"
    finally:
        process.kill()
        process.wait()


@on_both_databases
def test_one_learners_error_does_not_stop_the_monitor_pass(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    # An unusable handle (a pid that is no number) makes the backend raise for that learner.
    broken = {"pid": "not-a-pid", "state_dir": str(tmp_path), "spec": "spec.json"}
    _silent_learner(store, "training-g", broken, silent_s=300)
    _silent_learner(store, "training-h", _gone_handle(tmp_path, "h"), silent_s=300)
    settings = Settings(home=tmp_path / "home")
    platform = _platform(
        tmp_path,
        store,
        open_backend(settings.backend_config()),
        started_at=utcnow() - timedelta(minutes=10),
    )
    monitor_pass(platform)
    assert _job(store, "training-g").status == "PROCESSING"
    job = _job(store, "training-h")
    assert job.status == "FAILED" and job.error_code == "S201"


@on_both_databases
def test_a_learner_lost_while_halting_leaves_the_job_halted(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    _running_job(store, "training-halt", max_restarts=2)
    with store.write() as session:
        job = session.get(Job, "training-halt")
        assert job is not None
        set_job_status(session, job, JobStatus.HALTING, "halt requested by user")
    with store.write() as session:
        job = session.get(Job, "training-halt")
        learner = session.scalars(select(Learner).where(Learner.job_id == job.id)).first()
        assert job is not None and learner is not None
        learner.status = LearnerStatus.FAILED.value
        learner.reason = "controller of learner 1 is gone without a result"
        aggregate_job(session, job, [learner])
    with store.read() as session:
        job = session.get(Job, "training-halt")
        assert job is not None
        assert job.status == JobStatus.HALTED.value
        assert "learner 1 ended: controller of learner 1 is gone" in job.reason
        assert (job.restarts or 0) == 0
