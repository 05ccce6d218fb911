"""The learner sandbox: the command line that runs a user's command under bubblewrap.

The controller stays outside and starts the chain built by ``sandbox_argv``::

    sh (makes itself the kernel's first choice when the host runs out of memory, joins
        the learner's cgroups) → [nsenter --net=JOB_NETNS]
      → bwrap (namespaces, a filesystem of read-only system paths plus the job's own
        directories, only the pinned GPU devices, dies with the controller)
      → setpriv (the job's unprivileged uid/gid, no capabilities, no new privileges)
      → /bin/bash -c COMMAND

A runtime may place programs at paths of its own in the sandbox (FfDL's
``/opt/conda/bin/python``): each is a small script, written beside the identity files, that
``exec``s the runtime's executable, bound read-only at that path. A script rather than the
executable itself, because a virtual environment's ``python`` bound elsewhere no longer
finds its ``pyvenv.cfg``, and a symlink to it resolves to the base interpreter: either way
the environment's packages would be gone. A read-only bind takes no new mount points, so a
bind on the way to such a path (the host's ``/opt``) is made entry by entry instead.

Each link ``exec``s the next, so the controller's child is bwrap's monitor process and
bwrap's ``--die-with-parent`` ties the whole sandbox to the controller: when the
controller dies, bwrap's namespace init dies, and the kernel ends every process of the
PID namespace, whatever the user's code forked or ``setsid``-ed.

As root the platform sets the sandbox up privileged (bwrap run as root, the command
dropped to the job's uid by setpriv, per-job network namespaces for distributed jobs).
As another user, bwrap runs in a user namespace: the command keeps the operator's uid
and distributed jobs share the host network (``network="host"``).

Without a sandbox the command is tied to the controller by ``die_with_controller``: the
kernel SIGKILLs it when the controller dies (its machine's agent killed it, say).

This module uses the standard library only, because the controller must start fast.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NETWORK_NONE = "none"
NETWORK_HOST = "host"
NETNS_PREFIX = "netns:"
NETNS_DIR = "/run/netns"
# Where learners hold their job's network namespace (see ``join_netns``).
NETNS_LOCK_DIR = "/run/ffdl-netns"
# How long a learner waits for a job network namespace another learner is creating.
NETNS_READY_S = 5.0
# Mounts every sandbox makes of its own.
OWN_MOUNTS = ("/tmp", "/dev", "/proc")
# System paths every sandbox sees read-only, when the host has them.
SYSTEM_PATHS = ("/usr", "/etc", "/opt", "/sys")
# Of those, the ones a runtime may place programs in: host add-ons the sandbox itself does
# not need (FfDL's images had conda in /opt).
OPEN_SYSTEM_PATHS = ("/opt",)
# On merged-/usr systems these are symlinks into /usr and are recreated as such.
TOP_LEVEL_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Host files the sandbox must not read even though /etc is visible.
HIDDEN_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
# Character devices a CUDA process needs beside its own /dev/nvidiaN.
NVIDIA_CONTROL_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
SANDBOX_USER = "ffdl"
# The most a process can ask to be the OOM killer's choice (-1000..1000).
OOM_SCORE_ADJ = 1000


class SandboxError(Exception):
    """The sandbox cannot be set up; the message says what is missing."""


@dataclass
class SandboxSpec:
    """What one learner's sandbox is made of (part of the learner spec)."""

    uid: int
    gid: int
    # Host paths bound read-only / read-write at the same path inside.
    read_only: list[str] = field(default_factory=list)
    read_write: list[str] = field(default_factory=list)
    # (host source, path inside) bound read-only: mounted volumes at DATA_DIR.
    volumes: list[list[str]] = field(default_factory=list)
    network: str = NETWORK_NONE  # none | host | netns:NAME
    gpu_devices: list[str] = field(default_factory=list)
    memory_bytes: int | None = None
    cpus: float | None = None
    # The learner's cgroup name ("": no cgroup), made where ``ffdl.learner.cgroup_placement``
    # finds room on the host, under ``cgroup_parent`` when the operator set one.
    cgroup: str = ""
    cgroup_parent: str = ""
    privileged: bool = True  # set up as root: setpriv to uid/gid, netns, cgroups
    # (host source, path inside) bound read-write: the learner's logs at $JOB_STATE_DIR/logs.
    binds: list[list[str]] = field(default_factory=list)
    # The learner's host name, and /etc/hosts entries ([address, name, ...]) naming its peers.
    hostname: str = "learner"
    hosts: list[list[str]] = field(default_factory=list)
    # Directories inside read-only binds shown empty (the platform's packages, hidden from
    # a job running on a runtime environment of its own).
    hidden: list[str] = field(default_factory=list)
    # (host executable, path inside): programs a runtime provides at paths of its own.
    programs: list[list[str]] = field(default_factory=list)

    @property
    def netns(self) -> str | None:
        if self.network.startswith(NETNS_PREFIX):
            return self.network[len(NETNS_PREFIX) :]
        return None


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def reserved_path(path: str) -> str | None:
    """The sandbox's own mount or system path that a program at ``path`` (absolute and
    normalised) would collide with: one it is, holds, or lies in (except the open ones)."""
    if path == "/":
        return "/"
    for mount in (*OWN_MOUNTS, *SYSTEM_PATHS, *TOP_LEVEL_LINKS):
        holds = mount == path or mount.startswith(path + "/")
        inside = path.startswith(mount + "/") and mount not in OPEN_SYSTEM_PATHS
        if holds or inside:
            return mount
    return None


