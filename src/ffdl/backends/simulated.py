"""The simulated backend: for load tests of the control plane, never for running jobs.

As kwok simulates kubelets, this backend starts no process: each learner the platform
launches is handed to the load-testing harness (``ffdl.loadtest.harness``, one process
shared by every replica, on ``harness_url``), where a simulated learner reports to the real
API what a controller would: statuses, heartbeats, log lines and metrics at the configured
rates, and a result after ``duration_s``. Everything else is the real platform.

``harness_url`` may list several harnesses, for more learners than one process can play:
each job's learners all go to one of them, chosen from its id by a hash that every replica
computes alike.

A job may change its own learners' behaviour in its command (``framework.command``, which
nothing runs here): words ``duration_s=SECONDS`` and ``result=COMPLETED|FAILED`` replace the
configured ones, so that a load test can mix short and long, good and failing jobs.

It is chosen only by name (``backend: simulated``) and needs its ``simulated:`` section;
``/health`` and the dashboard say that learners are simulated.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ffdl.backends.base import (
    BackendUnavailable,
    Handle,
    LaunchRequest,
    LearnerState,
    PollResult,
)
from ffdl.core.resources import Node
from ffdl.core.units import parse_size_mb
from ffdl.learner.spec import LearnerSpec, report_targets
from ffdl.loadtest.learner import Behaviour

REQUEST_TIMEOUT_S = 10.0
SIMULATED_WARNING = "learners are simulated (load testing): no job really runs"


class SimulatedConfig(BaseModel):
    """The ``simulated:`` section of ``config.yaml``: where the harness is, what learners do,
    and (unless ``nodes`` are declared) the nodes to offer."""

    model_config = ConfigDict(extra="forbid")

    # One harness, or several (a list) that share the jobs.
    harness_url: tuple[str, ...]
    duration_s: float = Field(gt=0)
    lines_per_s: float = Field(ge=0)
    metrics_per_s: float = Field(ge=0)
    report_every_s: float = Field(default=1.0, gt=0)
    result: Literal["COMPLETED", "FAILED"] = "COMPLETED"
    node_count: int = Field(default=0, ge=0)
    gpus_per_node: int = Field(default=8, ge=0)
    cpus_per_node: float = Field(default=64.0, gt=0)
    memory_per_node: str = "512GiB"
    gpu_type: str = "sim"
    # Nodes are labelled ``rack=r0`` ... in turn over this many racks.
    racks: int = Field(default=1, ge=1)

    @field_validator("harness_url", mode="before")
    @classmethod
    def _http_urls(cls, value: object) -> tuple[str, ...]:
        urls = [value] if isinstance(value, str) else value
        if not isinstance(urls, list | tuple) or not urls:
            raise ValueError("harness_url must be http://HOST:PORT or a list of them")
        for url in urls:
            parts = urlsplit(url) if isinstance(url, str) else None
            if parts is None or parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"harness_url must be http://HOST:PORT, got {url!r}")
        return tuple(str(url).rstrip("/") for url in urls)

    def generated_nodes(self) -> tuple[Node, ...]:
        memory_mb = parse_size_mb(self.memory_per_node, "simulated.memory_per_node")
        width = len(str(max(self.node_count - 1, 0)))
        return tuple(
            Node(
                name=f"sim-{n:0{width}d}",
                gpus=self.gpus_per_node,
                cpus=self.cpus_per_node,
                memory_mb=memory_mb,
                gpu_type=self.gpu_type,
                labels={"rack": f"r{n % self.racks}"},
            )
            for n in range(self.node_count)
        )


@dataclass(frozen=True)
class SimulatedSetup:
    """What the platform hands this backend: its section, and the nodes declared (if any)."""

    config: SimulatedConfig
    nodes: tuple[Node, ...] = ()


class SimulatedBackend:
    name = "simulated"

    def __init__(self, setup: SimulatedSetup) -> None:
        config = setup.config
        self.config = config
        self._nodes = list(setup.nodes or config.generated_nodes())
        self._harnesses = [
            httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S, trust_env=False)
            for url in config.harness_url
        ]

    def nodes(self) -> list[Node]:
        return list(self._nodes)

    def launch(self, request: LaunchRequest) -> Handle:
        spec = request.spec
        path = _path(spec.training_id, spec.learner, spec.attempt)
        body = {
            "job_token": spec.job_token,
            "api_urls": report_targets(spec),
            "behaviour": asdict(self._behaviour(spec)),
        }
        self._call("PUT", path, json=body)
        return {"simulated": path, "node": request.node, "gpu_ids": list(request.gpu_ids)}

    def signal_halt(self, handle: Handle) -> None:
        self._call("POST", f"{handle['simulated']}/halt")

    def kill(self, handle: Handle) -> None:
        self._call("DELETE", str(handle["simulated"]))

    def poll(self, handle: Handle) -> PollResult:
        answer = self._call("GET", str(handle["simulated"]))
        state = str(answer.get("state"))
        if state == "running":
            return PollResult(LearnerState.RUNNING)
        result = answer.get("result")
        if state == "exited" and isinstance(result, dict):
            return PollResult(LearnerState.EXITED, result=result)
        return PollResult(LearnerState.MISSING, reason="simulated learner is gone")

    def problem(self) -> str | None:
        return None

    def learner_limits(self) -> dict[str, object]:
        return {"memory": "none", "detail": SIMULATED_WARNING}

    def close(self) -> None:
        for harness in self._harnesses:
            harness.close()

    def _behaviour(self, spec: LearnerSpec) -> Behaviour:
        config = self.config
        words = dict(word.split("=", 1) for word in spec.command.split() if "=" in word)
        duration = _positive(words.get("duration_s"), config.duration_s)
        result = words.get("result", config.result)
        return Behaviour(
            duration_s=duration,
            lines_per_s=config.lines_per_s,
            metrics_per_s=config.metrics_per_s,
            report_every_s=config.report_every_s,
            heartbeat_s=spec.heartbeat_s,
            result=result if result in ("COMPLETED", "FAILED") else config.result,
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        harness = self._harnesses[harness_index(path, len(self._harnesses))]
        try:
            response = harness.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(
                f"load-testing harness unreachable at {harness.base_url} ({exc})"
            ) from exc
        if response.status_code >= 400:
            raise BackendUnavailable(
                f"load-testing harness answered {response.status_code}: {response.text[:200]}"
            )
        body = response.json()
        return body if isinstance(body, dict) else {}


def _path(training_id: str, learner: int, attempt: int) -> str:
    return f"/learners/{training_id}/{learner}/{attempt}"


def harness_index(path: str, harnesses: int) -> int:
    """Which harness plays the learner at ``path``: the same for all of a job's learners and
    attempts, on every replica (``hash()`` differs between processes; CRC-32 does not)."""
    training_id = path.split("/")[2]
    return zlib.crc32(training_id.encode()) % harnesses


def _positive(value: str | None, default: float) -> float:
    try:
        parsed = float(value) if value is not None else default
    except ValueError:
        return default
    return parsed if parsed > 0 else default
