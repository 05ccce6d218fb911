"""The actor that hosts one learner on a Ray node.

``ray_driver`` starts one ``LearnerHost`` per learner and attempt, as a detached named actor
in the learner's bundle of the attempt's placement group. On its node it brings everything
the learner needs: the job's directories under the node's work root (the node label
``ffdl.work_root``, else ``RayConfig.work_root``), the code archive fetched through the API
with the job token, the spec with the control plane's paths moved onto this node, the GPUs
Ray assigned, ``MASTER_ADDR``/``MASTER_PORT`` on the node of learner 1, and the stores that
take its results (through the API, or the job's object store) and checkpoints (the job's
object store, or the platform's checkpoint store) so that another node can resume it. Then
it runs the learner controller unchanged, as a subprocess that dies with this actor (and
the controller's command dies with the controller), so that nothing outlives its node's
agent.

The host answers ``poll``, ``halt`` and ``kill`` while the controller runs. Once the
controller has ended and delivered its final report the host leaves (its actor and with it
its GPUs are released); a controller that could not deliver is kept until the platform
polls its result, or kills it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import ray

from ffdl.backends.ray_config import NODE_NAME_LABEL, RayConfig
from ffdl.core.archive import unpack_archive
from ffdl.core.jobdirs import JobDirs
from ffdl.core.status import ErrorCode, LearnerStatus
from ffdl.learner.cgroups import LearnerCgroup
from ffdl.learner.remote_files import fetch_code
from ffdl.learner.reporter import Reporter
from ffdl.learner.sandbox import (
    KILLED_HOLD_S,
    NETWORK_HOST,
    die_with_controller,
    remove_netns_if_unused,
)
from ffdl.learner.spec import (
    CONTROLLER_LOG,
    LearnerResult,
    LearnerSpec,
    ObjectLocation,
    dump_spec,
    read_result,
    rebase_spec,
    spec_from_dict,
    write_result,
)
from ffdl.learner.staging import hand_over

log = logging.getLogger("ffdl.ray.host")

WORK_ROOT_LABEL = "ffdl.work_root"
CONTROLLER_MODULE = "ffdl.learner.controller"
CODE_READY = ".code-ready"
# A host whose controller could not deliver its end waits this long for the platform.
UNDELIVERED_LINGER_S = 3600.0
# After its result was polled, a host stays this long (a second poll may come).
POLLED_LINGER_S = 30.0
# How long a host that asked Ray to kill it waits before its worker process exits anyway.
SELF_KILL_GRACE_S = 10.0


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _node_path(server_path: str) -> str:
    """The node's PATH for the learner: this interpreter's bin directory in place of the
    control plane's (the first entry of its learner path)."""
    entries = server_path.split(os.pathsep)
    own = str(Path(sys.executable).parent)
    return os.pathsep.join([own, *[e for e in entries[1:] if e != own]])


