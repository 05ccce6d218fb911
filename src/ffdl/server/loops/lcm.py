"""The lifecycle manager: deploys placed jobs, carries out halts and cancellations.

Deploying is a list of idempotent steps recorded in ``deploy_steps`` per attempt, so a
manager that crashed mid-deploy resumes where it stopped without starting a learner twice
(``Backend.launch`` is itself idempotent for the step that was running when it crashed).
Up to ``deploy_concurrency`` jobs deploy at once, each in a worker thread. No backend call
is made while a database session is open. A backend that cannot be reached
(``BackendUnavailable``) fails nothing: the job is left as it is and the next pass tries
again (a deploy that never gets through is bounded by the monitor's deploy timeout).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from ffdl.backends.base import BackendUnavailable, Handle, LaunchRequest, LearnerState
from ffdl.core.archive import unpack_archive
from ffdl.core.errors import (
    ArchiveError,
    FfdlError,
    IllegalTransition,
    LeaseLost,
    StatusChanged,
    Unavailable,
)
from ffdl.core.jobdirs import JobDirs
from ffdl.core.manifest import Manifest
from ffdl.core.resources import CPU_SLOTS, LearnerPlacement, Placement
from ffdl.core.status import TERMINAL_LEARNER_STATES, ErrorCode, JobStatus, LearnerStatus
from ffdl.learner.spec import OBJECT_STORE_KIND, DataMount, LearnerSpec
from ffdl.learner.staging import StagingError, hand_over
from ffdl.server.leases import ensure_fence_held, live_replica_urls
from ffdl.server.loops.scheduler import PREEMPTED, free_port
from ffdl.server.platform import Platform
from ffdl.server.services.aggregate import aggregate_job, aggregate_job_failure
from ffdl.server.services.learner_env import (
    batch_variables,
    ffdl_variables,
    job_runtime,
    pip_settings,
    runtime_path,
    runtime_programs,
    runtime_read_only,
)
from ffdl.server.services.nodes import effective_nodes
from ffdl.server.services.placing import place_alone
from ffdl.server.services.queries import current_learners
from ffdl.server.services.sandboxing import learner_sandbox, sandbox_owner
from ffdl.server.services.stores import (
    StoreError,
    learner_locations,
    results_path,
    results_url,
    training_data_path,
)
from ffdl.server.store.models import DeployStep, Job, Learner
from ffdl.server.store.transitions import (
    lock_job,
    set_job_status,
    set_learner_status,
    utcnow,
)
from ffdl.server.telemetry.instruments import DEPLOY_SECONDS, Timer
from ffdl.server.transport import learner_ca_pem

log = logging.getLogger("ffdl.lcm")


def lcm_pass(platform: Platform) -> None:
    with platform.store.read() as session:
        to_cancel = session.scalars(select(Job.id).where(Job.desired == "cancel")).all()
        to_deploy = session.scalars(
            select(Job.id).where(Job.status == JobStatus.PENDING.value, Job.desired.is_(None))
        ).all()
        halting = session.scalars(select(Job.id).where(Job.status == JobStatus.HALTING.value)).all()
        rescaling = session.scalars(
            select(Job.id).where(Job.status == JobStatus.RESCALING.value)
        ).all()
        preempted = session.scalars(
            select(Job.id).where(Job.status == JobStatus.HALTED.value, Job.desired == PREEMPTED)
        ).all()
    for job_id in to_cancel:
        _for_one_job(platform, cancel, job_id)
    for_each_job(platform, deploy, list(to_deploy), platform.settings.deploy_concurrency)
    for step, job_ids in ((halt, halting), (rescale, rescaling)):
        for job_id in job_ids:
            _for_one_job(platform, step, job_id)
    if preempted:
        requeue_preempted(platform, list(preempted))


def for_each_job(
    platform: Platform,
    step: Callable[[Platform, str], None],
    job_ids: list[str],
    concurrency: int,
) -> None:
    """Run ``step`` for every job, up to ``concurrency`` at once (a slow launch, an archive
    that takes long to unpack, does not hold up the jobs behind it).

    Each runs in a copy of this thread's context, so under this pass's lease fence. Once all
    have ended, the first ``LeaseLost`` or ``Unavailable`` among them ends the pass, as one
    run alone would.
    """
    if concurrency <= 1 or len(job_ids) <= 1:
        for job_id in job_ids:
            _for_one_job(platform, step, job_id)
        return
    workers = min(concurrency, len(job_ids))
    with ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix=f"ffdl-{step.__name__}"
    ) as pool:
        runs = [
            pool.submit(contextvars.copy_context().run, _for_one_job, platform, step, job_id)
            for job_id in job_ids
        ]
    for run in runs:
        failure = run.exception()
        if failure is not None:
            raise failure


def _for_one_job(platform: Platform, step: Callable[[Platform, str], None], job_id: str) -> None:
    """Run one job's step; whatever goes wrong is that job's failure, never the pass's.

    An unreachable backend is nobody's failure: the step stops where it is (what it did so
    far is recorded) and the next pass runs it again.
    """
    try:
        step(platform, job_id)
    except BackendUnavailable as exc:
        log.warning("%s of %s waits for the backend: %s", step.__name__, job_id, exc)
    except (LeaseLost, Unavailable):
        # This replica no longer runs the LCM, or the database is away: the whole pass
        # stops, and no job is blamed for it.
        raise
    except StatusChanged as exc:
        # Another replica or a request moved the job first; the next pass decides anew.
        log.info("%s of %s gave way: %s", step.__name__, job_id, exc)
    except Exception as exc:
        log.exception("%s of %s failed", step.__name__, job_id)
        code = ErrorCode.BAD_ARCHIVE if _is_archive_error(exc) else ErrorCode.DEPLOY_FAILED
        _fail(platform, job_id, f"{step.__name__} failed: {type(exc).__name__}: {exc}", code.value)


def _is_archive_error(exc: BaseException) -> bool:
    return isinstance(exc, ArchiveError | zipfile.BadZipFile | zlib.error | EOFError)


# -- deploy -------------------------------------------------------------------------------


def _steps_done(session: Session, job_id: str, attempt: int) -> set[str]:
    return set(
        session.scalars(
            select(DeployStep.step).where(
                DeployStep.job_id == job_id, DeployStep.attempt == attempt
            )
        )
    )


def _add_step(session: Session, job_id: str, attempt: int, step: str) -> None:
    if session.get(DeployStep, (job_id, attempt, step)) is None:
        session.add(DeployStep(job_id=job_id, attempt=attempt, step=step, done_at=utcnow()))


def deploy(platform: Platform, job_id: str) -> None:
    with Timer(DEPLOY_SECONDS.observe):
        _deploy(platform, job_id)


def _deploy(platform: Platform, job_id: str) -> None:
    # A deploy commits as few transactions as it can: while many jobs start, each commit
    # waits its turn behind the learners' reports (one writer on SQLite, one WAL flush on
    # PostgreSQL). One read; the preparation, its results location and every learner row
    # in one write; then one write per learner launched, which records its handle.
    with platform.store.read() as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.PENDING.value:
            return
        attempt, manifest = job.attempt, Manifest.from_dict(job.manifest)
        placement = Placement.from_json(job.placement or [])
        master_port, batch_size = job.master_port, job.batch_size
        done = _steps_done(session, job_id, attempt)
    dirs = JobDirs.of(platform.settings.jobs_dir, job_id)
    to_launch = [lp for lp in placement.learners if f"learner-{lp.learner}" not in done]
    try:
        prepared = "prepare" in done
        if not prepared:
            owner = sandbox_owner(platform, job_id)
            dirs.create(len(placement.learners), owner)
            unpack_archive(dirs.archive, dirs.code)
            if owner is not None:
                hand_over(str(dirs.code), *owner)
                dirs.code.chmod(0o700)
            location = results_path(platform.settings, manifest, job_id) or results_url(
                manifest, job_id
            )
        if not prepared or to_launch:
            with platform.store.write() as session:
                lock_job(session, job_id)
                if not prepared:
                    _record_results_location(session, job_id, dirs, location)
                    _add_step(session, job_id, attempt, "prepare")
                for lp in to_launch:
                    _add_learner_row(session, job_id, lp.learner, attempt, lp.node, lp.gpu_ids)
        for lp in to_launch:
            spec = build_spec(
                platform,
                job_id,
                manifest,
                placement,
                lp.learner,
                attempt,
                master_port,
                dirs,
                batch_size,
            )
            # A replica that lost the LCM's lease (frozen, cut off) must not start learners
            # that the new holder starts too.
            ensure_fence_held(platform.store)
            # BackendUnavailable propagates to ``_for_one_job``: this step stays unrecorded,
            # so the next pass launches this learner (launch is idempotent).
            handle = platform.backend.launch(
                LaunchRequest(lp.node, lp.gpu_ids, spec, gang=placement.learners)
            )
            with platform.store.write() as session:
                record_launch(session, job_id, attempt, lp, handle)
    except (LeaseLost, StatusChanged, Unavailable):
        raise  # the step stays unrecorded: the next pass takes it up again
    except StoreError as exc:
        _fail(platform, job_id, f"deploy failed: {exc}", exc.code)
    except (OSError, FfdlError, StagingError, zipfile.BadZipFile, zlib.error, EOFError) as exc:
        log.warning("deploy of %s failed: %s", job_id, exc)
        code = ErrorCode.BAD_ARCHIVE if _is_archive_error(exc) else ErrorCode.DEPLOY_FAILED
        _fail(platform, job_id, f"deploy failed: {exc}", code.value)


def record_launch(
    session: Session, job_id: str, attempt: int, lp: LearnerPlacement, handle: Handle
) -> None:
    """Record a launched learner's handle (and the GPUs the backend bound, where they
    differ from its placement) and the launch as a deploy step done.

    The job's row is locked first: the learner, launched a moment ago, may already be
    reporting, and a report locks the job before its learner (``lock_job``)."""
    lock_job(session, job_id)
    bound = _bound_gpu_ids(handle)
    learner = _learner(session, job_id, lp.learner, attempt)
    if learner is not None:
        learner.handle = handle
        if bound is not None and bound != lp.gpu_ids:
            learner.gpu_ids = list(bound)
    if bound is not None and bound != lp.gpu_ids:
        _record_bound_gpus(session, job_id, attempt, lp, bound)
    _add_step(session, job_id, attempt, f"learner-{lp.learner}")


def _bound_gpu_ids(handle: Handle) -> tuple[int, ...] | None:
    """The GPU ids the backend says it bound for a learner, if its handle names them."""
    ids = handle.get("gpu_ids")
    if not isinstance(ids, list | tuple) or not all(
        isinstance(g, int) and not isinstance(g, bool) for g in ids
    ):
        return None
    return tuple(ids)


def _record_bound_gpus(
    session: Session, job_id: str, attempt: int, lp: LearnerPlacement, bound: tuple[int, ...]
) -> None:
    """Make the job's placement say which devices its learner really holds, so that what
    the scheduler accounts matches what the backend bound."""
    job = session.get(Job, job_id)
    if job is None or job.attempt != attempt or not job.placement:
        return
    job.placement = [
        {**item, "gpu_ids": list(bound)} if item.get("learner") == lp.learner else item
        for item in job.placement
    ]


def _record_results_location(
    session: Session, job_id: str, dirs: JobDirs, target: Path | str | None
) -> None:
    job = session.get(Job, job_id)
    if job is not None:
        job.results_location = str(target or dirs.results)


def build_spec(
    platform: Platform,
    job_id: str,
    manifest: Manifest,
    placement: Placement,
    learner: int,
    attempt: int,
    master_port: int | None,
    dirs: JobDirs,
    batch_size: int | None = None,
) -> LearnerSpec:
    settings = platform.settings
    me = next(lp for lp in placement.learners if lp.learner == learner)
    nodes = {n.name: n for n in platform.backend.nodes()}
    node = nodes.get(me.node)
    real_gpus = node is not None and node.gpu_type != CPU_SLOTS
    env = {
        "PATH": settings.learner_path,
        "LANG": "C.UTF-8",
        "HOME": str(dirs.home),
        "PYTHONUNBUFFERED": "1",
        # Learners sharing a host must not each start one thread per core.
        "OMP_NUM_THREADS": str(max(1, int(manifest.cpus))),
        "DATA_DIR": str(dirs.data),
        "RESULT_DIR": str(dirs.results),
        "MODEL_DIR": str(dirs.code),
        "LOG_DIR": str(dirs.logs(learner)),
        "CHECKPOINT_DIR": str(dirs.checkpoints),
        "JOB_STATE_DIR": str(dirs.state),
        "LEARNER_ID": str(learner),
        "NUM_LEARNERS": str(len(placement.learners)),
        "TRAINING_ID": job_id,
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in me.gpu_ids) if real_gpus else "",
        # GPU ids are nvidia-smi's (PCI bus order); CUDA's default order is fastest first.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "FFDL_GPUS": str(manifest.gpus * len(placement.learners)),
        # Which attempt a batch told while it runs belongs to (``ffdl.sdk.batch_file``).
        "FFDL_ATTEMPT": str(attempt),
    }
    runtime = job_runtime(platform, job_id, manifest)
    env["PATH"] = runtime_path(runtime, settings.learner_path)
    if runtime.built:
        env["VIRTUAL_ENV"] = str(runtime.env_dir)
    num_learners = len(placement.learners)
    env.update(
        ffdl_variables(job_id, manifest, learner, num_learners, dirs, sandboxed=settings.sandbox)
    )
    if len(placement.learners) > 1 and master_port is not None:
        same_node = [lp.learner for lp in placement.learners if lp.node == me.node]
        env.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master_port),
                "WORLD_SIZE": str(len(placement.learners)),
                "RANK": str(learner - 1),
                "LOCAL_RANK": str(sorted(same_node).index(learner)),
            }
        )
    env.update(
        batch_variables(
            manifest,
            manifest.gpus * num_learners,
            batch_size,
            me.gpu_type or (node.gpu_type if node is not None else None),
        )
    )
    data: list[DataMount] = []
    volume: str | None = None
    store = manifest.data_store()
    # The store's paths are checked again here: a link may have appeared since submit.
    source = training_data_path(settings, manifest)
    if store is not None and source is not None:
        data.append(DataMount(kind=store.type, source=str(source), target=str(dirs.data)))
        if store.type == "mount_volume":
            volume = str(source)
    results_target = results_path(settings, manifest, job_id) if learner == 1 else None
    # Object stores: data downloaded from the bucket; results, logs and checkpoints kept
    # under <results bucket>/<training id>/ (credentials opened only for the spec).
    data_objects, results_store = learner_locations(
        settings, platform.credentials, manifest, job_id
    )
    if data_objects is not None:
        data.append(
            DataMount(
                kind=OBJECT_STORE_KIND,
                source=f"s3://{data_objects.root}",
                target=str(dirs.data),
                store=data_objects,
            )
        )
    groups = {}
    metrics_settings = manifest.evaluation_metrics
    if metrics_settings is not None:
        groups = {name: group.model_dump() for name, group in metrics_settings.groups.items()}
    sandbox = learner_sandbox(
        platform,
        job_id,
        learner=learner,
        attempt=attempt,
        num_learners=len(placement.learners),
        gpu_ids=me.gpu_ids if real_gpus else (),
        memory_mb=manifest.memory_mb,
        cpus=manifest.cpus,
        dirs=dirs,
        volume=volume,
        runtime_paths=runtime_read_only(runtime, settings.home),
        programs=runtime_programs(runtime),
    )
    env.update(pip_settings(runtime, sandbox))
    others, api_only = _other_replicas(platform)
    return LearnerSpec(
        training_id=job_id,
        learner=learner,
        num_learners=len(placement.learners),
        attempt=attempt,
        api_url=settings.learner_api_url,
        # ``report_urls`` is what this version's controllers use; ``fallback_urls`` keeps
        # fail-over for a controller of an older version reading the same spec.
        fallback_urls=others,
        report_urls=report_addresses(
            settings.learner_api_url, others, f"{job_id}/{learner}", api_only
        ),
        ca_pem=learner_ca_pem(settings),
        job_token=platform.job_tokens.issue(job_id),
        command=manifest.framework.command,
        workdir=str(dirs.code),
        env=env,
        data=data,
        results_source=str(dirs.results),
        results_target=str(results_target) if results_target else None,
        emetrics_file=str(dirs.logs(learner) / "emetrics.jsonl"),
        metric_groups=groups,
        metrics_type=metrics_settings.type if metrics_settings else None,
        metrics_in=metrics_settings.in_ if metrics_settings else None,
        metrics_line_lookahead=metrics_settings.line_lookahead if metrics_settings else None,
        state_dir=str(dirs.controller(learner, attempt)),
        sandbox=sandbox,
        halt_grace_s=settings.halt_grace_s,
        heartbeat_s=settings.heartbeat_s,
        report_deadline_s=settings.report_deadline_s,
        gpu_sample_s=settings.gpu_sample_s if real_gpus else None,
        nvml_library=None if settings.nvml_library is None else str(settings.nvml_library),
        runtime=runtime,
        log_dir=str(dirs.logs(learner)),
        results_store=results_store,
        checkpoint_dir=str(dirs.checkpoints) if results_store is not None else None,
        code_archive=str(dirs.archive) if results_store is not None and learner == 1 else None,
    )


def report_addresses(
    own: str, others: list[str], learner_key: str, api_only: list[str] | None = None
) -> list[str]:
    """Where a learner reports, in order: first the replica it is given by a stable hash
    of ``learner_key`` over every live replica, then the others, in turn (its fail-overs).

    Spread so that the replicas share the learners' reports: a replica that deployed every
    learner it would otherwise take every report, while the others stood by. Where the
    replicas advertise one address (a load balancer before them) there is nothing to spread.
    Where some replicas serve the API only (``api_only``), the hash spreads the learners
    over those, and the replicas that run the loops come last, as fail-overs only: the
    loops' processes are kept free of reports.
    """
    everyone = list(dict.fromkeys([own, *others]))
    first_choices = list(dict.fromkeys(api_only or [])) or everyone
    first = zlib.crc32(learner_key.encode()) % len(first_choices)
    turn = first_choices[first:] + first_choices[:first]
    return list(dict.fromkeys([*turn, *everyone]))


def _other_replicas(platform: Platform) -> tuple[list[str], list[str]]:
    """The other live replicas' addresses (besides this replica's own), and those of them
    that serve the API only."""
    own = platform.settings.learner_api_url
    alive = timedelta(seconds=3 * platform.settings.lease_ttl_s)
    with platform.store.read() as session:
        urls, api_only = live_replica_urls(session, now=utcnow(), alive_within=alive)
    return [url for url in urls if url != own], [url for url in api_only if url != own]


def _learner(session: Session, job_id: str, index: int, attempt: int) -> Learner | None:
    return session.scalars(
        select(Learner).where(
            Learner.job_id == job_id, Learner.index == index, Learner.attempt == attempt
        )
    ).first()


def _add_learner_row(
    session: Session, job_id: str, index: int, attempt: int, node: str, gpu_ids: tuple[int, ...]
) -> None:
    if _learner(session, job_id, index, attempt) is None:
        session.add(
            Learner(
                job_id=job_id,
                index=index,
                attempt=attempt,
                status=LearnerStatus.PENDING.value,
                node=node,
                gpu_ids=list(gpu_ids),
                updated_at=utcnow(),
            )
        )


def _fail(platform: Platform, job_id: str, reason: str, code: str) -> None:
    with platform.store.write() as session:
        job = session.get(Job, job_id)
        if job is not None:
            with contextlib.suppress(IllegalTransition):
                set_job_status(session, job, JobStatus.FAILED, reason, error_code=code)
    platform.wakeups.notify("monitor", "scheduler")


# -- halt, cancel, requeue ------------------------------------------------------------------


def _live_learners(platform: Platform, job_id: str) -> list[tuple[int, dict[str, object]]]:
    with platform.store.read() as session:
        job = session.get(Job, job_id)
        if job is None:
            return []
        return [
            (lr.index, dict(lr.handle or {}))
            for lr in current_learners(session, job)
            if LearnerStatus(lr.status) not in TERMINAL_LEARNER_STATES
        ]


def _stop_learners(platform: Platform, job_id: str, status: JobStatus, reason: str) -> bool:
    """Ask a stopping job's learners to checkpoint and exit; kill them after the grace period.

    Returns True once no learner of the current attempt runs any more (all reported, or
    killed and marked HALTED with ``reason``); False while they still have time.
    """
    step = f"{status.value.lower()}-signal"
    with platform.store.read() as session:
        job = session.get(Job, job_id)
        if job is None or job.status != status.value:
            return False
        attempt, since = job.attempt, job.status_changed_at
        signalled = step in _steps_done(session, job_id, attempt)
    launched = [(i, h) for i, h in _live_learners(platform, job_id) if h]
    if launched and not signalled:
        for _index, handle in launched:
            platform.backend.signal_halt(handle)
        with platform.store.write() as session:
            _add_step(session, job_id, attempt, step)
    overdue = utcnow() - since > timedelta(seconds=platform.settings.halt_grace_s + 10)
    if launched and not overdue:
        return False  # learners checkpoint and report HALTED; their report wakes us again
    for _index, handle in launched:
        platform.backend.kill(handle)
    _finish_learners(platform, job_id, LearnerStatus.HALTED, reason)
    return True


def halt(platform: Platform, job_id: str) -> None:
    """Stop a HALTING job's learners, then mark it HALTED (or COMPLETED if they finished)."""
    if not _stop_learners(platform, job_id, JobStatus.HALTING, "halted"):
        return
    with platform.store.write() as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.HALTING.value:
            return
        learners = current_learners(session, job)
        if learners:
            aggregate_job(session, job, learners)
        else:
            set_job_status(session, job, JobStatus.HALTED, job.reason or "halted")
    platform.wakeups.notify("scheduler")


