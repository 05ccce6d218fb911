"""Jobs that try to escape, run as a hostile user would, against a real sandboxed platform.

Every test submits a real job through a real server; the learner runs under the real
bubblewrap sandbox. Each hostile job writes what it managed to do into ``RESULT_DIR``
(JSON), and each test asserts that the attempt failed and that its victim is untouched.
The suite runs as root, as CI does: the full sandbox (own uid, cgroups) needs it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ffdl.learner.cgroups import LearnerCgroup
from tests.integration.live import (
    LiveServer,
    job_pids,
    manifest_yaml,
    pid_alive,
    serving,
    wait_for,
)

PROBE = """
import json, os, sys
found = {}

def attempt(name, action):
    try:
        found[name] = {"ok": True, "value": action()}
    except Exception as exc:
        found[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

def save():
    with open(os.path.join(os.environ["RESULT_DIR"], "probe.json"), "w") as out:
        json.dump(found, out)
"""

VICTIM = """
import os, pathlib, time
pathlib.Path(os.environ["RESULT_DIR"], "victim.txt").write_text("untouched")
pathlib.Path(os.environ["MODEL_DIR"], "ready").write_text("yes")
while True:
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path_factory.mktemp("sandbox") / "home")) as live:
        yield live


def run_probe(server: LiveServer, body: str, **manifest: Any) -> tuple[str, dict[str, Any]]:
    """Run a hostile job to the end; return its id and what it reported."""
    job_id = server.submit_ok(
        manifest_yaml("python probe.py", **manifest), {"probe.py": PROBE + body + "\nsave()\n"}
    )
    model = server.wait_status(job_id, {"COMPLETED"}, timeout=90)
    report = Path(model["results"]["location"]) / "probe.json"
    return job_id, json.loads(report.read_text())


def start_victim(server: LiveServer) -> tuple[str, Path]:
    job_id = server.submit_ok(manifest_yaml("python victim.py"), {"victim.py": VICTIM})
    server.wait_status(job_id, {"PROCESSING"})
    job_dir = server.home / "jobs" / job_id
    wait_for(lambda: (job_dir / "code" / "ready").exists(), what="the victim to start")
    return job_id, job_dir


def stop(server: LiveServer, job_id: str) -> None:
    server.client.patch(f"/v1/models/{job_id}", json={"status": "cancel"})
    server.wait_status(job_id, {"CANCELLED"})


def test_the_platform_files_are_not_in_the_sandbox(server: LiveServer) -> None:
    secrets = {
        name: server.home / name for name in ("ffdl.db", "client.json", "secret.key", "config.yaml")
    }
    before = {name: path.read_bytes() for name, path in secrets.items() if name != "ffdl.db"}
    body = f"""
for name, path in {json.dumps({k: str(v) for k, v in secrets.items()})}.items():
    attempt("read " + name, lambda path=path: open(path, "rb").read(64).hex())
    attempt("write " + name, lambda path=path: open(path, "ab").write(b"x"))
attempt("list home", lambda: os.listdir({str(server.home)!r}))
attempt("list jobs", lambda: os.listdir({str(server.home / "jobs")!r}))
attempt("uid", lambda: (os.getuid(), os.getgid(), os.getgroups()))
attempt("caps", lambda: [l for l in open("/proc/self/status") if l.startswith("CapEff")][0])
attempt("home", lambda: os.environ["HOME"])
"""
    job_id, found = run_probe(server, body)
    for name in secrets:
        assert not found[f"read {name}"]["ok"], found[f"read {name}"]
        assert not found[f"write {name}"]["ok"], found[f"write {name}"]
    # Only the path leading to the job's own directories exists in its filesystem.
    assert found["list home"]["value"] == ["jobs"]
    assert found["list jobs"]["value"] == [job_id]
    uid, gid, groups = found["uid"]["value"]
    assert uid not in (0, os.getuid()) and gid != 0 and groups in ([], [gid])
    assert found["caps"]["value"].split()[1] == "0000000000000000"
    assert not found["home"]["value"].startswith(str(server.home) + "/client")
    for name, content in before.items():
        assert secrets[name].read_bytes() == content


def test_platform_files_are_private_and_job_directories_belong_to_the_job(
    server: LiveServer,
) -> None:
    for name in ("ffdl.db", "ffdl.db-wal", "client.json", "secret.key", "config.yaml"):
        assert (server.home / name).stat().st_mode & 0o777 == 0o600, name
    assert server.home.stat().st_mode & 0o777 == 0o700
    job_id, _found = run_probe(server, "")
    job_dir = server.home / "jobs" / job_id
    uid = int((job_dir / "sandbox-uid").read_text())
    assert (job_dir.stat().st_uid, job_dir.stat().st_mode & 0o777) == (0, 0o700)
    for name in ("code", "results", "checkpoints", "state", "home", "logs/learner-1"):
        info = (job_dir / name).stat()
        assert (info.st_uid, info.st_mode & 0o777) == (uid, 0o700), name
    controller_dir = next((job_dir / "learners").rglob("spec.json")).parent
    assert controller_dir.stat().st_uid == 0
    assert (controller_dir / "spec.json").stat().st_mode & 0o777 == 0o600


