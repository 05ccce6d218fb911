"""The sandbox chain itself, run for real with bubblewrap: privileged (as root) and not.

The hostile-job suite (tests/security) covers the sandbox through the whole platform; these
tests pin down the chain the controller builds, and the spec's validation. They run as
root, as the platform does for full isolation (CI runs as root).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ffdl.learner.cgroups import LearnerCgroup
from ffdl.learner.sandbox import (
    KILLED_HOLD_S,
    NETNS_DIR,
    NETNS_LOCK_DIR,
    SandboxError,
    SandboxSpec,
    join_netns,
    remove_netns_if_unused,
    sandbox_argv,
    write_identity_files,
)
from ffdl.learner.spec import SpecError, _sandbox
from ffdl.server.services.sandboxing import python_paths
from tests.integration.live import wait_for

NOBODY = 65534
PROBE = (
    "id -u; id -g; hostname; grep CapEff /proc/self/status | cut -f2; "
    "cat /etc/shadow | wc -c; ls /proc | grep -c '^[0-9]'; ulimit -v; "
    "cat /proc/self/oom_score_adj; "
    "touch $PWD/written && echo wrote; touch /usr/x 2>/dev/null || echo ro"
)


def _run(
    spec: SandboxSpec, work: Path, as_user: int | None = None, procs: tuple[str, ...] = ()
) -> Any:
    identity = write_identity_files(work / "identity", spec, str(work))
    argv = sandbox_argv(spec, PROBE, str(work), identity, procs)
    if as_user is not None:
        argv = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    directory = tmp_path / "job"
    directory.mkdir()
    return directory


def test_the_privileged_chain_drops_to_the_jobs_uid_with_nothing_else(work: Path) -> None:
    os.chown(work, 212345, 212345)
    spec = SandboxSpec(uid=212345, gid=212345, read_write=[str(work)], privileged=True)
    uid, gid, host, caps, shadow, processes, vmem, oom, wrote, readonly = _run(spec, work)
    assert (uid, gid, host) == ("212345", "212345", "learner")
    assert caps == "0000000000000000"
    assert shadow == "0"
    assert int(processes) <= 5  # its own PID namespace: bash and what it runs
    assert vmem == "unlimited"  # never an address-space limit (CUDA reserves tens of GiB)
    assert oom == "1000"  # a host out of memory ends learners first
    assert (wrote, readonly) == ("wrote", "ro")
    assert (work / "written").stat().st_uid == 212345


def test_the_unprivileged_chain_keeps_its_uid_and_no_address_space_limit() -> None:
    # pytest's own temporary directories are private to root: this user needs a way in.
    with tempfile.TemporaryDirectory(dir="/tmp") as name:
        Path(name).chmod(0o755)
        work = Path(name) / "job"
        work.mkdir()
        os.chown(work, NOBODY, NOBODY)
        _check_unprivileged(work)


def _check_unprivileged(work: Path) -> None:
    spec = SandboxSpec(
        uid=NOBODY, gid=NOBODY, read_write=[str(work)], memory_bytes=512 << 20, privileged=False
    )
    uid, _gid, host, caps, _shadow, _processes, vmem, oom, wrote, readonly = _run(
        spec, work, as_user=NOBODY
    )
    assert (uid, host, caps) == (str(NOBODY), "learner", "0000000000000000")
    # The controller's watchdog holds its memory: see tests/security/test_memory_limits.py.
    assert (vmem, oom) == ("unlimited", "1000")
    assert (wrote, readonly) == ("wrote", "ro")


def test_a_learner_cgroup_holds_the_sandbox_and_is_removed(work: Path) -> None:
    os.chown(work, 212346, 212346)
    spec = SandboxSpec(uid=212346, gid=212346, read_write=[str(work)], memory_bytes=256 << 20)
    cgroup = LearnerCgroup.create(f"ffdl-test-{os.getpid()}", spec.memory_bytes, 1.0)
    try:
        assert _run(spec, work, procs=tuple(cgroup.procs_files))[0] == "212346"
        assert not cgroup.oom_killed()
        # The namespace's last processes leave the cgroup as the kernel tears it down.
        wait_for(lambda: not cgroup.members(), timeout=10, what="an empty cgroup")
    finally:
        cgroup.remove()
    assert not any(directory.exists() for directory in cgroup.directories)


def test_a_runtime_program_is_placed_in_opt_beside_what_the_host_has_there(
    work: Path, tmp_path: Path
) -> None:
    # FfDL's manifests call /opt/conda/bin/python: here it is the platform's interpreter,
    # still in its virtual environment, while the host's own /opt stays visible, read-only.
    os.chown(work, 212348, 212348)
    spec = SandboxSpec(
        uid=212348,
        gid=212348,
        read_only=python_paths(tmp_path / "home"),
        read_write=[str(work)],
        programs=[[sys.executable, "/opt/conda/bin/python"]],
    )
    probe = (
        "/opt/conda/bin/python -c 'import sys, sqlalchemy; print(sys.prefix)'; "
        "echo $(ls /opt); touch /opt/conda/bin/x 2>/dev/null || echo ro; "
        "touch /opt/conda/bin/python 2>/dev/null || echo ro"
    )
    identity = write_identity_files(tmp_path / "identity", spec, str(work))
    argv = sandbox_argv(spec, probe, str(work), identity)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    prefix, listed, *readonly = done.stdout.splitlines()
    assert prefix == sys.prefix
    host = os.listdir("/opt") if os.path.isdir("/opt") else []
    assert listed.split() == sorted([*host, "conda"])
    assert readonly == ["ro", "ro"]


@pytest.mark.parametrize(
    ("program", "read_only", "read_write", "clash"),
    [
        ("/usr/bin/python", [], [], "/usr"),
        ("/proc/python", [], [], "/proc"),
        ("/srv/a", ["/srv/a/b"], [], "/srv/a/b"),
        ("/srv/jobs/python", [], ["/srv/jobs"], "/srv/jobs"),
    ],
)
def test_a_runtime_program_colliding_with_a_mount_is_refused(
    tmp_path: Path, program: str, read_only: list[str], read_write: list[str], clash: str
) -> None:
    spec = SandboxSpec(
        uid=212349,
        gid=212349,
        read_only=read_only,
        read_write=read_write,
        programs=[["/bin/true", program]],
    )
    identity = write_identity_files(tmp_path / "identity", spec, str(tmp_path))
    with pytest.raises(SandboxError, match=f"runtime path {program} collides with {clash},"):
        sandbox_argv(spec, "true", str(tmp_path), identity)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"uid": 0, "gid": 5}, "must not be root"),
        ({"uid": 5, "gid": 5, "network": "bridge"}, "none, host or netns"),
        ({"uid": 5, "gid": 5, "read_write": ["relative"]}, "absolute paths"),
        ({"uid": 5, "gid": 5, "volumes": [["/a"]]}, "source, target"),
        ({"uid": 5, "gid": 5, "memory_bytes": "1G"}, "integer"),
        ({"uid": 5, "gid": 5, "programs": [["python", "/opt/x"]]}, "absolute paths"),
    ],
)
def test_a_bad_sandbox_spec_is_refused_naming_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _sandbox(raw)


def test_a_jobs_network_namespace_stays_while_a_learner_holds_it() -> None:
    # Two learners of one job on this host: the first ends before the second has entered
    # the namespace (no process of it is in there yet), and must not delete it.
    name = f"ffdl-test-{os.getpid()}"
    first, second = join_netns(name), join_netns(name)
    try:
        os.close(first)
        remove_netns_if_unused(name)
        assert (Path(NETNS_DIR) / name).exists()
    finally:
        os.close(second)
        remove_netns_if_unused(name)
    assert not (Path(NETNS_DIR) / name).exists()
    assert not (Path(NETNS_LOCK_DIR) / name).exists()
    # The next attempt of the job makes it anew.
    again = join_netns(name)
    try:
        assert (Path(NETNS_DIR) / name).exists()
    finally:
        os.close(again)
        remove_netns_if_unused(name)


def test_cleaning_up_after_a_killed_learner_waits_for_its_hold_to_go(tmp_path: Path) -> None:
    name = f"ffdl-test-killed-{os.getpid()}"
    ready = tmp_path / "ready"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, sys, time\n"
            "from ffdl.learner.sandbox import join_netns\n"
            "join_netns(sys.argv[1])\n"
            "pathlib.Path(sys.argv[2]).touch()\n"
            "time.sleep(60)\n",
            name,
            str(ready),
        ]
    )
    try:
        wait_for(ready.exists, timeout=30, what="the learner to hold the namespace")
        remove_netns_if_unused(name)
        assert (Path(NETNS_DIR) / name).exists(), "removed while a learner held it"
        holder.kill()
        remove_netns_if_unused(name, wait_s=KILLED_HOLD_S)
        assert not (Path(NETNS_DIR) / name).exists()
    finally:
        holder.kill()
        holder.wait()
        remove_netns_if_unused(name, wait_s=KILLED_HOLD_S)