def check_available() -> str | None:
    """None when a sandbox can start here, else why not (run once at platform start)."""
    bwrap = bwrap_path()
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    probe = [bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--", "/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap cannot run: {exc}"
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        return f"bubblewrap cannot create namespaces here: {detail}"
    return None


def write_identity_files(directory: Path, spec: SandboxSpec, home: str) -> tuple[Path, Path]:
    """passwd and group files naming the job's uid (tools that look the user up need them),
    beside the hosts file and the scripts standing for the runtime's programs."""
    directory.mkdir(parents=True, exist_ok=True)
    passwd = directory / "passwd"
    group = directory / "group"
    passwd.write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{SANDBOX_USER}:x:{spec.uid}:{spec.gid}:ffdl job:{home}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        encoding="utf-8",
    )
    group.write_text(
        f"root:x:0:\n{SANDBOX_USER}:x:{spec.gid}:\nnogroup:x:65534:\n", encoding="utf-8"
    )
    for path in (passwd, group):
        path.chmod(0o644)
    for index, (executable, _inside) in enumerate(spec.programs):
        script = directory / "programs" / str(index)
        script.parent.mkdir(exist_ok=True)
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(executable)} "$@"\n', encoding="utf-8")
        script.chmod(0o755)
    if spec.hosts:
        hosts = directory / "hosts"
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += ["\t".join([entry[0], " ".join(entry[1:])]) for entry in spec.hosts]
        hosts.write_text("\n".join(lines) + "\n", encoding="utf-8")
        hosts.chmod(0o644)
    return passwd, group