def test_another_jobs_directories_can_be_neither_read_nor_written(server: LiveServer) -> None:
    victim, victim_dir = start_victim(server)
    try:
        body = f"""
attempt("list code", lambda: os.listdir({str(victim_dir / "code")!r}))
attempt("read code", lambda: open({str(victim_dir / "code" / "victim.py")!r}).read())
attempt("write code", lambda: open({str(victim_dir / "code" / "victim.py")!r}, "a").write("#"))
attempt("read result", lambda: open({str(victim_dir / "results" / "victim.txt")!r}).read())
attempt("list learners", lambda: os.listdir({str(victim_dir / "learners")!r}))
"""
        _job, found = run_probe(server, body)
        assert not any(entry["ok"] for entry in found.values()), found
        assert (victim_dir / "results" / "victim.txt").read_text() == "untouched"
        assert "#" not in (victim_dir / "code" / "victim.py").read_text()
        assert server.status(victim) == "PROCESSING"
    finally:
        stop(server, victim)


def test_no_token_is_visible_anywhere_in_the_sandbox(server: LiveServer) -> None:
    body = """
import re
seen = []
attempt("environ", lambda: dict(os.environ))
# The Python environment is the platform's public code; everything else is read.
skip = ("/proc", "/sys", "/usr", "/dev", sys.prefix, sys.base_prefix, *sys.path[1:])
for root, dirs, files in os.walk("/"):
    if root.startswith(tuple(p for p in skip if p)):
        dirs[:] = []
        continue
    for name in files:
        path = os.path.join(root, name)
        try:
            with open(path, "rb") as fh:
                seen.append(path + " " + fh.read(100_000).decode("latin-1"))
        except OSError:
            pass
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for part in ("environ", "cmdline"):
            try:
                seen.append(open(f"/proc/{pid}/{part}", "rb").read().decode("latin-1"))
            except OSError:
                pass
with open(os.path.join(os.environ["RESULT_DIR"], "seen.txt"), "w") as out:
    out.write("\\n".join(seen))
"""
    job_id, found = run_probe(server, body, memory="2GiB")
    spec = next((server.home / "jobs" / job_id / "learners").rglob("spec.json"))
    job_token = json.loads(spec.read_text())["job_token"]
    seen = (Path(server.model(job_id)["results"]["location"]) / "seen.txt").read_text()
    assert len(seen) > 1000  # the walk did read the job's own files and the system's /etc
    assert job_token not in seen
    assert server.token not in seen
    assert job_token not in json.dumps(found["environ"])
    assert not any(key.startswith("FFDL_TOKEN") for key in found["environ"]["value"])


def test_the_api_and_host_ports_cannot_be_reached(server: LiveServer) -> None:
    accepted: list[Any] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        stop_accepting = threading.Event()

        def accept() -> None:
            while not stop_accepting.is_set():
                try:
                    accepted.append(listener.accept())
                except TimeoutError:
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        port = listener.getsockname()[1]
        body = f"""
import socket, urllib.request
attempt("api", lambda: urllib.request.urlopen({server.url + "/health"!r}, timeout=3).read())
attempt("port", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3).close())
attempt("interfaces", lambda: os.listdir("/sys/class/net"))
"""
        _job, found = run_probe(server, body)
        stop_accepting.set()
        thread.join()
    assert not found["api"]["ok"], found["api"]
    assert not found["port"]["ok"], found["port"]
    assert accepted == []


def test_other_learners_can_be_neither_seen_nor_signalled(server: LiveServer) -> None:
    victim, _victim_dir = start_victim(server)
    try:
        victim_pids = job_pids(victim)
        assert victim_pids
        body = f"""
attempt("processes", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
for pid in {sorted(victim_pids)!r}:
    attempt(f"kill {{pid}}", lambda pid=pid: os.kill(pid, 9))
"""
        _job, found = run_probe(server, body)
        assert max(found["processes"]["value"]) < 100  # its own PID namespace only
        assert not any(v["ok"] for k, v in found.items() if k.startswith("kill")), found
        assert all(pid_alive(pid) for pid in victim_pids)
        assert server.status(victim) == "PROCESSING"
    finally:
        stop(server, victim)


DAEMONS = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        time.sleep(600)
    os._exit(0)
open(os.path.join(os.environ["MODEL_DIR"], "ready"), "w").write("yes")
while not os.path.exists(os.path.join(os.environ["JOB_STATE_DIR"], "finish")):
    time.sleep(0.05)
