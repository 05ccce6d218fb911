"""The learner controller: the process that runs one learner's command for the platform.

Started as ``python -m ffdl.learner.controller SPEC_JSON_PATH``, it owns a learner attempt's
life: stage the data (DOWNLOADING), run the command and stream its output and metrics
(PROCESSING), copy the results (STORING: to a host path, an object store, or through the
API when the platform's disk is out of reach), keep the job's checkpoints in its store,
obey halt and cancel, and leave a final ``result.json`` in its state directory. The command
never outlives the controller: the kernel kills it when the controller dies. It imports
only the standard library and a few light ffdl modules, because it must start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from types import FrameType
from typing import TextIO

from ffdl.core.status import ErrorCode, LearnerStatus
from ffdl.learner import metrics, runtime, sandbox, staging
from ffdl.learner.attempt_lock import ALREADY_RUNNING_EXIT, claim_attempt
from ffdl.learner.batch_updates import BatchUpdates
from ffdl.learner.gpu_sampler import GpuSampler, visible_indexes
from ffdl.learner.limits import LearnerLimits, memory_text
from ffdl.learner.metric_sources import MetricSources
from ffdl.learner.output import OUTPUT_RECORD, OutputReaders, OutputRecord, TrainingLog
from ffdl.learner.processes import descendants, group_members
from ffdl.learner.reporter import CANCEL, GAVE_UP, GONE, HALT, Reporter
from ffdl.learner.spec import (
    CONTROLLER_LOG,
    PID_FILE,
    RESULT_FILE,
    DataMount,
    LearnerResult,
    LearnerSpec,
    ObjectLocation,
    SpecError,
    checkpoint_location,
    erase_spec_secrets,
    learner_checkpoint_dir,
    learner_log_dir,
    load_spec,
    report_targets,
    write_result,
)

LAST_LINES = 5
REASON_TAIL_CHARS = 500
POLL_S = 0.05
# Output may trail in from the command's children after it exits; this long, no longer
# (unless the report queue makes the readers wait: then as long as reports get delivered).
OUTPUT_DRAIN_S = 2.0
# Requests later in this order override earlier ones: a cancel beats a halt under way.
STOP_PRIORITY = {HALT: 1, GAVE_UP: 2, CANCEL: 3, GONE: 4}
# Where the report queue spills to disk, in the state directory: out of the sandbox's sight.
SPOOL_DIR = "spool"
# Where the learner's LOG_DIR (its training log) goes in the results: logs/learner-N/.
RESULT_LOGS_DIR = "logs"

logger = logging.getLogger("ffdl.learner.controller")


class HaltSignal:
    """Remembers a SIGTERM or SIGINT. Installed before anything else so that an early
    signal halts the learner instead of killing the controller; the handler only sets a
    flag, because it may interrupt the main thread while that holds a lock."""

    def __init__(self) -> None:
        self.received = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        self.received = True


def _peak_rss() -> str:
    """This process's peak resident memory, as /proc says it (``VmHWM``)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def _become_group_leader() -> None:
    """Own a process group, so that signalling "the group minus me" reaches only the
    command and what it started, never whoever launched the controller."""
    if os.getpgrp() != os.getpid():
        try:
            os.setpgid(0, 0)
        except OSError:
            logger.warning("cannot start a process group; signals reach the command only")


def _stop_outcome(request: str, detail: str) -> LearnerResult:
    if request == HALT:
        return LearnerResult(LearnerStatus.HALTED, reason="halted")
    if request == GAVE_UP:
        return LearnerResult(
            LearnerStatus.FAILED,
            error_code=ErrorCode.CONTROLLER_LOST.value,
            reason=f"reports undeliverable: {detail}",
        )
    if request == GONE:
        return LearnerResult(LearnerStatus.CANCELLED, reason=f"the job is gone ({detail})")
    return LearnerResult(LearnerStatus.CANCELLED, reason="cancelled")