def rescale(platform: Platform, job_id: str) -> None:
    """Checkpoint-restart a RESCALING job at its target size (see ``rescale_target``)."""
    if _stop_learners(platform, job_id, JobStatus.RESCALING, "stopped for rescale"):
        _restart_at_new_size(platform, job_id)


def _restart_at_new_size(platform: Platform, job_id: str) -> None:
    nodes = tuple(effective_nodes(platform))
    with platform.store.write() as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.RESCALING.value:
            return
        learners = current_learners(session, job)
        if any(LearnerStatus(lr.status) not in TERMINAL_LEARNER_STATES for lr in learners):
            return
        failed = [lr for lr in learners if lr.status == LearnerStatus.FAILED.value]
        if failed:
            aggregate_job_failure(session, job, failed[0])
            return
        if learners and all(lr.status == LearnerStatus.COMPLETED.value for lr in learners):
            set_job_status(session, job, JobStatus.COMPLETED, "completed before the rescale")
            return
        target = job.rescale_target or {}
        per_learner = max(job.gpus, 1)
        wanted = max(int(target.get("gpus", per_learner * job.learners)) // per_learner, 1)
        reason = str(target.get("reason") or "rescaled")
        job.learners = wanted
        if target.get("batch") is not None:
            job.batch_size = int(target["batch"])
        job.rescale_target = None
        placement = place_alone(
            session,
            job,
            wanted,
            nodes,
            platform.settings.default_placement,
            gpu_type=target.get("gpu_type"),
        )
        if placement is None:
            job.placement = None
            set_job_status(session, job, JobStatus.QUEUED, f"{reason}; waiting for resources")
        else:
            job.placement = placement.to_json()
            job.attempt += 1
            job.master_port = free_port() if wanted > 1 else None
            where = ", ".join(placement.nodes)
            set_job_status(session, job, JobStatus.PENDING, f"{reason}; placed on {where}")
    platform.wakeups.notify("lcm", "scheduler")


def cancel(platform: Platform, job_id: str) -> None:
    for _index, handle in _live_learners(platform, job_id):
        if handle:
            platform.backend.kill(handle)
    _finish_learners(platform, job_id, LearnerStatus.CANCELLED, "cancelled by user")
    with platform.store.write() as session:
        job = session.get(Job, job_id)
        if job is None:
            return
        job.desired = None
        # A job that finished on its own meanwhile keeps its own final status.
        with contextlib.suppress(IllegalTransition):
            set_job_status(session, job, JobStatus.CANCELLED, "cancelled by user")
    platform.wakeups.notify("scheduler")


def _finish_learners(platform: Platform, job_id: str, target: LearnerStatus, reason: str) -> None:
    live = _live_learners(platform, job_id)
    still_running = [
        index
        for index, handle in live
        if handle and platform.backend.poll(handle).state == LearnerState.RUNNING
    ]
    with platform.store.write() as session:
        job = session.get(Job, job_id)
        if job is None:
            return
        for lr in current_learners(session, job):
            if lr.index in still_running:
                continue
            if LearnerStatus(lr.status) not in TERMINAL_LEARNER_STATES:
                set_learner_status(session, lr, target, reason)


def requeue_preempted(platform: Platform, job_ids: list[str]) -> None:
    with platform.store.write() as session:
        for job_id in job_ids:
            job = session.get(Job, job_id)
            if job is None or job.status != JobStatus.HALTED.value or job.desired != PREEMPTED:
                continue
            job.desired = None
            job.placement = None
            set_job_status(session, job, JobStatus.QUEUED, f"requeued after: {job.reason}")
    platform.wakeups.notify("scheduler")
