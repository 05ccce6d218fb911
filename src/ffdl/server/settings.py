"""Platform settings: the only place the server reads configuration.

Sources, highest first: explicit overrides (CLI flags), ``FFDL_*`` environment variables,
``<home>/config.yaml``, defaults. ``home`` holds the database, job directories, the client
config and the optional ``config.yaml`` (e.g. declared virtual nodes).

Backends never read these settings: ``backend_config`` hands the chosen backend its own
typed configuration (``LocalConfig``, ``RayConfig`` or ``SimulatedSetup``).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ffdl.backends.local import LocalConfig
from ffdl.backends.ray_config import RayConfig
from ffdl.backends.simulated import SimulatedConfig, SimulatedSetup
from ffdl.core.resources import Node
from ffdl.core.units import parse_size_mb
from ffdl.server.services.runtimes import RuntimeConfig, check_paths, check_runtimes
from ffdl.storage.blobs import check_blob_url


class NodeConfig(BaseModel):
    """A declared (virtual) node: learners run on this host but are accounted to it."""

    name: str
    gpus: int = Field(ge=0)
    cpus: float = Field(gt=0)
    memory: str | int = "16GiB"
    gpu_type: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


def _default_learner_path() -> str:
    bin_dir = str(Path(sys.executable).parent)
    system = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    return os.pathsep.join([bin_dir, system])


def default_home() -> Path:
    return Path(os.environ.get("FFDL_HOME", str(Path.home() / ".ffdl"))).expanduser()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FFDL_", extra="ignore")

    home: Path = Field(default_factory=default_home)
    host: str = "127.0.0.1"
    port: int = 8080
    database_url: str | None = None  # default: SQLite file in home

    # Cluster shape for the local backend: declared nodes, or the real host as one node.
    nodes: list[NodeConfig] = Field(default_factory=list)
    # When the host has no GPUs, it offers this many CPU slots in their place (default: cores).
    cpu_slots: int | None = None
    default_placement: str = "pack"
    # PATH given to controllers and user commands: this interpreter's bin directory first,
    # so `python` in a manifest command is the platform's Python.
    learner_path: str = Field(default_factory=lambda: _default_learner_path())

    # Where learners run: ``local`` (controller processes on this host) or ``ray`` (on the
    # machines of the Ray cluster at ``ray_address``, its GCS ``HOST:PORT``). ``simulated``
    # is for load tests of the control plane only: learners are simulated by the harness
    # its ``simulated:`` section names (``ffdl.backends.simulated``); nothing runs.
    backend: Literal["local", "ray", "simulated"] = "local"
    simulated: SimulatedConfig | None = None
    ray_address: str | None = None
    # The API address learners report to (default ``api_url``). Learners on other machines
    # cannot reach a loopback address: with Ray, advertise one they can.
    advertise_url: str | None = None
    # HTTPS: ``ffdl up`` (every pool worker too) serves with this certificate (PEM, leaf
    # first, then its chain) and key. ``ca_bundle`` names the CA that signed it when the
    # system's trust store does not hold it: learners get its text to verify the server
    # they report to, and client.json names it for the CLI on this host.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    ca_bundle: Path | None = None
    ray_namespace: str = "ffdl"
    # Each Ray node keeps the job directories of its learners under this root.
    ray_work_root: str = "/tmp/ffdl-ray"
    # Checkpoints of jobs whose manifest names no results object store go to this fsspec URL
    # (a store every node can read: ``file:///shared/ckpt``, ``s3://bucket/prefix``).
    checkpoint_store: str | None = None
    checkpoint_store_options: dict[str, str] = Field(default_factory=dict)
    checkpoint_sync_s: float = Field(default=5.0, gt=0)
    ray_launch_timeout_s: float = Field(default=30.0, gt=0)

    # Replicas sharing one database: each background loop runs in one replica at a time
    # under a lease of this length, renewed every third of it; a replica that stops
    # renewing (dead, frozen, or its loop hung for ``loop_hang_s``) loses it after that.
    lease_ttl_s: float = Field(default=3.0, gt=0)
    # Replicas on PostgreSQL divide the loops among themselves (``ffdl.server.leases``);
    # false keeps every loop in the first replica up, taken over whole on its failure.
    spread_loops: bool = True
    # False: this replica serves the API only and never runs a background loop; replicas
    # with it on run them (``ffdl up --api-only``). PostgreSQL only, whose notifications
    # carry a submission's wake-up to the replica that schedules it.
    run_loops: bool = True
    # GPU use, measured (``ffdl.learner.gpu_sampler``, ``services/gpu_samples.py``): each
    # learner's GPUs are sampled through NVML every ``gpu_sample_s`` (0: never), loading
    # ``nvml_library`` first when set. A job's series keeps ``gpu_samples_kept`` rows per
    # learner, older ones merged into longer spans. A job whose GPUs all stay under
    # ``gpu_idle_util`` percent for ``gpu_idle_after_s`` is flagged as leaving them idle.
    gpu_sample_s: float = Field(default=5.0, ge=0)
    nvml_library: Path | None = None
    gpu_samples_kept: int = Field(default=720, ge=16)
    gpu_idle_util: float = Field(default=5.0, ge=0, le=100)
    gpu_idle_after_s: float = Field(default=600.0, gt=0)

    # The cluster's history (``services/history.py``): one sample of its GPUs and queue
    # this often (0: none), thinned as it ages.
    cluster_sample_s: float = Field(default=10.0, ge=0)

    # A bearer token that may read ``GET /metrics`` (every series) and nothing else: give it
    # to Prometheus rather than a user's token. Unset: only users' tokens scrape.
    metrics_token: str | None = Field(default=None, min_length=16)
    # Above this many nodes ``/metrics`` leaves out the per-node series (three per node:
    # a 10,000-node scrape would carry 30,000 of them); the per-GPU-type totals stay.
    metrics_node_series_max: int = Field(default=1000, ge=0)
    loop_hang_s: float = Field(default=120.0, gt=0)

    # Elastic API pool (``ffdl up --workers MIN..MAX``, ``ffdl.server.pool``): the API is
    # served by MIN..MAX gunicorn worker processes on one address, resized every
    # ``pool_interval_s`` from the load measured over ``pool_window_s``. ``workers`` is
    # "MIN..MAX", or N for a fixed pool; unset: one process, no pool. The rule is in
    # ``pool/policy.py``: grow when any signal stays above its grow threshold for
    # ``pool_grow_after_s``, shrink when all stay below their shrink thresholds for
    # ``pool_shrink_after_s``, then wait ``pool_cooldown_s``. A grow threshold of 0 turns
    # its signal off. A retiring worker finishes what it accepted within ``pool_graceful_s``
    # and closes idle connections after ``pool_keepalive_s``, like any idle connection.
    workers: int | str | None = None
    pool_interval_s: float = Field(default=1.0, gt=0)
    pool_window_s: float = Field(default=5.0, gt=0)
    pool_grow_after_s: float = Field(default=3.0, ge=0)
    pool_shrink_after_s: float = Field(default=30.0, ge=0)
    pool_cooldown_s: float = Field(default=10.0, ge=0)
    pool_step: int = Field(default=1, ge=1)
    pool_min_latency_samples: int = Field(default=20, ge=1)
    pool_grow_in_flight: float = Field(default=4.0, ge=0)  # per worker
    pool_shrink_in_flight: float = Field(default=1.0, ge=0)
    pool_grow_p95_ms: float = Field(default=500.0, ge=0)
    pool_shrink_p95_ms: float = Field(default=100.0, ge=0)
    pool_grow_rps: float = Field(default=0.0, ge=0)  # per worker; off unless set
    pool_shrink_rps: float = Field(default=0.0, ge=0)
    pool_grow_report_in_flight: float = Field(default=2.0, ge=0)  # per worker
    pool_shrink_report_in_flight: float = Field(default=0.5, ge=0)
    pool_grow_report_p95_ms: float = Field(default=1000.0, ge=0)
    pool_shrink_report_p95_ms: float = Field(default=200.0, ge=0)
    pool_graceful_s: int = Field(default=30, ge=1)
    pool_keepalive_s: int = Field(default=5, ge=1)
    # A keep-alive connection is ended (``Connection: close`` on a response) after this long,
    # so that busy clients reconnect and spread over the workers a grown pool adds. 0: never.
    pool_connection_max_s: float = Field(default=2.0, ge=0)

    # Loops and liveness.
    scheduler_interval_s: float = 1.0
    lcm_interval_s: float = 1.0
    monitor_interval_s: float = 1.0
    heartbeat_s: float = 2.0
    heartbeat_timeout_s: float = 30.0
    halt_grace_s: float = 10.0
    deploy_timeout_s: float = 120.0
    # Jobs the lifecycle manager deploys at once (unpacking, launching their learners).
    deploy_concurrency: int = Field(default=4, ge=1, le=64)
    report_deadline_s: float = 600.0
    # Learners' report batches of only log lines and metrics stored at once in a process;
    # batches with a status go ahead of them (``ffdl.server.report_lanes``).
    report_records_at_once: int = Field(default=8, ge=1)
    # The report posts a second a replica asks its learners to keep to, together: each post's
    # answer tells its learner the gap to leave before the next (``ffdl.server.report_pace``),
    # at most a third of ``heartbeat_timeout_s``. 0: no pace asked.
    report_posts_per_s: float = Field(default=15.0, ge=0)

    # Elastic scaling.
    autoscaler_interval_s: float = 30.0
    # What the elastic optimizer maximises: the sum of jobs' logarithmic speed-ups
    # ("proportional") or of their speed-ups ("throughput"); see ffdl.elastic.optimizer.
    elastic_objective: Literal["throughput", "proportional"] = "proportional"
    # What a rescale (a checkpoint-restart) costs a job: ``restart_cost_s`` seconds, charged
    # against the job's age (``ffdl.elastic.optimizer.restart_share``); None charges every
    # job ``restart_penalty`` of its current progress instead.
    restart_cost_s: float | None = Field(default=30.0, ge=0)
    restart_penalty: float = Field(default=0.1, ge=0)
    # A job keeps a new size at least this long. A rescale's cost is charged by the job's
    # age (``restart_cost_s``), which already keeps young jobs from thrashing; a longer hold
    # only kept GPUs from jobs waiting for them (docs/simulations, section 7).
    min_rescale_interval_s: float = 60.0
    # A queued elastic job waiting longer than ``admit_after_s`` gets GPUs that running
    # elastic jobs give up down to their minimums; one waiting longer than
    # ``fairness_after_s`` may also stop a running job that has had its GPUs for
    # ``fairness_turn_s`` (which is then held back as long, so the GPUs go to the waiter).
    admit_after_s: float = Field(default=60.0, ge=0)
    # Two and a half minutes of waiting, turns of five: on Pollux's workloads at twice their
    # load the longest wait went from 360 s (both 300 s) to 210 s, and a running job still
    # keeps its GPUs for five minutes, long enough to earn back a restart that costs more
    # than a minute.
    fairness_after_s: float = Field(default=150.0, ge=0)
    fairness_turn_s: float = Field(default=300.0, ge=0)
    # How fast a GPU of each type trains, relative to the others (e.g. {h100: 3, a100: 1};
    # a type not named counts 1): the speed the elastic optimizer expects of a job on a type
    # before it has run there. Once it has, its own step times there count.
    gpu_speeds: dict[str, float] = Field(default_factory=dict)
    # Fairness between tenants in the elastic objective (``ffdl.elastic.fairness``): none
    # (jobs weigh by priority), max_min (normalised throughput, weighted by quota) or
    # finish_time (jobs behind an equal share weigh more).
    tenant_fairness: Literal["none", "max_min", "finish_time"] = "none"

    # Learner sandbox (local backend): bubblewrap per learner, each job under its own uid
    # drawn from [sandbox_uid_base, sandbox_uid_base + sandbox_uid_count). Off only on the
    # operator's explicit word (``ffdl up --no-sandbox``).
    sandbox: bool = True
    # Learners' memory and CPU limits (as root): each learner gets a cgroup, under
    # ``cgroup_parent`` when set (a cgroup v2 path such as ``/ffdl.slice``, relative to the
    # cgroup mount or absolute; for v1, the same path in the memory and cpu hierarchies),
    # else where ``ffdl.learner.cgroup_placement`` finds one. With ``learner_cgroups`` off,
    # or where no cgroup can be had, each controller watches its learner's memory instead.
    cgroup_parent: str | None = None
    learner_cgroups: bool = True
    sandbox_uid_base: int = Field(default=200_000, ge=1000)
    sandbox_uid_count: int = Field(default=60_000, ge=1)

    # Framework runtimes (``services/runtimes.py``): what ``framework.name``/``version``
    # run on. Frameworks declared here replace the platform's defaults for that framework.
    runtimes: list[RuntimeConfig] = Field(default_factory=list)

    # Host paths that `local` and `mount_volume` data stores may use (default: HOME/stores).
    store_paths: list[Path] = Field(default_factory=list)

    # Object stores (s3_datastore, mount_cos): the server and the controllers connect to the
    # endpoint a manifest names, from the platform's network. Endpoints whose host resolves
    # only to public addresses are allowed (unless object_store_public_endpoints is off);
    # private, loopback, link-local and other internal addresses only when listed here, as
    # URLs ("http://minio.internal:9000"), "host:port" or "host".
    object_store_endpoints: list[str] = Field(default_factory=list)
    object_store_public_endpoints: bool = True
    # A store without an endpoint uses AWS's S3 endpoint for its region, if the operator says so.
    object_store_aws_default: bool = False
    # Endpoints manifests name -> the endpoint actually used, for manifests written for
    # another cluster (FfDL's examples name "http://s3.default.svc.cluster.local"). The
    # endpoint used must still be allowed by the two settings above.
    object_store_endpoint_aliases: dict[str, str] = Field(default_factory=dict)

    # API tokens expire this many days after creation unless created with another lifetime.
    token_ttl_days: float = Field(default=90.0, gt=0)
    # HTTP Basic: the shortest password an admin or a user may set.
    password_min_length: int = Field(default=8, ge=1, le=1024)
    # Take the caller from ``X-Watson-Userinfo: bluemix-instance-id=USER``, as FfDL's gateway
    # sent it. Only behind a proxy that authenticates every request and strips this header
    # from what clients send: anyone can send it, so it is ignored unless this is on.
    trusted_proxy: bool = False

    # Event webhooks (``/v1/models/{id}/events/...``). The server itself makes these
    # requests, so callback hosts are checked against an allow-list: ``public`` admits any
    # host whose addresses are all globally routable; other entries are host names
    # (``hooks.example.com``, ``*.example.com``), IP addresses or networks (``10.0.0.0/8``)
    # admitted whatever they resolve to. An empty list turns registration off.
    webhook_allowed_hosts: list[str] = Field(default_factory=lambda: ["public"])
    webhook_interval_s: float = Field(default=1.0, gt=0)
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    webhook_max_attempts: int = Field(default=8, ge=1)
    webhook_retry_base_s: float = Field(default=1.0, gt=0)  # doubled after each failure
    webhook_retry_max_s: float = Field(default=300.0, gt=0)
    webhook_max_endpoints_per_job: int = Field(default=16, ge=1)

    # Retention: the log lines and metrics of a job that ended this many hours ago move out
    # of the database into ``archive_store`` as compressed chunks and are still served from
    # there (``ffdl.server.services.record_archive``). Off unless set. The job's newest
    # metrics record stays in the database for its summary.
    archive_records_after_h: float | None = Field(default=None, gt=0)
    # A directory, ``file:///DIR`` or ``s3://BUCKET[/PREFIX]`` (default: HOME/archive);
    # S3 connection fields (endpoint, access_key, secret_key, region) in the options.
    archive_store: str | None = None
    archive_store_options: dict[str, str] = Field(default_factory=dict)
    archive_chunk_records: int = Field(default=10_000, ge=100, le=1_000_000)
    archive_interval_s: float = Field(default=60.0, gt=0)

    # Upload limits.
    max_manifest_bytes: int = 1024 * 1024
    max_archive_bytes: int = 512 * 1024 * 1024
    max_archive_files: int = 20_000
    max_unpacked_bytes: int = 2 * 1024 * 1024 * 1024

    @field_validator("advertise_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None  # unset (``FFDL_ADVERTISE_URL=``): learners use ``api_url``
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"advertise_url must be an http(s)://HOST[:PORT] URL, got {value!r}")
        return value.strip()

    @field_validator("tls_cert", "tls_key", "ca_bundle", mode="before")
    @classmethod
    def _optional_path(cls, value: object) -> object:
        # An empty value (``FFDL_TLS_CERT=``) means unset, not the current directory. A
        # relative path is taken from the working directory, once, for every process.
        if isinstance(value, str):
            value = Path(value.strip()) if value.strip() else None
        if isinstance(value, Path):
            return value.expanduser().absolute()
        return value

    @model_validator(mode="after")
    def _certificate_with_key(self) -> Settings:
        if self.tls_cert is not None and self.tls_key is None:
            raise ValueError("tls_cert is set but tls_key is not: HTTPS needs both")
        if self.tls_key is not None and self.tls_cert is None:
            raise ValueError("tls_key is set but tls_cert is not: HTTPS needs both")
        return self

    @model_validator(mode="after")
    def _api_only_on_postgresql(self) -> Settings:
        if not self.run_loops and not self.db_url.startswith("postgresql"):
            raise ValueError(
                "run_loops is false but database_url is not PostgreSQL: a replica that "
                "serves the API only needs replicas that run the loops on a shared "
                "PostgreSQL database"
            )
        return self

    @field_validator("gpu_speeds")
    @classmethod
    def _speeds_positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = sorted(name for name, speed in value.items() if not 0 < speed < math.inf)
        if bad:
            raise ValueError(
                f"every GPU type's speed must be a finite number > 0, not for {', '.join(bad)}"
            )
        return value

    @field_validator("ray_address")
    @classmethod
    def _non_empty_address(cls, value: str | None) -> str | None:
        # An empty value (``FFDL_RAY_ADDRESS=``) means unset, not "an address called ''".
        if value is None:
            return None
        return value.strip() or None

    @field_validator("archive_store")
    @classmethod
    def _archive_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        check_blob_url(value.strip(), "archive_store")
        return value.strip()

    @field_validator("runtimes")
    @classmethod
    def _unambiguous_runtimes(
        cls, value: list[RuntimeConfig], info: ValidationInfo
    ) -> list[RuntimeConfig]:
        check_paths(value, Path(info.data.get("home") or default_home()))
        return check_runtimes(value)

    @property
    def runtimes_dir(self) -> Path:
        """Where built runtime environments are cached."""
        return self.home / "runtimes"

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'ffdl.db'}"

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    @property
    def allowed_store_paths(self) -> list[Path]:
        """Resolved host directories that path-based data stores must lie under."""
        paths = self.store_paths or [self.home / "stores"]
        return [Path(p).expanduser().resolve() for p in paths]

    @property
    def client_config_path(self) -> Path:
        return self.home / "client.json"

    @property
    def api_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def tls(self) -> bool:
        """Whether the API is served over HTTPS."""
        return self.tls_cert is not None

    @property
    def learner_api_url(self) -> str:
        """The API address learners report to: ``advertise_url``, else ``api_url``."""
        return (self.advertise_url or self.api_url).rstrip("/")

    def backend_config(self) -> LocalConfig | RayConfig | SimulatedSetup:
        """The chosen backend's configuration; ValueError when it cannot be built."""
        if self.backend == "simulated":
            if self.simulated is None:
                raise ValueError(
                    "the simulated backend (load tests only) needs a `simulated:` section "
                    "in config.yaml: harness_url, duration_s, lines_per_s, metrics_per_s"
                )
            return SimulatedSetup(self.simulated, self._declared_nodes())
        if self.backend == "ray":
            if not self.ray_address:
                raise ValueError(
                    "the Ray backend needs the Ray cluster's address: set ray_address "
                    "(ffdl up --ray-address HOST:PORT, or FFDL_RAY_ADDRESS)"
                )
            return RayConfig(
                address=self.ray_address,
                home=str(self.home),
                api_url=self.learner_api_url,
                namespace=self.ray_namespace,
                work_root=self.ray_work_root,
                checkpoint_store=self.checkpoint_store,
                checkpoint_store_options=dict(self.checkpoint_store_options),
                checkpoint_sync_s=self.checkpoint_sync_s,
                launch_timeout_s=self.ray_launch_timeout_s,
                learner_path=self.learner_path,
            )
        return LocalConfig(
            home=str(self.home),
            learner_path=self.learner_path,
            sandbox=self.sandbox,
            nodes=self._declared_nodes(),
            cpu_slots=self.cpu_slots,
            cgroup_parent=self.cgroup_parent or "",
            learner_cgroups=self.learner_cgroups,
        )

    def _declared_nodes(self) -> tuple[Node, ...]:
        return tuple(
            Node(
                name=n.name,
                gpus=n.gpus,
                cpus=n.cpus,
                memory_mb=parse_size_mb(n.memory, f"nodes.{n.name}.memory"),
                gpu_type=n.gpu_type,
                labels=dict(n.labels),
            )
            for n in self.nodes
        )

    @classmethod
    def load(cls, home: Path | None = None, **overrides: Any) -> Settings:
        """Settings for ``home``: its config.yaml, then the environment, then ``overrides``."""
        base_home = (home or default_home()).expanduser().resolve()
        file_values: dict[str, Any] = {}
        config_file = base_home / "config.yaml"
        if config_file.exists():
            loaded = yaml.safe_load(config_file.read_text()) or {}
            if not isinstance(loaded, dict):
                raise ValueError(f"{config_file}: expected a mapping")
            file_values = loaded
        # Environment variables beat the file: pydantic-settings gives init kwargs priority,
        # so only pass file values that the environment does not set.
        env_set = {k[len("FFDL_") :].lower() for k in os.environ if k.startswith("FFDL_")}
        values = {k: v for k, v in file_values.items() if k not in env_set}
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["home"] = base_home
        return cls(**values)
