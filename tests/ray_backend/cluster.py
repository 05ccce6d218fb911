"""A real multi-node Ray cluster on 127.0.0.1 for tests and benchmarks.

Each node is a raylet of its own (``ray.cluster_utils.Cluster``) with fake GPU counts, a
name and a rack (Ray labels), and a work root of its own, so nothing is shared between
nodes by accident. The head node offers nothing (learners never land there). The cluster's
port is chosen before it starts, so a platform can be pointed at it while it is still down.
Every Ray process started here has ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: without it Ray
replaces 127.0.0.1 with the host's primary address.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

NODES = {"a": "r1", "b": "r1", "c": "r2"}
GPUS_PER_NODE = 4


@dataclass
class RayTestCluster:
    port: int
    root: Path
    nodes: dict[str, str] = field(default_factory=lambda: dict(NODES))
    cluster: Any = None
    handles: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def work_root(self, name: str) -> Path:
        return self.root / f"node-{name}"

    def start(self) -> None:
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "gcs_server_port": self.port,
                "num_cpus": 0,
                "num_gpus": 0,
                "include_dashboard": False,
                "object_store_memory": 80 * 1024 * 1024,
            },
        )
        for name in self.nodes:
            self.add(name)
        self.cluster.wait_for_nodes()

    def add(self, name: str) -> None:
        root = self.work_root(name)
        root.mkdir(parents=True, exist_ok=True)
        self.handles[name] = self.cluster.add_node(
            num_cpus=4,
            num_gpus=GPUS_PER_NODE,
            object_store_memory=80 * 1024 * 1024,
            labels={"ffdl.node": name, "ffdl.work_root": str(root), "rack": self.nodes[name]},
        )

    def remove(self, name: str) -> None:
        """The machine dies: its raylet and everything Ray runs there."""
        self.cluster.remove_node(self.handles.pop(name), allow_graceful=False)

    def node_addresses(self) -> list[str]:
        import ray

        return [str(n["NodeManagerAddress"]) for n in ray.nodes() if n["Alive"]]

    def shutdown(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()
