"""The local backend: every learner is a controller process on this host.

Controllers start in their own session so they outlive a restart of the server; the
user's command runs in the controller's process group, so killing that group takes the
whole learner down. Nodes are the real host (GPUs from ``nvidia-smi``, or CPU slots when
there are none) or the virtual nodes declared in the settings, whose learners still run
here but are accounted to their node. What it needs of the platform's configuration comes
in a ``LocalConfig`` (the server builds it from its settings).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ffdl.backends.base import BackendConfigError, Handle, LaunchRequest, LearnerState, PollResult
from ffdl.backends.gpus import detect_gpus
from ffdl.core.resources import CPU_SLOTS, Node
from ffdl.learner.cgroup_placement import CgroupParentError, Placement, discover, no_cgroup
from ffdl.learner.cgroups import LearnerCgroup
from ffdl.learner.sandbox import KILLED_HOLD_S, check_available, remove_netns_if_unused
from ffdl.learner.spec import LearnerSpec, dump_spec

log = logging.getLogger("ffdl.backends.local")

CONTROLLER_MODULE = "ffdl.learner.controller"
NO_SANDBOX_WARNING = (
    "LEARNERS ARE NOT SANDBOXED (--no-sandbox): every job runs as the platform's user and "
    "can read its database, secrets and other jobs. Use only on a trusted single-user machine."
)


@dataclass(frozen=True)
class LocalConfig:
    """What the local backend reads: the platform's home (controllers' ``HOME``), the
    ``PATH`` controllers get, whether learners are sandboxed, the declared nodes (empty:
    the real host is one node), on a host without GPUs how many CPU slots it offers (None:
    one per core), and where learners' cgroups go: under ``cgroup_parent`` when set, else
    where ``ffdl.learner.cgroup_placement`` finds room; none at all with ``learner_cgroups``
    off (the controllers then watch their learners' memory)."""

    home: str
    learner_path: str = "/usr/local/bin:/usr/bin:/bin"
    sandbox: bool = True
    nodes: tuple[Node, ...] = ()
    cpu_slots: int | None = None
    cgroup_parent: str = ""
    learner_cgroups: bool = True


class SandboxUnavailable(RuntimeError):
    """Sandboxes are on but cannot be made on this host; the message says why and what to do."""


def _host_memory_mb() -> int:
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
        return int(pages * page_size / (1024 * 1024))
    except (ValueError, OSError):
        return 8 * 1024


def _proc_alive(pid: int, marker: str) -> bool:
    """True if ``pid`` runs and is our controller (guards against pid reuse and zombies)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X") and marker in cmdline


def _controller_running(spec_path: Path) -> int | None:
    """The pid of a live controller started on ``spec_path``, if this host runs one."""
    wanted = [b"-m", CONTROLLER_MODULE.encode(), str(spec_path).encode()]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if argv[1:] == wanted and _proc_alive(int(entry.name), str(spec_path)):
            return int(entry.name)
    return None


def _with_sandbox(handle: Handle, spec: LearnerSpec) -> Handle:
    """The handle plus what ``kill`` needs to clean up after a controller that cannot."""
    sandbox = spec.sandbox
    if sandbox is not None and sandbox.privileged:
        return {
            **handle,
            "cgroup": sandbox.cgroup,
            "cgroup_parent": sandbox.cgroup_parent,
            "netns": sandbox.netns,
        }
    return handle


class LocalBackend:
    name = "local"

    def __init__(self, config: LocalConfig) -> None:
        self._config = config
        if config.sandbox and (problem := check_available()) is not None:
            raise SandboxUnavailable(
                f"cannot sandbox learners: {problem}. Install bubblewrap, or start with "
                "--no-sandbox to run learners unconfined (trusted single-user machines only)"
            )
        self._placement = self._place_cgroups()
        self._nodes = self._discover_nodes()
        # Controllers this process started, waited on so they never linger as zombies: every
        # call the loops make each pass (nodes, launch, poll, halt, kill) reaps the finished
        # ones. Loops and request threads call in at once, hence the lock.
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._children_lock = threading.Lock()

    def _place_cgroups(self) -> Placement:
        """Where learners' cgroups go on this host, made ready now (the ``ffdl/`` subtree,
        its controllers) and logged, so that a bad ``cgroup_parent`` stops the start."""
        config = self._config
        if not config.sandbox:
            return no_cgroup("learners are not sandboxed")
        if os.geteuid() != 0:
            placement = no_cgroup("the platform does not run as root")
        elif not config.learner_cgroups:
            placement = no_cgroup("learner_cgroups is off")
        else:
            try:
                placement = discover(config.cgroup_parent or None)
            except CgroupParentError as exc:
                raise BackendConfigError(str(exc)) from exc
        log.info("%s", placement.describe())
        return placement

    def learner_limits(self) -> dict[str, object]:
        if not self._config.sandbox:
            return {
                "memory": "none",
                "detail": "learners are not sandboxed: their memory and CPUs are not limited",
            }
        return self._placement.as_dict()

    def _discover_nodes(self) -> list[Node]:
        if self._config.nodes:
            return list(self._config.nodes)
        cores = os.cpu_count() or 1
        gpus = detect_gpus()
        if gpus:
            count, gpu_type = len(gpus), gpus[0].name
        else:
            count, gpu_type = self._config.cpu_slots or cores, CPU_SLOTS
        return [
            Node(
                name="local",
                gpus=count,
                cpus=float(cores),
                memory_mb=_host_memory_mb(),
                gpu_type=gpu_type,
                labels={"host": os.uname().nodename},
            )
        ]

    def nodes(self) -> list[Node]:
        self._reap_finished()
        return list(self._nodes)

    def launch(self, request: LaunchRequest) -> Handle:
        self._reap_finished()
        spec = request.spec
        state_dir = Path(spec.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        spec_path = state_dir / "spec.json"
        existing = self._running_handle(state_dir, spec_path)
        if existing is None and spec_path.exists():
            # A launcher that died between starting the controller and recording its pid
            # (its replica killed mid-deploy) left a spec and no pid: a controller may run
            # for this attempt all the same, and a second one would share its sandbox.
            existing = self._adopt_running(state_dir, spec_path)
        if existing is not None:
            return _with_sandbox(existing, spec)
        dump_spec(spec, spec_path)
        log = open(state_dir / "controller.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", CONTROLLER_MODULE, str(spec_path)],
                cwd=state_dir,
                env=self._controller_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        with self._children_lock:
            self._children[proc.pid] = proc
        (state_dir / "launched.pid").write_text(str(proc.pid))
        handle: Handle = {"pid": proc.pid, "state_dir": str(state_dir), "spec": str(spec_path)}
        return _with_sandbox(handle, spec)

    def _running_handle(self, state_dir: Path, spec_path: Path) -> Handle | None:
        pid_file = state_dir / "launched.pid"
        if not pid_file.exists():
            return None
        try:
            pid = int(pid_file.read_text().strip())
        except ValueError:
            return None
        if _proc_alive(pid, str(spec_path)) or (state_dir / "result.json").exists():
            return {"pid": pid, "state_dir": str(state_dir), "spec": str(spec_path)}
        return None

    def _adopt_running(self, state_dir: Path, spec_path: Path) -> Handle | None:
        """The handle of a controller already running ``spec_path`` that no pid file names,
        found among this host's processes, its pid recorded now; None if none runs."""
        pid = _controller_running(spec_path)
        if pid is None:
            return None
        log.info("adopting controller %d, already running %s", pid, spec_path)
        (state_dir / "launched.pid").write_text(str(pid))
        return {"pid": pid, "state_dir": str(state_dir), "spec": str(spec_path)}

    def _controller_env(self) -> dict[str, str]:
        # Controllers get a minimal environment: nothing of the server's own configuration.
        return {
            "PATH": self._config.learner_path,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "HOME": self._config.home,
        }

    def _reap_finished(self) -> None:
        """Wait for every controller that has exited (``poll`` never blocks)."""
        with self._children_lock:
            for pid, child in list(self._children.items()):
                if child.poll() is not None:
                    del self._children[pid]

    def signal_halt(self, handle: Handle) -> None:
        pid = int(handle["pid"])
        self._reap_finished()
        if _proc_alive(pid, str(handle["spec"])):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def kill(self, handle: Handle) -> None:
        pid = int(handle["pid"])
        self._reap_finished()
        if _proc_alive(pid, str(handle["spec"])):
            # The controller leads its own session and process group: kill the whole group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with self._children_lock:
            child = self._children.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        # A controller killed before it could clean up leaves its sandbox's cgroup and
        # network namespace behind; whatever still runs in them ends here.
        if handle.get("cgroup"):
            parent = str(handle.get("cgroup_parent") or "")
            LearnerCgroup.existing(str(handle["cgroup"]), parent).remove()
        if handle.get("netns"):
            remove_netns_if_unused(str(handle["netns"]), wait_s=KILLED_HOLD_S)

    def poll(self, handle: Handle) -> PollResult:
        pid = int(handle["pid"])
        self._reap_finished()
        if _proc_alive(pid, str(handle["spec"])):
            return PollResult(LearnerState.RUNNING)
        result_file = Path(str(handle["state_dir"])) / "result.json"
        if result_file.exists():
            try:
                return PollResult(LearnerState.EXITED, json.loads(result_file.read_text()))
            except (OSError, ValueError):
                pass
        return PollResult(LearnerState.MISSING)

    def problem(self) -> str | None:
        return None  # this host is always there

    def close(self) -> None:
        pass  # controllers outlive the server; nothing else is held