class LearnerHost:
    """One learner attempt on this node (see the module docstring)."""

    def __init__(
        self, config: dict[str, Any], spec: dict[str, Any], master: Any, peers: list[str]
    ) -> None:
        self._config = RayConfig(**config)
        context = ray.get_runtime_context()
        labels = {str(k): str(v) for k, v in context.get_node_labels().items()}
        self._node_id = context.get_node_id()
        self._node = labels.get(NODE_NAME_LABEL) or f"ray-{self._node_id[:12]}"
        self._work_root = labels.get(WORK_ROOT_LABEL) or self._config.work_root
        self._gpu_ids = [int(g) for g in ray.get_gpu_ids()]
        self._address = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        self._raw = spec
        # The address of each learner's node, in learner order (their host names point there).
        self._peers = peers
        self._learner = int(spec["learner"])
        self._num_learners = int(spec["num_learners"])
        if master is None and self._num_learners > 1:
            master = {"address": self._address, "port": _free_port(self._address)}
        self._master: dict[str, Any] | None = master
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._spec: LearnerSpec | None = None
        self._result: dict[str, Any] | None = None
        self._ended = False
        # The end reached the platform (the controller's last reports went through).
        self._delivered = False
        self._halt_requested = False
        self._killed = False
        self._polled_at: float | None = None
        self._wake = threading.Event()
        threading.Thread(target=self._supervise, name="learner-host", daemon=True).start()

    # -- what the driver asks ------------------------------------------------------------

    def ready(self) -> dict[str, Any]:
        return {
            "node": self._node,
            "node_id": self._node_id,
            "address": self._address,
            "gpu_ids": self._gpu_ids,
            "pid": os.getpid(),
            "work_root": self._work_root,
        }

    def master(self) -> dict[str, Any] | None:
        return self._master

    def poll(self) -> dict[str, Any]:
        with self._lock:
            if not self._ended:
                return {"state": "running"}
            self._polled_at = time.monotonic()
            self._wake.set()
            if self._result is None:
                return {"state": "missing", "reason": "the controller ended without a result"}
            return {"state": "exited", "result": self._result}

    def halt(self) -> None:
        with self._lock:
            self._halt_requested = True
            proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        with self._lock:
            self._killed = True
            proc = self._proc
        if proc is not None and proc.poll() is None:
            # The controller leads its own session and process group: kill the whole group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        spec = self._spec
        if spec is not None and spec.sandbox is not None and spec.sandbox.privileged:
            if spec.sandbox.cgroup:
                sandbox = spec.sandbox
                LearnerCgroup.existing(sandbox.cgroup, sandbox.cgroup_parent).remove()
            if spec.sandbox.netns is not None:
                remove_netns_if_unused(spec.sandbox.netns, wait_s=KILLED_HOLD_S)
        self._wake.set()

    # -- the learner's life on this node -------------------------------------------------------

    def _supervise(self) -> None:
        try:
            spec = self._prepare()
        except Exception as exc:
            log.exception("preparing the learner failed")
            self._end_unprepared(exc)
            return
        self._spec = spec
        self._run_controller(spec)
        self._leave_when_done()

    def _prepare(self) -> LearnerSpec:
        spec = rebase_spec(spec_from_dict(self._raw), self._config.home, self._work_root)
        spec = self._on_this_node(spec)
        dirs = JobDirs.of(Path(self._work_root) / "jobs", spec.training_id)
        sandbox = spec.sandbox
        owner = (sandbox.uid, sandbox.gid) if sandbox is not None and sandbox.privileged else None
        dirs.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        # The learners of a job on this node share its directories: one prepares them.
        with open(dirs.root / ".prepare.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            dirs.create(self._num_learners, owner)
            if not (dirs.root / CODE_READY).exists():
                fetch_code(
                    spec.api_url,
                    spec.job_token,
                    spec.training_id,
                    str(dirs.archive),
                    ca_pem=spec.ca_pem,
                )
                unpack_archive(dirs.archive, dirs.code)
                if owner is not None:
                    hand_over(str(dirs.code), *owner)
                    dirs.code.chmod(0o700)
                (dirs.root / CODE_READY).touch()
            self._forget_old_checkpoints(spec, dirs)
        return spec

    def _forget_old_checkpoints(self, spec: LearnerSpec, dirs: JobDirs) -> None:
        """With a shared checkpoint store, the store is the job's latest state: what an
        earlier attempt left on this node may be older, so each attempt starts empty here
        and the controller restores from the store."""
        stored = spec.results_store is not None or spec.checkpoint_store is not None
        marker = dirs.root / f".checkpoints-attempt-{spec.attempt}"
        if not stored or not spec.checkpoint_dir or marker.exists():
            return
        for entry in Path(spec.checkpoint_dir).glob("*"):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        marker.touch()

    def _on_this_node(self, spec: LearnerSpec) -> LearnerSpec:
        """The spec as this node runs it: Ray's GPUs, the master on learner 1's node, the
        node's own PATH, results through the API and checkpoints to a shared store."""
        config = self._config
        env = dict(spec.env)
        env["PATH"] = _node_path(env.get("PATH", config.learner_path))
        if env.get("CUDA_VISIBLE_DEVICES"):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self._gpu_ids)
        if self._master is not None:
            env["MASTER_ADDR"] = str(self._master["address"])
            env["MASTER_PORT"] = str(self._master["port"])
        sandbox = spec.sandbox
        if sandbox is not None:
            devices = [f"/dev/nvidia{g}" for g in self._gpu_ids if env.get("CUDA_VISIBLE_DEVICES")]
            sandbox = replace(sandbox, gpu_devices=[d for d in devices if os.path.exists(d)])
            if self._num_learners > 1:
                # Learners on several machines reach each other over the nodes' network,
                # and their host names name the machines they run on.
                hosts = [
                    [self._peers[i] or entry[0], *entry[1:]] if i < len(self._peers) else entry
                    for i, entry in enumerate(sandbox.hosts)
                ]
                sandbox = replace(sandbox, network=NETWORK_HOST, hosts=hosts)
        checkpoint_store = spec.checkpoint_store
        if spec.results_store is None and checkpoint_store is None and config.checkpoint_store:
            checkpoint_store = ObjectLocation(
                root=f"{config.checkpoint_store.rstrip('/')}/{spec.training_id}",
                connection=dict(config.checkpoint_store_options),
            )
        has_store = spec.results_store is not None or checkpoint_store is not None
        checkpoint_dir = spec.checkpoint_dir or env.get("CHECKPOINT_DIR")
        return replace(
            spec,
            env=env,
            sandbox=sandbox,
            results_via_api=spec.results_store is None,
            results_target=None if spec.results_store is None else spec.results_target,
            checkpoint_store=checkpoint_store,
            checkpoint_dir=checkpoint_dir if has_store else None,
            checkpoint_sync_s=config.checkpoint_sync_s if has_store else None,
        )

    def _run_controller(self, spec: LearnerSpec) -> None:
        state_dir = Path(spec.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        spec_path = state_dir / "spec.json"
        dump_spec(spec, spec_path)
        with self._lock:
            if self._killed:
                return
            with open(state_dir / CONTROLLER_LOG, "ab") as output:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", CONTROLLER_MODULE, str(spec_path)],
                    cwd=state_dir,
                    env={
                        "PATH": _node_path(self._config.learner_path),
                        "LANG": "C.UTF-8",
                        "PYTHONUNBUFFERED": "1",
                        "HOME": self._work_root,
                    },
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    # SIGKILLed by the kernel when this actor dies, whatever kills it.
                    preexec_fn=die_with_controller(),
                )
            proc, halt = self._proc, self._halt_requested
        if halt:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait()
        result = read_result(state_dir)
        with self._lock:
            self._result = asdict(result) if result is not None else None
            self._ended = True
            self._delivered = code == 0 and result is not None

    def _end_unprepared(self, error: Exception) -> None:
        """Tell the platform this learner cannot run here, as its controller would have."""
        reason = f"cannot prepare learner {self._learner} on node {self._node}: {error}"
        outcome = LearnerResult(
            LearnerStatus.FAILED, error_code=ErrorCode.DEPLOY_FAILED.value, reason=reason
        )
        raw = self._raw
        reporter = Reporter(
            api_url=str(raw["api_url"]),
            job_token=str(raw["job_token"]),
            training_id=str(raw["training_id"]),
            learner=self._learner,
            attempt=int(raw["attempt"]),
            ca_pem=raw["ca_pem"] if isinstance(raw.get("ca_pem"), str) else None,
        )
        reporter.start()
        reporter.status(outcome.status, reason=outcome.reason, error_code=outcome.error_code)
        delivered = reporter.drain(30.0)
        with contextlib.suppress(OSError, ValueError):
            state_dir = rebase_spec(spec_from_dict(raw), self._config.home, self._work_root)
            os.makedirs(state_dir.state_dir, exist_ok=True, mode=0o700)
            write_result(state_dir.state_dir, outcome)
        with self._lock:
            self._result = asdict(outcome)
            self._ended = True
            self._delivered = delivered
        self._leave_when_done()

    def _leave_when_done(self) -> None:
        """Leave once the platform has what it needs: at once when the end was delivered;
        else when the result has been polled (or the platform killed us)."""
        while True:
            with self._lock:
                delivered = self._delivered or self._killed
                polled = self._polled_at
            if delivered:
                break
            if polled is not None and time.monotonic() - polled >= POLLED_LINGER_S:
                break
            self._wake.wait(POLLED_LINGER_S if polled is not None else UNDELIVERED_LINGER_S)
            self._wake.clear()
        with contextlib.suppress(Exception):
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        # A kill of a threaded actor by itself can go unanswered, and the actor would then
        # hold its bundle (and the GPUs the platform has already given to another job) for
        # good. Its worker process exits instead: the actor never restarts, so Ray counts it
        # dead and the driver's reaper removes the placement group.
        time.sleep(SELF_KILL_GRACE_S)
        log.warning("the kill of this learner's actor was not carried out: its worker exits")
        logging.shutdown()
        os._exit(0)
