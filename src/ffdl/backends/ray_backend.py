"""The Ray backend: learners on the machines of a Ray cluster.

ffdl's scheduler still decides where every learner runs; this backend makes Ray enforce it.
A placement turns into a detached placement group whose bundles are pinned to the chosen
nodes (the gang is reserved all together or not at all), and each learner's controller is
hosted by a detached, named actor in its bundle (``ray_host.LearnerHost``). Names are stable
per (job, learner, attempt), so ``launch`` is idempotent and a restarted control plane finds
its learners again by name.

The control plane never imports Ray. Ray's client lives in a driver subprocess
(``ray_driver``) that this class talks to over pipes, one JSON line per request and reply:
a Ray cluster that goes away can then only take that subprocess down, never the API. A
connector thread keeps the driver up: it checks that the cluster's address answers, starts
a driver when it does, and stops it when the address stops answering, so that ``problem``
says "Ray cluster unreachable at ADDRESS" within about a second and the scheduler keeps jobs
queued until the cluster is back.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict
from typing import IO, Any

from ffdl.backends.base import (
    BackendConfigError,
    BackendUnavailable,
    Handle,
    LaunchRequest,
    LearnerState,
    PollResult,
)
from ffdl.backends.ray_config import RayConfig
from ffdl.core.resources import Node
from ffdl.learner.spec import spec_to_dict

log = logging.getLogger("ffdl.ray")

DRIVER_MODULE = "ffdl.backends.ray_driver"
# How often the connector checks the cluster's address, and how long one check may take.
CHECK_INTERVAL_S = 1.0
CONNECT_TIMEOUT_S = 1.0
# How long a started driver may take to connect to the cluster.
DRIVER_START_TIMEOUT_S = 60.0
# Replies to quick requests (poll, halt, kill); a launch waits for its gang as configured.
CALL_TIMEOUT_S = 15.0
# Nodes are asked for at most this often; the loops and the API ask many times a second.
NODES_TTL_S = 0.5


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise BackendConfigError(
            f"ray_address must be HOST:PORT (the cluster's GCS address), got {address!r}"
        )
    return host.strip("[]"), int(port)


def address_answers(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    host, port = _split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _node_from_json(raw: dict[str, Any]) -> Node:
    return Node(
        name=str(raw["name"]),
        gpus=int(raw["gpus"]),
        cpus=float(raw["cpus"]),
        memory_mb=int(raw["memory_mb"]),
        gpu_type=str(raw.get("gpu_type") or ""),
        labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
    )


class _Driver:
    """One driver subprocess and the requests in flight to it."""

    def __init__(self, config: RayConfig) -> None:
        self._config = config
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Any]] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._ready: Future[Any] = Future()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", DRIVER_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env(),
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        threading.Thread(target=self._relay_log, args=(self.proc.stderr,), daemon=True).start()
        self._send({"id": 0, "op": "connect", "args": asdict(self._config)}, self._ready)

    def _env(self) -> dict[str, str]:
        return {
            "PATH": self._config.learner_path,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "HOME": self._config.home,
            # Ray would replace 127.0.0.1 with the host's address; keep what the operator gave.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        }

    def wait_connected(self, timeout_s: float) -> None:
        try:
            self._ready.result(timeout=timeout_s)
        except FutureTimeout:
            raise BackendUnavailable("the Ray driver did not connect in time") from None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        future: Future[Any] = Future()
        request_id = next(self._ids)
        self._send({"id": request_id, "op": op, "args": args}, future)
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            raise BackendUnavailable(f"the Ray driver did not answer {op} in time") from None
        finally:
            with self._lock:
                self._pending.pop(request_id, None)

    def _send(self, message: dict[str, Any], future: Future[Any]) -> None:
        with self._lock:
            self._pending[int(message["id"])] = future
        line = (json.dumps(message) + "\n").encode()
        try:
            with self._write_lock:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
        except (OSError, ValueError):
            with self._lock:
                self._pending.pop(int(message["id"]), None)
            raise BackendUnavailable("the Ray driver has exited") from None

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            try:
                reply = json.loads(raw)
                request_id = int(reply["id"])
            except (ValueError, KeyError, TypeError):
                log.warning("unreadable reply from the Ray driver: %r", raw[:200])
                continue
            with self._lock:
                future = self._pending.pop(request_id, None)
            if future is None or future.done():
                continue
            if reply.get("ok"):
                future.set_result(reply.get("result"))
            elif reply.get("unavailable"):
                future.set_exception(BackendUnavailable(str(reply.get("error"))))
            else:
                future.set_exception(RuntimeError(str(reply.get("error"))))
        # The driver is gone: nothing in flight will be answered.
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for future in pending:
            if not future.done():
                future.set_exception(BackendUnavailable("the Ray driver has exited"))

    def _relay_log(self, stream: IO[bytes]) -> None:
        for raw in stream:
            text = raw.decode(errors="replace").rstrip()
            if text:
                log.info("driver: %s", text)

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


class RayBackend:
    name = "ray"

    def __init__(self, config: RayConfig) -> None:
        if not ray_installed():
            raise BackendConfigError("the Ray backend needs Ray: pip install 'ffdl[ray]'")
        _split_address(config.address)
        self._config = config
        self._unreachable = f"Ray cluster unreachable at {config.address}"
        self._driver: _Driver | None = None
        self._driver_lock = threading.Lock()
        self._problem: str | None = self._unreachable
        self._nodes: list[Node] = []
        self._nodes_at = 0.0
        self._nodes_lock = threading.Lock()
        self._closed = threading.Event()
        self._connected = threading.Event()
        self._connector = threading.Thread(target=self._keep_connected, daemon=True)
        self._connector.start()
        # A reachable cluster is used from the first pass on.
        self._connected.wait(min(DRIVER_START_TIMEOUT_S, 20.0))

    # -- connection ----------------------------------------------------------------------

    def _keep_connected(self) -> None:
        while not self._closed.is_set():
            driver = self._driver
            answers = address_answers(self._config.address)
            if driver is not None and (not driver.alive or not answers):
                why = "has exited" if not driver.alive else "lost the cluster"
                log.warning(
                    "the Ray driver %s; reconnecting when %s answers", why, self._config.address
                )
                self._drop_driver()
            elif driver is None and answers:
                self._start_driver()
            elif driver is None:
                self._problem = self._unreachable
                self._connected.set()
            self._closed.wait(CHECK_INTERVAL_S)

    def _start_driver(self) -> None:
        driver: _Driver | None = None
        try:
            driver = _Driver(self._config)
            driver.wait_connected(DRIVER_START_TIMEOUT_S)
        except (BackendUnavailable, RuntimeError, OSError) as exc:
            log.warning("cannot connect to the Ray cluster at %s: %s", self._config.address, exc)
            if driver is not None:
                driver.stop()
            self._problem = self._unreachable
            self._connected.set()
            return
        with self._driver_lock:
            self._driver = driver
        self._problem = None
        log.info("connected to the Ray cluster at %s", self._config.address)
        self._connected.set()

    def _drop_driver(self) -> None:
        with self._driver_lock:
            driver, self._driver = self._driver, None
        self._problem = self._unreachable
        with self._nodes_lock:
            self._nodes, self._nodes_at = [], 0.0
        if driver is not None:
            driver.stop()

    def _call(self, op: str, args: dict[str, Any], timeout_s: float = CALL_TIMEOUT_S) -> Any:
        with self._driver_lock:
            driver = self._driver
        if driver is None or not driver.alive:
            raise BackendUnavailable(self._unreachable)
        return driver.call(op, args, timeout_s)

    def problem(self) -> str | None:
        return self._problem

    def learner_limits(self) -> dict[str, object]:
        return {
            "memory": "per node",
            "detail": (
                "each Ray node places its learners' cgroups itself (under cgroup_parent when "
                "set); every learner's log says on its first lines which limits hold"
            ),
        }

    def close(self) -> None:
        self._closed.set()
        self._connector.join(timeout=5)
        self._drop_driver()

    # -- the Backend protocol ------------------------------------------------------------

    def nodes(self) -> list[Node]:
        with self._nodes_lock:
            if time.monotonic() - self._nodes_at < NODES_TTL_S:
                return list(self._nodes)
        try:
            raw = self._call("nodes", {})
        except BackendUnavailable:
            return []
        nodes = [_node_from_json(item) for item in raw]
        with self._nodes_lock:
            self._nodes, self._nodes_at = nodes, time.monotonic()
        return list(nodes)

    def launch(self, request: LaunchRequest) -> Handle:
        gang = request.gang or ()
        args = {
            "node": request.node,
            "gpu_ids": list(request.gpu_ids),
            "gang": [{"node": lp.node, "gpus": len(lp.gpu_ids)} for lp in gang],
            "spec": spec_to_dict(request.spec),
        }
        timeout = self._config.launch_timeout_s + CALL_TIMEOUT_S
        handle = self._call("launch", args, timeout_s=timeout)
        if not isinstance(handle, dict):
            raise RuntimeError(f"the Ray driver answered launch with {handle!r}")
        return handle

    def signal_halt(self, handle: Handle) -> None:
        self._call("halt", {"handle": handle})

    def kill(self, handle: Handle) -> None:
        self._call("kill", {"handle": handle})

    def poll(self, handle: Handle) -> PollResult:
        answer = self._call("poll", {"handle": handle})
        state = LearnerState(str(answer["state"]))
        result = answer.get("result")
        return PollResult(
            state,
            result if isinstance(result, dict) else None,
            reason=answer.get("reason"),
        )
