"""The Ray backend's configuration: what the server hands it (never its ``Settings``).

Importing this module never imports Ray; ``ffdl.backends.ray_backend`` does, and is
loaded only when an operator chooses the Ray backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_NAMESPACE = "ffdl"
DEFAULT_WORK_ROOT = "/tmp/ffdl-ray"
# The label (Ray node label or ``--labels``) that names a node for ffdl; without it a node
# is named after its Ray node id.
NODE_NAME_LABEL = "ffdl.node"


@dataclass(frozen=True)
class RayConfig:
    """Where the Ray cluster is and how learners on its nodes reach the platform.

    ``address`` is the cluster's GCS address (``HOST:PORT``, as ``ray start --head``
    prints it; a KubeRay head service's ``...:6379``). ``home`` is the control plane's home:
    the paths under it in a learner's spec are rebased onto ``work_root`` on the node.
    ``api_url`` is the address learners report to (``--advertise-url``).
    ``checkpoint_store`` is an fsspec URL (``file:///shared/ckpt``, ``s3://bucket/prefix``)
    every node can read, used for jobs whose manifest names no results object store;
    ``checkpoint_store_options`` are its connection fields (S3: endpoint, access_key, ...).
    """

    address: str
    home: str
    api_url: str
    namespace: str = DEFAULT_NAMESPACE
    work_root: str = DEFAULT_WORK_ROOT
    checkpoint_store: str | None = None
    checkpoint_store_options: dict[str, str] = field(default_factory=dict)
    checkpoint_sync_s: float = 5.0
    launch_timeout_s: float = 30.0
    learner_path: str = "/usr/local/bin:/usr/bin:/bin"
