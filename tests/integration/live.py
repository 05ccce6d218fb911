"""A real ffdl server in a subprocess on 127.0.0.1, with factory helpers for jobs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websocket
import yaml
from websocket import ABNF

from ffdl.client.http import KEEPALIVE_S as CLIENT_KEEPALIVE_S
from ffdl.core.tls import client_context
from ffdl.learner.cgroups import LearnerCgroup
from ffdl.learner.sandbox import KILLED_HOLD_S, NETNS_PREFIX, remove_netns_if_unused

FAST_CONFIG: dict[str, Any] = {
    "scheduler_interval_s": 0.2,
    "lcm_interval_s": 0.2,
    "monitor_interval_s": 0.5,
    "heartbeat_s": 0.5,
    "heartbeat_timeout_s": 20.0,
    "halt_grace_s": 3.0,
    "report_deadline_s": 60.0,
    "nodes": [{"name": "node-a", "gpus": 4, "cpus": 16, "memory": "32GiB", "gpu_type": "cpu"}],
}
# The same without declared nodes: the local backend reports this host and its GPUs.
HOST_CONFIG: dict[str, Any] = {key: value for key, value in FAST_CONFIG.items() if key != "nodes"}
# How far apart ``wait_for``'s polls grow in a long wait.
SLOWEST_POLL_S = 0.25


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    check: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``check`` until it returns a truthy value; fail with ``what`` after ``timeout``.

    The first polls are ``interval`` apart, later ones up to ``SLOWEST_POLL_S``: a check is
    usually a request that costs the server about 10 ms of CPU, so a long wait polled every
    50 ms kept a fifth of a core busy answering it."""
    deadline = time.monotonic() + timeout
    pause = interval
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(pause * 1.5, max(interval, SLOWEST_POLL_S))
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last={last!r}")


def code_zip(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, textwrap.dedent(text))
    return buffer.getvalue()


def manifest_yaml(command: str, **extra: Any) -> str:
    doc: dict[str, Any] = {
        "name": extra.pop("name", "test-job"),
        "version": "1.0",
        "learners": 1,
        "gpus": 1,
        "cpus": 1,
        "memory": "256MiB",
        "framework": {"name": "custom", "version": "1", "command": command},
    }
    doc.update(extra)
    return yaml.safe_dump(doc)