"""


@pytest.mark.parametrize("ending", ["completion", "halt", "cancel", "delete"])
def test_nothing_of_a_job_outlives_it(server: LiveServer, ending: str) -> None:
    job_id = server.submit_ok(manifest_yaml("python daemons.py"), {"daemons.py": DAEMONS})
    job_dir = server.home / "jobs" / job_id
    wait_for(lambda: (job_dir / "code" / "ready").exists(), what="the daemons to start")
    wait_for(lambda: len(job_pids(job_id)) >= 4, what="the command, its children and daemons")
    if ending == "completion":
        (job_dir / "state" / "finish").touch()
        server.wait_status(job_id, {"COMPLETED"})
    elif ending == "halt":
        server.client.patch(f"/v1/models/{job_id}", json={"status": "halt"})
        server.wait_status(job_id, {"HALTED"})
    elif ending == "cancel":
        server.client.patch(f"/v1/models/{job_id}", json={"status": "cancel"})
        server.wait_status(job_id, {"CANCELLED"})
    else:
        # Delete cancels a live job, waits for it to stop, then removes it.
        deleted = server.client.delete(f"/v1/models/{job_id}")
        assert deleted.status_code == 200 and deleted.json()["deleted"], deleted.text
        assert server.client.get(f"/v1/models/{job_id}").status_code == 404
    wait_for(lambda: not job_pids(job_id), timeout=15, what="every process of the job to end")
    wait_for(lambda: not _cgroups_of(job_id), timeout=15, what="the learner's cgroup removed")


def _cgroups_of(job_id: str) -> list[Path]:
    return LearnerCgroup.existing(f"ffdl-{job_id}-l1-a1").directories


def test_nothing_survives_a_killed_controller(server: LiveServer) -> None:
    job_id = server.submit_ok(manifest_yaml("python daemons.py"), {"daemons.py": DAEMONS})
    job_dir = server.home / "jobs" / job_id
    wait_for(lambda: (job_dir / "code" / "ready").exists(), what="the daemons to start")
    wait_for(lambda: len(job_pids(job_id)) >= 4, what="the command, its children and daemons")
    controller = int(next(job_dir.rglob("launched.pid")).read_text())
    os.kill(controller, signal.SIGKILL)
    wait_for(lambda: not job_pids(job_id), timeout=15, what="every process of the job to end")
    server.wait_status(job_id, {"FAILED"}, timeout=60)
    # The monitor found the controller gone: its sandbox's cgroup goes with it.
    wait_for(lambda: not _cgroups_of(job_id), timeout=15, what="the learner's cgroup removed")


def test_a_learner_over_its_memory_fails_with_its_limit(server: LiveServer) -> None:
    script = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))\n"
    job_id = server.submit_ok(manifest_yaml("python hog.py", memory="128MiB"), {"hog.py": script})
    model = server.wait_status(job_id, {"FAILED"}, timeout=60)
    status = model["training"]["training_status"]
    assert "exceeded its memory limit of 128 MiB" in status["status_message"]
    assert server.client.get("/health").status_code == 200


def test_a_result_link_to_a_host_file_is_never_followed(server: LiveServer) -> None:
    secret = (server.home / "secret.key").read_text()
    hostname = Path("/etc/hostname").read_text() if Path("/etc/hostname").exists() else None
    body = f"""
res = os.environ["RESULT_DIR"]
attempt("link host", lambda: os.symlink("/etc/hostname", os.path.join(res, "host")))
attempt("link secret", lambda: os.symlink({str(server.home / "secret.key")!r},
                                          os.path.join(res, "secret")))
attempt("link dir", lambda: os.symlink("/etc", os.path.join(res, "etc")))
open(os.path.join(res, "model.txt"), "w").write("weights")
"""
    stores = server.home / "stores"
    stores.mkdir(exist_ok=True)
    store = {
        "id": "results",
        "type": "local",
        "training_results": {"container": "trained"},
        "connection": {"path": str(stores)},
    }
    job_id, found = run_probe(server, body, data_stores=[store])
    assert Path(server.model(job_id)["results"]["location"]).is_relative_to(stores)
    assert found["link host"]["ok"]  # making a link is allowed; following it is not
    response = server.client.get(f"/v1/models/{job_id}/trained_model")
    assert response.status_code == 200
    assert secret.encode() not in response.content
    assert b"weights" in response.content or b"model.txt" in response.content
    if hostname:
        assert hostname.encode() not in response.content
    lines = [item["line"] for item in server.loglines(job_id)]
    assert any("left out host" in line for line in lines), lines


def test_a_distributed_job_rendezvouses_under_the_sandbox(server: LiveServer) -> None:
    script = """
import os, socket, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
value = torch.tensor([float(os.environ["LEARNER_ID"])])
dist.all_reduce(value)
api_reached = True
try:
    socket.create_connection(("127.0.0.1", int(os.environ["API_PORT"])), timeout=2).close()
except OSError:
    api_reached = False
print(f"sum {value.item():g} api {api_reached}", flush=True)
dist.destroy_process_group()
"""
    manifest = manifest_yaml(
        f"API_PORT={server.port} python ddp.py", learners=2, gpus=1, memory="2GiB"
    )
    job_id = server.submit_ok(manifest, {"ddp.py": script})
    server.wait_status(job_id, {"COMPLETED"}, timeout=120)
    lines = [item["line"] for item in server.loglines(job_id)]
    assert lines.count("sum 3 api False") == 2, lines