def _mount_order(binds: Sequence[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    # Parents first, so a bind inside another bind lands on top of it.
    return sorted(binds, key=lambda bind: (bind[2].count("/"), bind[2]))


def _check_programs(spec: SandboxSpec, binds: Sequence[tuple[str, str, str]]) -> None:
    """Refuse program paths the sandbox cannot show (the platform checks them at start;
    what it cannot know then, such as where the job's directories are, is checked here):
    one that is or holds a mount, or lies where the job writes (a mount point made there
    would be made on the host)."""
    for _executable, target in spec.programs:
        clash = reserved_path(target)
        for option, _source, bound in binds:
            holds = bound == target or bound.startswith(target + "/")
            written = option == "--bind" and target.startswith(bound + "/")
            if clash is None and (holds or written):
                clash = bound
        if clash is not None:
            raise SandboxError(
                f"runtime path {target} collides with {clash}, which the sandbox mounts"
            )


def _entry_by_entry(
    source: str, target: str, routes: set[str], programs: set[str]
) -> tuple[list[str], list[str]]:
    """Show ``source`` at ``target`` as a directory of single binds rather than one, so
    that programs can be placed inside it: entries on the way to a program are shown the
    same way, a program's own place is left free. Returns the arguments and what they bind."""
    args, bound = ["--perms", "0755", "--dir", target], []
    try:
        entries = sorted(os.scandir(source), key=lambda entry: entry.name)
    except OSError:
        entries = []
    for entry in entries:
        inside = f"{target}/{entry.name}"
        if inside in programs:
            continue
        if inside in routes and entry.is_dir():
            more, more_bound = _entry_by_entry(entry.path, inside, routes, programs)
            args += more
            bound += more_bound
        elif entry.is_symlink():
            args += ["--symlink", os.readlink(entry.path), inside]
        else:
            args += ["--ro-bind", entry.path, inside]
            bound.append(inside)
    return args, bound


def _filesystem_args(spec: SandboxSpec, passwd: Path, group: Path) -> list[str]:
    args = ["--perms", "1777", "--tmpfs", "/tmp", "--dev", "/dev"]
    args += ["--perms", "1777", "--tmpfs", "/dev/shm", "--proc", "/proc"]
    for link in TOP_LEVEL_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    binds: list[tuple[str, str, str]] = [
        ("--ro-bind", path, path) for path in SYSTEM_PATHS if os.path.isdir(path)
    ]
    binds += [("--ro-bind", path, path) for path in spec.read_only]
    binds += [("--bind", path, path) for path in spec.read_write]
    binds += [("--ro-bind", source, target) for source, target in spec.volumes]
    binds += [("--bind", source, target) for source, target in spec.binds]
    _check_programs(spec, binds)
    programs = {target for _executable, target in spec.programs}
    routes = {str(parent) for target in programs for parent in Path(target).parents}
    mounted: list[str] = []
    created: set[str] = {"/", *OWN_MOUNTS}

    def make_parents(target: str) -> None:
        # Directories leading to a bind are made world-traversable (bwrap would otherwise
        # create them private to root), except where they lie inside an earlier bind.
        for ancestor in reversed(Path(target).parents):
            name = str(ancestor)
            inside = any(name == m or name.startswith(m + "/") for m in mounted)
            if name not in created and not inside:
                args.extend(["--perms", "0755", "--dir", name])
                created.add(name)

    for option, source, target in _mount_order(binds):
        make_parents(target)
        if option == "--ro-bind" and target in routes:
            more, bound = _entry_by_entry(source, target, routes, programs)
            args += more
            mounted += bound
        else:
            args += [option, source, target]
            mounted.append(target)
        created.add(target)
    for index, (_executable, target) in enumerate(spec.programs):
        make_parents(target)
        args += ["--ro-bind", str(passwd.with_name("programs") / str(index)), target]
    for path in spec.hidden:
        if os.path.isdir(path):
            args += ["--tmpfs", path]
    for hidden in HIDDEN_FILES:
        if os.path.exists(hidden):
            args += ["--ro-bind", "/dev/null", hidden]
    if os.path.isdir("/etc"):
        args += ["--ro-bind", str(passwd), "/etc/passwd", "--ro-bind", str(group), "/etc/group"]
        hosts = passwd.with_name("hosts")
        if spec.hosts and hosts.is_file() and os.path.exists("/etc/hosts"):
            args += ["--ro-bind", str(hosts), "/etc/hosts"]
    for device in spec.gpu_devices:
        args += ["--dev-bind", device, device]
    if spec.gpu_devices:
        for device in NVIDIA_CONTROL_DEVICES:
            if os.path.exists(device):
                args += ["--dev-bind", device, device]
    return args


def sandbox_argv(
    spec: SandboxSpec,
    command: str,
    workdir: str,
    identity: tuple[Path, Path],
    cgroup_procs: Sequence[str] = (),
) -> list[str]:
    """The argv that runs ``command`` (a bash command line) inside the sandbox."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxError("bubblewrap (bwrap) is not installed")
    # The shell raises its OOM score (inherited by all the sandbox runs) so that a host short
    # of memory ends a learner before the platform or anything else of the host, and joins
    # the cgroups before it becomes bwrap, so that nothing of the sandbox runs outside them.
    # No address-space limit, ever: see ``ffdl.learner.limits``.
    script = (
        f"echo {OOM_SCORE_ADJ} > /proc/self/oom_score_adj 2>/dev/null; "
        'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
    )
    argv: list[str] = ["/bin/sh", "-c", script, "ffdl-sandbox", *cgroup_procs, "--"]
    netns = spec.netns
    if netns is not None:
        argv += ["nsenter", f"--net={NETNS_DIR}/{netns}", "--"]
    argv += [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--hostname", spec.hostname or "learner"]
    if spec.network != NETWORK_HOST and netns is None:
        argv.append("--unshare-net")
    argv += _filesystem_args(spec, *identity)
    argv += ["--chdir", workdir]
    if spec.privileged:
        argv += ["--", "setpriv", f"--reuid={spec.uid}", f"--regid={spec.gid}"]
        argv += ["--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    else:
        argv += ["--cap-drop", "ALL", "--new-session"]
    argv += ["--", "/bin/bash", "-c", command]
    return argv


# prctl(2): the signal a process gets when the thread that forked it ends.
PR_SET_PDEATHSIG = 1


def die_with_controller() -> Callable[[], None] | None:
    """A ``preexec_fn`` after which the kernel SIGKILLs the child when the controller's
    thread that started it ends; None where prctl cannot be had.

    The controller starts the command from its main thread, which lives until the end, so
    the signal comes exactly when the controller dies, even by SIGKILL. It reaches the
    direct child (``bash -c``, or the first link of the sandbox chain, which passes it on
    through ``exec`` to bwrap); what the child started is bwrap's to end (its PID
    namespace) or, bare, the platform's (the controller's process group).
    """
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    controller = os.getpid()

    def preexec() -> None:
        # Runs in the forked child before exec: only the prepared C call, no imports.
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != controller:
            # The controller died before the signal was set up: no one to run for.
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


# -- per-job network namespaces (distributed jobs, privileged setup) ---------------------
#
# How long cleaning up after a killed controller waits for its hold on the namespace to go.
KILLED_HOLD_S = 5.0
#
# The learners of a job on one host share its network namespace. Each holds a shared lock on
# NETNS_LOCK_DIR/NAME from before it makes sure the namespace exists until it ends, and the
# namespace is deleted only under the exclusive lock: a learner that has ensured it but not
# entered it yet has no process in it, so ``ip netns pids`` alone would let an early-ending
# learner delete it from under the other.


def join_netns(name: str) -> int:
    """Make sure the job's network namespace exists and hold it for this learner: the
    returned file descriptor is the hold, closed when the learner ends."""
    directory = Path(NETNS_LOCK_DIR)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / name
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        # The last learner removed the namespace and its lock file meanwhile: start over.
        os.close(fd)
    try:
        ensure_netns(name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_within(fd: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def ensure_netns(name: str) -> None:
    """Create the job's network namespace with loopback up; idempotent across learners."""
    path = Path(NETNS_DIR) / name
    if not path.exists():
        done = subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False)
        # Another learner of the job may have created it first.
        if done.returncode != 0 and not path.exists():
            raise SandboxError(
                f"cannot create network namespace {name}: {done.stderr.decode().strip()}"
            )
    # Another learner's ``ip netns add`` creates the file before it mounts the namespace on
    # it; entering it in between fails ("Invalid argument"), so try again for a while.
    deadline = time.monotonic() + NETNS_READY_S
    while True:
        done = subprocess.run(
            ["ip", "-n", name, "link", "set", "lo", "up"], capture_output=True, check=False
        )
        if done.returncode == 0:
            return
        if time.monotonic() >= deadline:
            problem = done.stderr.decode().strip()
            raise SandboxError(f"cannot bring up loopback in {name}: {problem}")
        time.sleep(0.05)


def remove_netns_if_unused(name: str, wait_s: float = 0.0) -> None:
    """Delete the job's network namespace once no learner holds it and no process is in it.

    ``wait_s``: how long a hold may take to go (after killing a controller, its dying
    process still holds the namespace for a moment)."""
    lock = Path(NETNS_LOCK_DIR) / name
    try:
        fd: int | None = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None  # a namespace made before learners held them
    try:
        if fd is not None and not _lock_within(fd, wait_s):
            return  # a learner of the job holds it
        if (Path(NETNS_DIR) / name).exists():
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, check=False)
            if pids.returncode != 0 or pids.stdout.strip():
                return
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        if fd is not None:
            lock.unlink(missing_ok=True)
    finally:
        if fd is not None:
            os.close(fd)