@dataclass
class LiveServer:
    home: Path
    config: dict[str, Any] = field(default_factory=lambda: dict(FAST_CONFIG))
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    # Replicas sharing one home each keep their own log.
    log_name: str = "server.log"
    _client: httpx.Client | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.config.get("tls_cert") else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """How a client verifies this server: its ``ca_bundle``, when it serves HTTPS."""
        ca_bundle = self.config.get("ca_bundle")
        return client_context(Path(ca_bundle)) if ca_bundle else True

    @property
    def token(self) -> str:
        return str(json.loads((self.home / "client.json").read_text())["token"])

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                base_url=self.url,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=30,
                limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_S),
                verify=self.verify,
            )
        return self._client

    def argv(self) -> list[str]:
        """The server's command line."""
        server = [sys.executable, "-m", "ffdl.server.main"]
        return [*server, "--home", str(self.home), "--port", str(self.port)]

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.yaml").write_text(yaml.safe_dump(self.config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("FFDL_")}
        log = open(self.home / self.log_name, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited: {self.log_tail()}")
            try:
                health = httpx.get(f"{self.url}/health", timeout=1, verify=self.verify)
                return health.status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_for(healthy, timeout=60, what="server health")
        except BaseException:
            # A server that never became healthy is not left running behind the test.
            self.stop(signal.SIGKILL)
            raise

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill_learners(self) -> None:
        """Kill every controller this server started (they outlive the server by design),
        and remove the cgroups and network namespaces their sandboxes leave behind."""
        for pid_file in (self.home / "jobs").glob("*/learners/*/*/launched.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                sandbox = json.loads((pid_file.parent / "spec.json").read_text())["sandbox"]
                if sandbox and sandbox.get("privileged"):
                    parent = str(sandbox.get("cgroup_parent") or "")
                    LearnerCgroup.existing(str(sandbox["cgroup"]), parent).remove()
                    network = str(sandbox.get("network", ""))
                    if network.startswith(NETNS_PREFIX):
                        remove_netns_if_unused(network[len(NETNS_PREFIX) :], wait_s=KILLED_HOLD_S)

    def log_tail(self, n: int = 40) -> str:
        path = self.home / self.log_name
        return "\n".join(path.read_text().splitlines()[-n:]) if path.exists() else ""

    # -- jobs ------------------------------------------------------------------------------

    def submit(
        self, manifest: str, files: dict[str, str] | None = None, token: str | None = None
    ) -> httpx.Response:
        """Submit as the admin, or as the user of ``token``."""
        archive = code_zip(files or {"README": "no code"})
        upload = {
            "manifest": ("manifest.yml", manifest.encode(), "application/x-yaml"),
            "model_definition": ("model.zip", archive, "application/zip"),
        }
        if token is None:
            return self.client.post("/v1/models", files=upload)
        return httpx.post(
            f"{self.url}/v1/models",
            headers={"Authorization": f"Bearer {token}"},
            files=upload,
            verify=self.verify,
            timeout=30,
        )

    def submit_ok(
        self, manifest: str, files: dict[str, str] | None = None, token: str | None = None
    ) -> str:
        response = self.submit(manifest, files, token)
        assert response.status_code == 201, response.text
        return str(response.json()["model_id"])

    def job_total(self) -> int:
        """How many jobs the administrator's list counts (``total``)."""
        response = self.client.get("/v1/models")
        assert response.status_code == 200, response.text
        return int(response.json()["total"])

    def model(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/v1/models/{job_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def status(self, job_id: str) -> str:
        return str(self.model(job_id)["training"]["training_status"]["status"])

    def wait_status(
        self, job_id: str, wanted: Iterable[str], timeout: float = 60
    ) -> dict[str, Any]:
        targets = set(wanted)

        def reached() -> dict[str, Any] | None:
            model = self.model(job_id)
            status = model["training"]["training_status"]["status"]
            if status in targets:
                return model
            if status in {"COMPLETED", "FAILED", "CANCELLED"}:
                raise AssertionError(f"{job_id} ended {status}: {model['training']}")
            return None

        try:
            result: dict[str, Any] = wait_for(
                reached, timeout=timeout, interval=0.1, what=f"{job_id} to reach {targets}"
            )
        except AssertionError as timed_out:
            try:
                diagnosis = self.diagnosis(job_id)
            except Exception as exc:  # the server itself may be what went wrong
                diagnosis = f"(no diagnosis: {exc!r})\n{self.log_tail(60)}"
            raise AssertionError(f"{timed_out}\n{diagnosis}") from None
        return result

    def diagnosis(self, job_id: str) -> str:
        """What a failed wait needs to be understood: the job's status, its last events and
        learners, the other jobs that have not ended (what may hold its resources), and the
        end of the server's log."""
        model = self.model(job_id)
        events = [
            f"  {e['time']} {e.get('from')} -> {e['to']} learner={e.get('learner')}: "
            f"{e.get('reason') or ''}"
            for e in model.get("events", [])[-12:]
        ]
        return "\n".join(
            [
                f"{job_id} is {model['training']['training_status']['status']}",
                f"learners: {model.get('learners')}",
                "events:",
                *events,
                "other jobs not ended:",
                *self._unended_others(job_id),
                "server log:",
                self.log_tail(60),
            ]
        )

    def _unended_others(self, job_id: str) -> list[str]:
        response = self.client.get("/v1/models", params={"limit": 100})
        if response.status_code != 200:
            return [f"  (cannot list jobs: {response.status_code})"]
        described = []
        for listed in response.json()["models"]:
            other = str(listed["model_id"])
            if other == job_id:
                continue
            model = self.model(other)
            status = model["training"]["training_status"]["status"]
            if status in {"COMPLETED", "FAILED", "CANCELLED"}:
                continue
            learners = [
                (lr["learner"], lr["attempt"], lr["status"], lr["node"])
                for lr in model.get("learners") or []
            ]
            last = (model.get("events") or [{}])[-1]
            described.append(f"  {other} {status} ({last.get('reason')}); learners {learners}")
        return described or ["  none"]

    def loglines(self, job_id: str, **params: Any) -> list[dict[str, Any]]:
        response = self.client.get(
            f"/v1/logs/{job_id}/loglines", params={"pagesize": 10000, **params}
        )
        assert response.status_code == 200, response.text
        lines: list[dict[str, Any]] = response.json()["models"]
        return lines


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def job_pids(job_id: str) -> set[int]:
    """Host pids of every live process that runs for ``job_id`` (its learners' commands and
    all they started), found by the ``TRAINING_ID`` in their environment: inside the
    sandbox a process sees only its own PID namespace, so it cannot tell its host pid."""
    marker = f"TRAINING_ID={job_id}".encode()
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and pid_alive(int(entry.name)):
            found.add(int(entry.name))
    return found


@contextlib.contextmanager
def serving(server: LiveServer) -> Iterator[LiveServer]:
    """Start ``server``; on the way out stop it and kill every controller it started."""
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.kill_learners()


@contextlib.contextmanager
def serving_replicas(home: Path, config: dict[str, Any], count: int) -> Iterator[list[LiveServer]]:
    """``count`` replicas sharing ``home`` and ``config`` (its shared ``database_url``),
    started one after another (the first creates the schema and the administrator); on the
    way out each is stopped and every controller they started is killed."""
    started: list[LiveServer] = []
    try:
        for n in range(count):
            replica = LiveServer(home=home, config=dict(config), log_name=f"r{n}.log")
            replica.start()
            started.append(replica)
        yield started
    finally:
        for replica in started:
            if replica.proc is not None:
                # One a test froze (SIGSTOP) must run again to stop.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(replica.proc.pid, signal.SIGCONT)
            replica.stop()
        if started:
            started[0].kill_learners()


def socket_lines(ws: Any) -> list[str]:
    """The text a websocket sends until the server closes it, as lines (FfDL's follow)."""
    received: list[str] = []
    while True:
        opcode, frame = ws.recv_data(control_frame=True)
        if opcode == ABNF.OPCODE_CLOSE:
            break
        if opcode == ABNF.OPCODE_TEXT:
            received.append(frame.decode())
    return "".join(received).splitlines()


def streamed_log_items(server: LiveServer, job_id: str, since_rindex: int) -> list[dict[str, Any]]:
    """The ``log`` events of a job's Server-Sent Events stream from ``since_rindex`` until
    its ``end`` event."""
    url = f"/v1/models/{job_id}/events/stream"
    items: list[dict[str, Any]] = []
    with server.client.stream("GET", url, params={"since_rindex": since_rindex}) as response:
        kind = ""
        for raw in response.iter_lines():
            if raw.startswith("event: "):
                kind = raw[len("event: ") :]
            elif raw.startswith("data: ") and kind == "log":
                items.append(json.loads(raw[len("data: ") :]))
            elif raw.startswith("data: ") and kind == "end":
                break
    return items


def followed_socket_lines(server: LiveServer, job_id: str, query: str) -> list[str]:
    """FfDL's websocket follow of a job's log (``query``: its parameters), as lines."""
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{server.port}/v1/models/{job_id}/logs?{query}",
        header=[f"Authorization: Bearer {server.token}"],
        subprotocols=["ws"],
        timeout=60,
    )
    try:
        return socket_lines(ws)
    finally:
        ws.close()


def interruptible() -> None:
    """``preexec_fn`` of a child that a test interrupts with SIGINT (Ctrl-C): a suite started
    in the background by a shell without job control runs with SIGINT ignored, and children
    inherit that, so the child takes the default back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def running_server(home: Path, **config: Any) -> contextlib.AbstractContextManager[LiveServer]:
    return serving(LiveServer(home=home, config={**FAST_CONFIG, **config}))


def ffdl_output(server: LiveServer, *args: str, columns: int = 80) -> str:
    """What the ``ffdl`` command prints against ``server`` in a terminal ``columns`` wide;
    it must succeed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FFDL_")}
    env.update({"FFDL_CONFIG": str(server.home / "client.json"), "COLUMNS": str(columns)})
    done = subprocess.run(
        [sys.executable, "-m", "ffdl.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