class Controller:
    """One learner attempt, from staging to the final result; ``run`` returns the exit status."""

    def __init__(self, spec: LearnerSpec, halt_signal: HaltSignal) -> None:
        self.spec = spec
        self._halt_signal = halt_signal
        self.state_dir = Path(spec.state_dir)
        targets = report_targets(spec)
        self.reporter = Reporter(
            api_url=targets[0],
            job_token=spec.job_token,
            training_id=spec.training_id,
            learner=spec.learner,
            attempt=spec.attempt,
            heartbeat_s=spec.heartbeat_s,
            report_deadline_s=spec.report_deadline_s,
            spool_dir=str(self.state_dir / SPOOL_DIR),
            on_event=self._on_reporter_event,
            diagnostics=logger.warning,
            fallback_urls=targets[1:],
            ca_pem=spec.ca_pem,
            on_batch=BatchUpdates(spec, self._ffdl_log),
        )
        self._lock = threading.Lock()
        self._stop_request: str | None = None
        self._stop_detail = ""
        self._wake = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        # The last lines of output, and of stderr alone: a failure's reason ends on its error.
        self._last_lines: deque[str] = deque(maxlen=LAST_LINES)
        self._last_errors: deque[str] = deque(maxlen=LAST_LINES)
        self._training_log = TrainingLog(learner_log_dir(spec), self._ffdl_log)
        self._output_record = OutputRecord(str(self.state_dir / OUTPUT_RECORD), self._ffdl_log)
        # Taken for each output line; once closed, lines that still trickle in (from a
        # process that escaped the kill) are ignored: the final status must come last.
        self._output_lock = threading.Lock()
        self._output_closed = False
        self._metric_sources: MetricSources | None = None
        self._limits: LearnerLimits | None = None
        # This learner's hold on its job's network namespace (see sandbox.join_netns).
        self._netns_hold: int | None = None
        # The job's store (results store, else checkpoint store), whether this attempt's
        # logs already went there, and the thread keeping CHECKPOINT_DIR in it meanwhile.
        self._results_store: staging.JobStore | None = None
        self._logs_stored = False
        self._checkpoint_sync: staging.CheckpointSync | None = None
        self._attempt_lock: TextIO | None = None

    # -- stop requests --------------------------------------------------------------------

    def _on_reporter_event(self, kind: str, detail: str) -> None:
        logger.info("API event %s: %s", kind, detail)
        with self._lock:
            current = STOP_PRIORITY.get(self._stop_request or "", 0)
            if STOP_PRIORITY[kind] > current:
                self._stop_request, self._stop_detail = kind, detail
        self._wake.set()

    def _requested_stop(self) -> str | None:
        with self._lock:
            request = self._stop_request
        if request is None and self._halt_signal.received:
            return HALT
        return request

    def _wants_abort(self) -> bool:
        return self._requested_stop() in (CANCEL, GONE)

    # -- entry ----------------------------------------------------------------------------

    def run(self) -> int:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._attempt_lock = claim_attempt(self.state_dir)
        if self._attempt_lock is None:
            # Two controllers of one attempt would share its sandbox (cgroup, output) and
            # each end the other's command: the second leaves everything to the first.
            print(
                f"ffdl controller: another controller runs {self.state_dir}; leaving it be",
                file=sys.stderr,
            )
            return ALREADY_RUNNING_EXIT
        handler = logging.FileHandler(self.state_dir / CONTROLLER_LOG, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        (self.state_dir / PID_FILE).write_text(f"{os.getpid()}\n", encoding="utf-8")
        logger.info(
            "learner %d attempt %d of %s",
            self.spec.learner,
            self.spec.attempt,
            self.spec.training_id,
        )
        self.reporter.start()
        try:
            outcome = self._run_phases()
        except Exception as exc:
            logger.exception("controller failure")
            self._signal_command(signal.SIGKILL)
            outcome = LearnerResult(
                LearnerStatus.FAILED,
                error_code=ErrorCode.DEPLOY_FAILED.value,
                reason=f"controller error: {type(exc).__name__}: {exc}",
            )
        self._end_attempt_in_store(outcome)
        return self._finish(outcome)

    def _run_phases(self) -> LearnerResult:
        # Each phase returns None to go on, or how the attempt ended.
        return (
            self._download()
            or self._process()
            or self._store()
            or LearnerResult(LearnerStatus.COMPLETED, exit_code=0)
        )

    def _finish(self, outcome: LearnerResult) -> int:
        logger.info("final status %s: %s", outcome.status, outcome.reason)
        self.reporter.status(
            outcome.status,
            reason=outcome.reason,
            exit_code=outcome.exit_code,
            error_code=outcome.error_code,
        )
        self._release_sandbox()
        delivered = self.reporter.drain(self.spec.report_deadline_s + 5.0)
        if not delivered:
            logger.warning("reports were not all delivered")
        logger.info(
            "reports: %d items went through the disk spool; peak memory %s",
            self.reporter.spooled_items,
            _peak_rss(),
        )
        write_result(self.state_dir, outcome)
        (self.state_dir / PID_FILE).unlink(missing_ok=True)
        return 0 if delivered else 1

    def _status(self, status: LearnerStatus) -> None:
        logger.info("status %s", status.value)
        self.reporter.status(status.value)

    def _ffdl_log(self, text: str) -> None:
        self.reporter.log("ffdl", text)

    # -- DOWNLOADING ----------------------------------------------------------------------

    def _download(self) -> LearnerResult | None:
        self._status(LearnerStatus.DOWNLOADING)
        if (failed := self._prepare_runtime()) is not None:
            return failed
        try:
            for mount in self.spec.data:
                if (request := self._requested_stop()) is not None:
                    return _stop_outcome(request, self._stop_detail)
                if mount.kind == "mount_volume" and self.spec.sandbox is not None:
                    # The sandbox binds the volume read-only at the target itself.
                    self._ffdl_log(f"[ffdl] mounted {mount.source} at {mount.target} (read-only)")
                    continue
                if mount.kind == "mount_volume":
                    staging.link_volume(mount.source, mount.target)
                    self._ffdl_log(f"[ffdl] mounted {mount.source} at {mount.target}")
                    continue
                if mount.store is not None:
                    self._stage_objects(mount, mount.store)
                    continue
                self._ffdl_log(f"[ffdl] staging data from {mount.source} to {mount.target}")
                staging.copy_tree(
                    mount.source,
                    mount.target,
                    label="staging data",
                    progress=self._ffdl_log,
                    should_stop=lambda: self._requested_stop() is not None,
                )
                if self.spec.sandbox is not None:
                    staging.hand_over(mount.target, self.spec.sandbox.uid, self.spec.sandbox.gid)
            self._restore_checkpoints()
        except staging.StagingStopped:
            return _stop_outcome(self._requested_stop() or HALT, self._stop_detail)
        except staging.StagingError as exc:
            return LearnerResult(
                LearnerStatus.FAILED, error_code=ErrorCode.LOAD_DATA_FAILED.value, reason=str(exc)
            )
        if (request := self._requested_stop()) is not None:
            return _stop_outcome(request, self._stop_detail)
        return None

    def _prepare_runtime(self) -> LearnerResult | None:
        """Build the job's runtime environment on its first use (see ``learner.runtime``)."""
        spec = self.spec.runtime
        if spec is None:
            return None
        if not spec.built:
            self._ffdl_log(f"[ffdl] runtime {spec.name}: the platform's environment")
        try:
            runtime.ensure(spec, self._ffdl_log, lambda: self._requested_stop() is not None)
            if spec.paths and self.spec.sandbox is None:
                # Only the sandbox can show a path of the runtime's: the host's is not ours.
                listed = ", ".join(spec.paths)
                text = f"not provided, learners are not sandboxed (--no-sandbox): {listed}"
                self._ffdl_log(f"[ffdl] runtime {spec.name}: {text}")
            elif spec.paths and (missing := runtime.missing_program(spec)) is not None:
                raise runtime.RuntimeBuildError(missing)
        except runtime.RuntimeBuildStopped:
            return _stop_outcome(self._requested_stop() or HALT, self._stop_detail)
        except (runtime.RuntimeBuildError, OSError) as exc:
            reason = str(exc)
            if not isinstance(exc, runtime.RuntimeBuildError):
                reason = f"runtime {spec.name}: building its environment failed: {exc}"
            return LearnerResult(
                LearnerStatus.FAILED, error_code=ErrorCode.DEPLOY_FAILED.value, reason=reason
            )
        return None

    # -- PROCESSING -----------------------------------------------------------------------

    def _process(self) -> LearnerResult | None:
        self._status(LearnerStatus.PROCESSING)
        sources = MetricSources(self.spec, self._on_file_metric, self._on_problem)
        self._metric_sources = sources
        try:
            argv = self._command_argv()
        except (sandbox.SandboxError, OSError) as exc:
            return LearnerResult(
                LearnerStatus.FAILED,
                error_code=ErrorCode.DEPLOY_FAILED.value,
                reason=f"cannot set up the learner's sandbox: {exc}",
            )
        sources.start()
        try:
            child = subprocess.Popen(
                argv,
                cwd=self.spec.workdir if self.spec.sandbox is None else self.state_dir,
                env=self.spec.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                # SIGKILLed by the kernel if this process dies, whatever kills it.
                preexec_fn=sandbox.die_with_controller(),
            )
        except OSError as exc:
            sources.stop(tell=False)
            return LearnerResult(
                LearnerStatus.FAILED,
                error_code=ErrorCode.LOAD_MODEL_FAILED.value,
                reason=f"cannot start the command in {self.spec.workdir}: {exc}",
            )
        self._child = child
        logger.info("command started as pid %d", child.pid)
        if self._limits is not None:
            self._limits.watch_process(child.pid, lambda: self._signal_command(signal.SIGKILL))
        self._training_log.open()
        self._output_record.open()
        assert child.stdout is not None and child.stderr is not None
        readers = OutputReaders(
            [(child.stdout, "stdout"), (child.stderr, "stderr")],
            self._on_output_line,
            self.reporter.wait_for_room,
        )
        readers.start()
        self._start_checkpoint_sync()
        gpus = GpuSampler(
            visible_indexes(self.spec.env.get("CUDA_VISIBLE_DEVICES")),
            self.spec.gpu_sample_s or 0.0,
            self.reporter.gpu,
            library=self.spec.nvml_library,
        )
        gpus.start()
        try:
            exit_code, acted_on, request = self._supervise(child)
        finally:
            gpus.stop()
            if self._limits is not None:
                self._limits.stop_watching()
        logger.info("command exited with %d", exit_code)
        if self._checkpoint_sync is not None:
            self._checkpoint_sync.stop()
        self._collect_output(readers)
        sources.stop()
        self._training_log.close()
        self._output_record.close()
        return self._process_outcome(exit_code, acted_on, request)

    def _command_argv(self) -> list[str]:
        spec = self.spec.sandbox
        if spec is None:
            return ["/bin/bash", "-c", self.spec.command]
        if spec.privileged and spec.netns is not None:
            self._netns_hold = sandbox.join_netns(spec.netns)
        self._limits = LearnerLimits(spec, self._ffdl_log)
        procs = self._limits.prepare()
        home = self.spec.env.get("HOME", self.spec.workdir)
        identity = sandbox.write_identity_files(self.state_dir / "sandbox", spec, home)
        return sandbox.sandbox_argv(spec, self.spec.command, self.spec.workdir, identity, procs)

    def _release_sandbox(self) -> None:
        """End whatever is left of the sandbox and remove its cgroup and network namespace."""
        if self._limits is not None:
            self._limits.release()
        if self._netns_hold is not None:
            os.close(self._netns_hold)
            self._netns_hold = None
        spec = self.spec.sandbox
        if spec is not None and spec.privileged and spec.netns is not None:
            sandbox.remove_netns_if_unused(spec.netns)

    def _supervise(self, child: subprocess.Popen[bytes]) -> tuple[int, str | None, str | None]:
        """Wait for the command while obeying stop requests.

        Returns the exit code, the request acted on (if any) and the request pending when
        the command exited.
        """
        acted_on: str | None = None
        kill_at: float | None = None
        while (exit_code := child.poll()) is None:
            request = self._requested_stop()
            if request in (CANCEL, GONE) and acted_on not in (CANCEL, GONE):
                logger.info("stop request %s: killing the command", request)
                self._signal_command(signal.SIGKILL)
                acted_on, kill_at = request, None
            elif request in (HALT, GAVE_UP) and acted_on is None:
                logger.info("stop request %s: terminating the command", request)
                self._signal_command(signal.SIGTERM)
                acted_on, kill_at = request, time.monotonic() + self.spec.halt_grace_s
            elif kill_at is not None and time.monotonic() >= kill_at:
                logger.info("command outlived the %g s grace: killing it", self.spec.halt_grace_s)
                self._signal_command(signal.SIGKILL)
                kill_at = None
            self._wake.wait(POLL_S)
            self._wake.clear()
        return exit_code, acted_on, self._requested_stop()

    def _process_outcome(
        self, exit_code: int, acted_on: str | None, request: str | None
    ) -> LearnerResult | None:
        # A request seen only together with the exit: an exit 0 finished on its own, any
        # other exit is taken as the request's doing (the platform may signal the group).
        if acted_on is None and request is not None and exit_code != 0:
            acted_on = request
        if acted_on is not None:
            outcome = _stop_outcome(acted_on, self._stop_detail)
            outcome.exit_code = exit_code
            return outcome
        if exit_code == 0:
            return None
        if self._limits is not None and self._limits.exceeded():
            limit = memory_text(self._limits.memory_bytes or 0)
            return LearnerResult(
                LearnerStatus.FAILED,
                exit_code=exit_code,
                error_code=ErrorCode.LEARNER_CRASHED.value,
                reason=(
                    f"learner {self.spec.learner} exceeded its memory limit of {limit} "
                    f"(the manifest's memory) and was killed"
                ),
            )
        tail = " | ".join(self._last_errors or self._last_lines) or "(no output)"
        if len(tail) > REASON_TAIL_CHARS:
            tail = "..." + tail[-(REASON_TAIL_CHARS - 3) :]
        return LearnerResult(
            LearnerStatus.FAILED,
            exit_code=exit_code,
            error_code=ErrorCode.LEARNER_CRASHED.value,
            reason=(
                f"learner {self.spec.learner} exited with code {exit_code}; last lines: {tail}"
            ),
        )

    def _signal_command(self, signum: int) -> None:
        """Signal the command and everything it started."""
        own_pid = os.getpid()
        if self.spec.sandbox is not None and self._child is not None:
            # The child is bwrap's monitor, outside the sandbox: a signal to it would end
            # the sandbox at once, so a halt goes to the processes inside only; a kill ends
            # the monitor too, and with it the sandbox's PID namespace.
            targets = descendants(self._child.pid)
            if self._limits is not None:
                targets |= self._limits.members()
            if signum == signal.SIGKILL:
                self._child.send_signal(signum)
            targets -= {own_pid, self._child.pid}
        else:
            # Our process group, minus us.
            targets = group_members(own_pid) - {own_pid} if os.getpgrp() == own_pid else set()
            if self._child is not None:
                # Popen skips a child it has already reaped, so a reused pid is never hit.
                self._child.send_signal(signum)
                targets.discard(self._child.pid)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def _collect_output(self, readers: OutputReaders) -> None:
        readers.join(OUTPUT_DRAIN_S)
        # Whatever the command left behind dies with it, as in a container.
        self._signal_command(signal.SIGKILL)
        killed_at = time.monotonic()
        # Every line read goes out before the final status. Readers waiting for room in the
        # report queue are waited for as long as that takes (the reporter delivers or gives
        # up); readers waiting for output are not, once none came for a while since the kill
        # (a process that escaped it may hold the pipe open).
        while readers.alive():
            readers.join(POLL_S)
            quiet_s = min(readers.idle_s(), time.monotonic() - killed_at)
            if self.reporter.waiting_producers == 0 and quiet_s >= OUTPUT_DRAIN_S:
                logger.warning("output pipes still open; no longer read")
                break
        with self._output_lock:
            self._output_closed = True

    def _on_output_line(self, stream: str, text: str) -> None:
        with self._output_lock:
            if self._output_closed:
                return
            # Queued and recorded under this one lock, in the same order: the record's
            # first k lines are the first k output lines the server gets.
            self.reporter.log(stream, text)
            self._output_record.write(stream, text)
            self._training_log.write(text)
            if text.strip():
                self._last_lines.append(text.strip())
                if stream == "stderr":
                    self._last_errors.append(text.strip())
            matched = self._metric_sources.feed(text) if self._metric_sources else []
            for metric in matched:
                self.reporter.emetric(metric.group, metric.iteration, metric.values)

    def _on_problem(self, problem: str) -> None:
        self._ffdl_log(f"[ffdl] {problem}")

    def _on_file_metric(self, metric: metrics.EMetric) -> None:
        self.reporter.emetric(metric.group, metric.iteration, metric.values, at=metric.time)

    # -- STORING --------------------------------------------------------------------------

    def _store(self) -> LearnerResult | None:
        if self.spec.results_store is not None:
            return self._store_objects()
        if self.spec.results_via_api:
            return self._store_through_api()
        target = self.spec.results_target
        if not target:
            return None
        self._status(LearnerStatus.STORING)
        source = self.spec.results_source
        try:
            if source and os.path.exists(source):
                staging.copy_tree(
                    source,
                    target,
                    label="storing results",
                    progress=self._ffdl_log,
                    should_stop=self._wants_abort,
                )
            else:
                os.makedirs(target, exist_ok=True)
                self._ffdl_log(f"[ffdl] storing results: no results in {source}")
        except staging.StagingStopped:
            return _stop_outcome(self._requested_stop() or CANCEL, self._stop_detail)
        except (staging.StagingError, OSError) as exc:
            return LearnerResult(
                LearnerStatus.FAILED,
                exit_code=0,
                error_code=ErrorCode.STORE_RESULTS_FAILED.value,
                reason=f"storing results failed: {exc}",
            )
        self._store_logs(target)
        if self._wants_abort():
            return _stop_outcome(self._requested_stop() or CANCEL, self._stop_detail)
        return None

    def _store_logs(self, target: str) -> None:
        """Put the learner's LOG_DIR, with its whole training log, beside the results; the
        results stand without it, so a failure is only told."""
        log_dir = learner_log_dir(self.spec)
        if not log_dir or not os.path.isdir(log_dir):
            return
        destination = os.path.join(target, RESULT_LOGS_DIR, f"learner-{self.spec.learner}")
        with contextlib.suppress(staging.StagingStopped):
            try:
                # Links are never followed: the directory is the job's to fill.
                staging.copy_tree(
                    log_dir,
                    destination,
                    label="storing logs",
                    progress=self._ffdl_log,
                    should_stop=self._wants_abort,
                )
            except (staging.StagingError, OSError) as exc:
                self._ffdl_log(f"[ffdl] storing logs failed: {exc}")

    def _store_through_api(self) -> LearnerResult | None:
        """Results (learner 1) and this learner's LOG_DIR to the API, which puts them where
        the copy above would have (the platform's disk is out of this machine's reach)."""
        # Imported here: zipfile and http.client would slow every controller's start.
        from ffdl.learner import remote_files

        self._status(LearnerStatus.STORING)
        spec = self.spec
        try:
            remote_files.upload_results(
                spec.api_url,
                spec.job_token,
                spec.training_id,
                spec.learner,
                spec.results_source if spec.learner == 1 else None,
                learner_log_dir(spec),
                self._ffdl_log,
                scratch=str(self.state_dir),
                should_stop=self._wants_abort,
                ca_pem=spec.ca_pem,
            )
        except staging.StagingStopped:
            return _stop_outcome(self._requested_stop() or CANCEL, self._stop_detail)
        except (remote_files.RemoteFileError, staging.StagingError, OSError) as exc:
            return LearnerResult(
                LearnerStatus.FAILED,
                exit_code=0,
                error_code=ErrorCode.STORE_RESULTS_FAILED.value,
                reason=f"storing results failed: {exc}",
            )
        return None

    # -- object stores (results, logs and checkpoints under <bucket>/<training id>/) --------

    def _stage_objects(self, mount: DataMount, location: ObjectLocation) -> None:
        self._ffdl_log(f"[ffdl] downloading data from {mount.source} to {mount.target}")
        staging.download_objects(
            staging.object_store(location),
            "",
            mount.target,
            label="downloading data",
            progress=self._ffdl_log,
            should_stop=lambda: self._requested_stop() is not None,
        )
        if self.spec.sandbox is not None:
            staging.hand_over(mount.target, self.spec.sandbox.uid, self.spec.sandbox.gid)

    def _job_store(self) -> staging.JobStore | None:
        """The job's results store, else its checkpoint store (checkpoints only)."""
        location = checkpoint_location(self.spec)
        if location is None:
            return None
        if self._results_store is None:
            self._results_store = staging.JobStore(
                location,
                self.spec.learner,
                self._ffdl_log,
                str(self.state_dir),
                checkpoints_only=self.spec.results_store is None,
            )
        return self._results_store

    def _restore_checkpoints(self) -> None:
        """Bring back the job's checkpoints from the store when this host has none."""
        if (store := self._job_store()) is not None:
            sandboxed = self.spec.sandbox
            owner = (sandboxed.uid, sandboxed.gid) if sandboxed is not None else None
            store.restore_checkpoints(
                learner_checkpoint_dir(self.spec),
                owner,
                lambda: self._requested_stop() is not None,
            )

    def _start_checkpoint_sync(self) -> None:
        """Learner 1 keeps the store's checkpoints current while the command runs."""
        interval, source = self.spec.checkpoint_sync_s, learner_checkpoint_dir(self.spec)
        store = self._job_store()
        if self.spec.learner == 1 and interval and source and store is not None:
            self._checkpoint_sync = staging.CheckpointSync(store, source, interval, self._ffdl_log)
            self._checkpoint_sync.start()

    def _store_objects(self) -> LearnerResult | None:
        """Results (learner 1) and this learner's logs to ``<bucket>/<training id>/``."""
        self._status(LearnerStatus.STORING)
        store = self._job_store()
        assert store is not None
        try:
            store.store_results(self.spec.results_source, self._wants_abort)
        except staging.StagingStopped:
            return _stop_outcome(self._requested_stop() or CANCEL, self._stop_detail)
        except staging.StagingError as exc:
            return LearnerResult(
                LearnerStatus.FAILED,
                exit_code=0,
                error_code=ErrorCode.STORE_RESULTS_FAILED.value,
                reason=f"storing results failed: {exc}",
            )
        store.store_logs_and_code(
            learner_log_dir(self.spec), self.spec.code_archive, self._wants_abort
        )
        self._logs_stored = True
        if self._wants_abort():
            return _stop_outcome(self._requested_stop() or CANCEL, self._stop_detail)
        return None

    def _end_attempt_in_store(self, outcome: LearnerResult) -> None:
        """However the attempt ended (unless cancelled): a failed or halted attempt's logs go
        to the store too, and learner 1 saves CHECKPOINT_DIR so that a later attempt on any
        machine can resume."""
        if self._checkpoint_sync is not None:
            self._checkpoint_sync.stop()
        store = self._job_store()
        if store is None or str(outcome.status) == LearnerStatus.CANCELLED.value:
            return
        if not self._logs_stored:
            store.store_logs_and_code(
                learner_log_dir(self.spec), self.spec.code_archive, self._wants_abort
            )
        store.save_checkpoints(learner_checkpoint_dir(self.spec), self._wants_abort)


def fail_without_spec(spec_path: str, error: Exception) -> int:
    """Report S101 for a spec that cannot be used, as far as its readable parts allow."""
    failed = LearnerResult(
        LearnerStatus.FAILED,
        error_code=ErrorCode.DEPLOY_FAILED.value,
        reason=f"bad learner spec: {error}",
    )
    print(f"ffdl controller: {failed.reason}", file=sys.stderr)
    try:
        raw = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = None
    raw = raw if isinstance(raw, dict) else {}
    deadline = raw.get("report_deadline_s")
    deadline = float(deadline) if isinstance(deadline, int | float) and deadline > 0 else 600.0
    delivered = False
    with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
        reporter = Reporter(
            api_url=raw["api_url"],
            job_token=raw["job_token"],
            training_id=str(raw["training_id"]),
            learner=int(raw["learner"]),
            attempt=int(raw.get("attempt", 0)),
            report_deadline_s=deadline,
            ca_pem=raw.get("ca_pem") if isinstance(raw.get("ca_pem"), str) else None,
        )
        reporter.start()
        reporter.status(failed.status, reason=failed.reason, error_code=failed.error_code)
        delivered = reporter.drain(deadline + 5.0)
    state_dir = raw.get("state_dir")
    if not isinstance(state_dir, str) or not state_dir:
        state_dir = os.path.dirname(os.path.abspath(spec_path))
    try:
        os.makedirs(state_dir, exist_ok=True, mode=0o700)
        write_result(state_dir, failed)
    except OSError as exc:
        print(f"ffdl controller: cannot write {RESULT_FILE}: {exc}", file=sys.stderr)
    return 0 if delivered else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ffdl.learner.controller",
        description="Run one learner of an ffdl training job and report to the API.",
    )
    parser.add_argument("spec", help="path of the learner spec (JSON)")
    args = parser.parse_args(argv)
    halt_signal = HaltSignal()
    halt_signal.install()
    _become_group_leader()
    try:
        spec = load_spec(args.spec)
        # From here on the store's credentials live in this process's memory only.
        erase_spec_secrets(args.spec)
        controller = Controller(spec, halt_signal)
    except (SpecError, ValueError) as exc:
        return fail_without_spec(args.spec, exc)
    try:
        return controller.run()
    except Exception as exc:
        # Reached only when the state directory itself is unusable: nothing to report to.
        print(f"ffdl controller: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
