"""The Ray driver: the one process of the control plane that holds a Ray connection.

Started by ``RayBackend`` as ``python -m ffdl.backends.ray_driver``; reads one JSON request
per line on stdin (``{"id", "op", "args"}``) and answers each with one line on stdout
(``{"id", "ok", "result"}`` or ``{"id", "ok": false, "error", "unavailable"}``). Requests are
served in parallel. The first request is ``connect`` with the backend's ``RayConfig``.

Names in the cluster (namespace ``RayConfig.namespace``): the placement group of an attempt
is ``ffdl-<training id>-a<attempt>``, the actor hosting a learner
``ffdl-<training id>-l<learner>-a<attempt>``. A reaper removes the placement groups whose
actors are all gone (ended, killed, or lost with their node), so their reservations do not
outlive the attempt.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ffdl.backends.ray_config import NODE_NAME_LABEL, RayConfig
from ffdl.backends.ray_host import LearnerHost
from ffdl.core.resources import CPU_SLOTS

log = logging.getLogger("ffdl.ray.driver")

PREFIX = "ffdl-"
NODE_ID_LABEL = "ray.io/node-id"
ACCELERATOR_LABEL = "ray.io/accelerator-type"
# Resources every node has, which are not labels.
_STANDARD_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}
REAPER_INTERVAL_S = 1.0
# A learner that needs no GPU still reserves a sliver of a CPU, so its bundle is not empty.
MIN_BUNDLE_CPU = 0.01
ASK_TIMEOUT_S = 10.0
RAYLET_TIMEOUT_S = 2.0
GANG_WAIT_S = 5.0
# A gang not yet wholly launched keeps its placement group this long after the platform
# last tried to launch one of its learners, even when none of its learners lives now.
LAUNCH_GRACE_S = 30.0
MEBIBYTE = 1024 * 1024


def pg_name(training_id: str, attempt: int) -> str:
    return f"{PREFIX}{training_id}-a{attempt}"


def actor_name(training_id: str, learner: int, attempt: int) -> str:
    return f"{PREFIX}{training_id}-l{learner}-a{attempt}"


def node_name(raw: dict[str, Any]) -> str:
    labels = raw.get("Labels") or {}
    return str(labels.get(NODE_NAME_LABEL) or f"ray-{str(raw['NodeID'])[:12]}")


def describe_node(raw: dict[str, Any]) -> dict[str, Any]:
    """A Ray node as ffdl sees it: GPUs (or CPU slots on a node without), CPUs, memory,
    GPU type and labels (Ray's labels, plus custom resources: ``rack:r1`` → ``rack=r1``)."""
    resources: dict[str, float] = raw.get("Resources") or {}
    labels: dict[str, str] = {}
    gpu_type = ""
    for key, value in (raw.get("Labels") or {}).items():
        if key == ACCELERATOR_LABEL:
            gpu_type = str(value)
        elif not key.startswith("ray.io/") and key != NODE_NAME_LABEL:
            labels[str(key)] = str(value)
    for key, amount in resources.items():
        if key in _STANDARD_RESOURCES or key.startswith("node:"):
            continue
        if key.startswith("accelerator_type:"):
            gpu_type = gpu_type or key.split(":", 1)[1]
            continue
        name, sep, value = key.partition(":")
        labels.setdefault(name, value if sep else f"{amount:g}")
    labels["ray_node_id"] = str(raw["NodeID"])
    labels["address"] = str(raw.get("NodeManagerAddress") or "")
    gpus = int(resources.get("GPU", 0))
    cpus = float(resources.get("CPU", 0))
    if gpus == 0:
        # As on the local backend: a machine without GPUs offers CPU slots in their place.
        gpus, gpu_type = int(cpus), CPU_SLOTS
    return {
        "name": node_name(raw),
        "gpus": gpus,
        "cpus": cpus,
        "memory_mb": int(resources.get("memory", 0) // MEBIBYTE),
        "gpu_type": gpu_type or "gpu",
        "labels": labels,
    }


@dataclass
class GangLaunch:
    """What this process knows of one attempt's gang while its learners are launched."""

    size: int
    launched: set[int] = field(default_factory=set)
    # Learner 1's rendezvous address, kept: a short learner 1 may have ended (and its actor
    # with it) before the platform launches the last of the others.
    master: dict[str, Any] | None = None
    last_try: float = field(default_factory=time.monotonic)

    def waits_for_more(self, now: float) -> bool:
        return len(self.launched) < self.size and now - self.last_try < LAUNCH_GRACE_S


class Driver:
    def __init__(self, config: RayConfig) -> None:
        self.config = config
        self.host_class = ray.remote(LearnerHost)
        # Placement groups a launch in this process is filling: never reaped meanwhile.
        self._launching: set[str] = set()
        self._launch_lock = threading.Lock()
        # Gangs being launched, by placement group: one whose platform still launches its
        # learners is not reaped between two tries, though none of its actors lives.
        self._gangs: dict[str, GangLaunch] = {}
        # Placement group -> when it was first seen without a live actor.
        self._empty_since: dict[str, float] = {}
        # Nodes whose raylet stopped answering while Ray still counts them alive: nothing is
        # placed there any more (Ray's own health checks take many seconds to agree).
        self._lost: set[str] = set()
        self._lost_lock = threading.Lock()

    # -- nodes ----------------------------------------------------------------------------

    def alive_nodes(self) -> list[dict[str, Any]]:
        """Ray's alive nodes, less those found lost before Ray noticed (see ``_node_alive``)."""
        nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        alive = [n for n in nodes if n.get("Alive")]
        with self._lost_lock:
            self._lost &= {str(n["NodeID"]) for n in alive}
            return [n for n in alive if str(n["NodeID"]) not in self._lost]

    def nodes(self) -> list[dict[str, Any]]:
        """The alive nodes that can take a learner (a head started with no CPU and no GPU,
        as KubeRay's usually is, cannot)."""
        described = [describe_node(n) for n in self.alive_nodes()]
        return [d for d in described if d["gpus"] > 0 or d["cpus"] > 0]

    def _node_ids(self) -> dict[str, str]:
        return {node_name(n): str(n["NodeID"]) for n in self.alive_nodes()}

    def _node_alive(self, node_id: str) -> bool:
        """Ray counts the node alive and its raylet answers. A machine that died is noticed
        by its raylet's silence at once, before Ray's health checks mark it dead."""
        node = next((n for n in self.alive_nodes() if str(n["NodeID"]) == node_id), None)
        if node is None:
            return False
        address = (str(node["NodeManagerAddress"]), int(node["NodeManagerPort"]))
        try:
            with socket.create_connection(address, timeout=RAYLET_TIMEOUT_S):
                return True
        except OSError:
            log.warning("node %s does not answer: taken as lost", node_name(node))
            with self._lost_lock:
                self._lost.add(node_id)
            return False

    # -- launch ---------------------------------------------------------------------------

    def launch(self, args: dict[str, Any]) -> dict[str, Any]:
        spec = args["spec"]
        training_id, learner, attempt = spec["training_id"], spec["learner"], spec["attempt"]
        name = actor_name(training_id, learner, attempt)
        group = pg_name(training_id, attempt)
        with self._launch_lock:
            self._launching.add(group)
            gang = self._gangs.setdefault(group, GangLaunch(int(spec["num_learners"])))
            gang.last_try = time.monotonic()
        try:
            host = self._existing_actor(name)
            if host is None:
                pg = self._gang(group, args)
                host = self._start_host(name, pg, args, gang)
            info = ray.get(host.ready.remote(), timeout=self.config.launch_timeout_s)
            if learner == 1 and gang.size > 1 and gang.master is None:
                gang.master = ray.get(host.master.remote(), timeout=ASK_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise Unavailable(f"learner {learner} of {training_id} did not start in time") from None
        finally:
            with self._launch_lock:
                self._launching.discard(group)
        with self._launch_lock:
            gang.launched.add(int(learner))
        handle = {
            "ray_actor": name,
            "ray_placement_group": group,
            "ray_node_id": info["node_id"],
            "node": info["node"],
            "pid": info["pid"],
        }
        if info["gpu_ids"]:
            # The devices Ray assigned (a learner on CPU slots has none to name).
            handle["gpu_ids"] = info["gpu_ids"]
        return handle

    def _existing_actor(self, name: str) -> Any:
        try:
            return ray.get_actor(name, namespace=self.config.namespace)
        except ValueError:
            return None

    def _gang(self, group: str, args: dict[str, Any]) -> PlacementGroup:
        """The attempt's placement group, made now if needed, once Ray has reserved it."""
        pg: PlacementGroup
        try:
            pg = get_placement_group(group)
        except ValueError:
            ids = self._node_ids()
            gang = args["gang"] or [{"node": args["node"], "gpus": len(args["gpu_ids"])}]
            missing = sorted({g["node"] for g in gang} - set(ids))
            if missing:
                raise Unavailable(f"node {', '.join(missing)} is not in the Ray cluster") from None
            bundles = [self._bundle(g["gpus"], g["node"]) for g in gang]
            pg = placement_group(
                bundles,
                strategy="PACK",
                name=group,
                lifetime="detached",
                bundle_label_selector=[{NODE_ID_LABEL: ids[g["node"]]} for g in gang],
            )
        # Not long: the platform asks again on its next pass, and its loop must not stall.
        try:
            reserved = pg.wait(min(GANG_WAIT_S, self.config.launch_timeout_s))
        except Exception as exc:
            # Removed since it was looked up (Ray raises a bare Exception): made anew next try.
            raise Unavailable(f"Ray dropped the gang {group} ({exc})") from None
        if not reserved:
            raise Unavailable(f"Ray has not reserved the gang {group} yet")
        return pg

    def _bundle(self, gpus: int, node: str) -> dict[str, float]:
        described = {d["name"]: d for d in self.nodes()}
        if gpus and described.get(node, {}).get("gpu_type") != CPU_SLOTS:
            return {"GPU": float(gpus)}
        return {"CPU": float(gpus) if gpus else MIN_BUNDLE_CPU}

    def _start_host(
        self, name: str, pg: PlacementGroup, args: dict[str, Any], launch: GangLaunch
    ) -> Any:
        spec = args["spec"]
        learner = int(spec["learner"])
        bundle = pg.bundle_specs[learner - 1]
        master = None
        if launch.size > 1 and learner > 1:
            master = launch.master
            if master is None:
                first = self._existing_actor(actor_name(spec["training_id"], 1, spec["attempt"]))
                if first is None:
                    raise Unavailable("learner 1 of this attempt has not started")
                master = launch.master = ray.get(first.master.remote(), timeout=ASK_TIMEOUT_S)
        options: dict[str, Any] = {
            "name": name,
            "namespace": self.config.namespace,
            "lifetime": "detached",
            "max_restarts": 0,
            "max_concurrency": 8,
            "num_cpus": bundle.get("CPU", 0),
            "num_gpus": bundle.get("GPU", 0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=learner - 1
            ),
        }
        addresses = {node_name(n): str(n["NodeManagerAddress"]) for n in self.alive_nodes()}
        gang = args["gang"] or [{"node": args["node"]}]
        peers = [addresses.get(g["node"], "") for g in gang]
        host_config = asdict(self.config)
        return self.host_class.options(**options).remote(host_config, spec, master, peers)

    # -- halt, kill, poll -------------------------------------------------------------------

    def halt(self, args: dict[str, Any]) -> None:
        host = self._existing_actor(str(args["handle"]["ray_actor"]))
        if host is not None:
            ray.get(host.halt.remote(), timeout=ASK_TIMEOUT_S)

    def kill(self, args: dict[str, Any]) -> None:
        handle = args["handle"]
        host = self._existing_actor(str(handle["ray_actor"]))
        if host is not None:
            # Its node may be gone with it: the actor is killed all the same.
            with contextlib.suppress(ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                ray.get(host.kill.remote(), timeout=ASK_TIMEOUT_S)
            ray.kill(host, no_restart=True)
        self._reap(str(handle.get("ray_placement_group") or ""), at_once=True)

    def poll(self, args: dict[str, Any]) -> dict[str, Any]:
        handle = args["handle"]
        node_id = str(handle.get("ray_node_id") or "")
        node = str(handle.get("node") or node_id[:12])
        lost = {"state": "missing", "reason": f"node {node} lost"}
        # The node first: a learner is polled because it went silent, and a dead machine's
        # actors answer nothing (Ray reports them dead only once it has noticed).
        if node_id and not self._node_alive(node_id):
            return lost
        host = self._existing_actor(str(handle["ray_actor"]))
        if host is None:
            return {"state": "missing"}
        try:
            answer: dict[str, Any] = ray.get(host.poll.remote(), timeout=ASK_TIMEOUT_S)
            return answer
        except ray.exceptions.GetTimeoutError:
            return {"state": "running"} if self._node_alive(node_id) else lost
        except ray.exceptions.RayError:
            return {"state": "missing"} if self._node_alive(node_id) else lost

    # -- reaper -----------------------------------------------------------------------------

    def reap_forever(self) -> None:
        while True:
            time.sleep(REAPER_INTERVAL_S)
            try:
                for info in placement_group_table().values():
                    name = str(info.get("name") or "")
                    if name.startswith(PREFIX) and info.get("state") != "REMOVED":
                        self._reap(name, at_once=False, bundles=len(info.get("bundles") or {}))
            except Exception:
                log.exception("sweeping placement groups failed")

    def _reap(self, group: str, *, at_once: bool, bundles: int | None = None) -> None:
        """Remove ``group`` when none of its learners' actors lives (not while a launch in
        this process fills it); unless ``at_once``, only once seen empty twice."""
        if not group.startswith(PREFIX):
            return
        with self._launch_lock:
            if group in self._launching:
                return
            gang = self._gangs.get(group)
            if not at_once and gang is not None and gang.waits_for_more(time.monotonic()):
                return
        training_id, _, attempt = group[len(PREFIX) :].rpartition("-a")
        try:
            pg = get_placement_group(group)
        except ValueError:
            self._forget(group)
            return
        count = bundles if bundles is not None else len(pg.bundle_specs)
        names = [actor_name(training_id, i, int(attempt)) for i in range(1, count + 1)]
        if any(self._existing_actor(n) is not None for n in names):
            self._empty_since.pop(group, None)
            return
        first = self._empty_since.setdefault(group, time.monotonic())
        if at_once or time.monotonic() - first >= REAPER_INTERVAL_S:
            remove_placement_group(pg)
            self._forget(group)
            log.info("removed placement group %s", group)

    def _forget(self, group: str) -> None:
        self._empty_since.pop(group, None)
        with self._launch_lock:
            self._gangs.pop(group, None)


class Unavailable(Exception):
    """The cluster cannot do it now; the backend raises ``BackendUnavailable``."""


def _serve(driver: Driver, request: dict[str, Any], out: IO[str], lock: threading.Lock) -> None:
    op, args = request.get("op"), request.get("args") or {}
    reply: dict[str, Any] = {"id": request.get("id")}
    try:
        method = {
            "nodes": lambda _: driver.nodes(),
            "launch": driver.launch,
            "halt": driver.halt,
            "kill": driver.kill,
            "poll": driver.poll,
        }[str(op)]
        reply.update(ok=True, result=method(args))
    except Unavailable as exc:
        reply.update(ok=False, unavailable=True, error=str(exc))
    except Exception as exc:
        log.exception("%s failed", op)
        reply.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    with lock:
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main() -> int:
    # Replies own the real stdout; whatever Ray prints goes to stderr with the logs.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    lock = threading.Lock()
    first = json.loads(sys.stdin.readline() or "{}")
    config = RayConfig(**first.get("args", {}))
    try:
        ray.init(
            address=config.address,
            namespace=config.namespace,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    except Exception as exc:
        out.write(json.dumps({"id": first.get("id"), "ok": False, "error": str(exc)}) + "\n")
        out.flush()
        return 1
    driver = Driver(config)
    out.write(json.dumps({"id": first.get("id"), "ok": True, "result": None}) + "\n")
    out.flush()
    threading.Thread(target=driver.reap_forever, daemon=True).start()
    with ThreadPoolExecutor(max_workers=16) as pool:
        for line in sys.stdin:
            if line.strip():
                pool.submit(_serve, driver, json.loads(line), out, lock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
