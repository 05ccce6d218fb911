"""The files the platform and a learner controller exchange.

The platform writes the spec (``dump_spec``), everything a controller needs to run one
learner, and the controller reads it (``load_spec``); a backend that runs the controller on
another machine moves the spec's paths onto that machine's work root (``rebase_spec``). In
its state directory the controller keeps ``controller.pid`` while it runs and leaves
``result.json`` (``write_result``) when it ends, which the platform reads (``read_result``)
when the controller went silent. This module owns those names, the dataclasses, their JSON
shape and their validation. It uses the standard library only, because the controller must
start fast.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ffdl.core.redact import is_secret_key
from ffdl.learner.runtime import RuntimeSpec, runtime_from_dict
from ffdl.learner.sandbox import NETNS_PREFIX, NETWORK_HOST, NETWORK_NONE, SandboxSpec

# "s3": the data is downloaded from an object store (``DataMount.store``).
OBJECT_STORE_KIND = "s3"
DATA_MOUNT_KINDS = ("local", "mount_volume", OBJECT_STORE_KIND)
# What a connection's secret values become once the controller has read them.
ERASED = "erased"
# A store root that is a directory every node can read (a shared filesystem), not a bucket.
FILE_URL = "file://"
PID_FILE = "controller.pid"
RESULT_FILE = "result.json"
CONTROLLER_LOG = "controller.log"


class SpecError(ValueError):
    """The spec file is unreadable or a field is missing or of the wrong type."""


@dataclass
class ObjectLocation:
    """A ``bucket[/prefix]`` of an S3 store and the connection fields that reach it
    (``S3Connection.to_fields``), or ``file:///store/prefix``, a directory every node sees
    (no connection fields; ``/store`` must exist, ``prefix`` is made as files arrive). The
    secrets are in clear: the spec file is root's alone, and the controller erases them
    from it as soon as it has read them."""

    root: str
    connection: dict[str, str]


@dataclass
class DataMount:
    kind: str
    source: str
    target: str
    # For kind "s3": where the data is; ``source`` then only names it for people.
    store: ObjectLocation | None = None


@dataclass
class LearnerSpec:
    training_id: str
    learner: int
    num_learners: int
    attempt: int
    api_url: str
    job_token: str
    command: str
    workdir: str
    env: dict[str, str]
    data: list[DataMount]
    results_source: str | None
    results_target: str | None
    emetrics_file: str | None
    metric_groups: dict[str, dict[str, Any]]
    state_dir: str
    # None runs the command bare (the operator's --no-sandbox).
    sandbox: SandboxSpec | None = None
    halt_grace_s: float = 10.0
    heartbeat_s: float = 2.0
    report_deadline_s: float = 600.0
    # An object store for the job's results: learner 1 uploads RESULT_DIR (and the code
    # archive under _submitted_code/), every learner its LOG_DIR under learner-N/, and
    # learner 1 keeps ``checkpoint_dir`` in sync under _wml_checkpoints/.
    results_store: ObjectLocation | None = None
    checkpoint_dir: str | None = None
    code_archive: str | None = None
    # The framework runtime the command runs on (None: the platform's environment).
    runtime: RuntimeSpec | None = None
    # This learner's LOG_DIR as the controller reaches it on the host; the command may see
    # it elsewhere (the sandbox binds it at $JOB_STATE_DIR/logs). None: env's LOG_DIR.
    log_dir: str | None = None
    # The manifest's evaluation_metrics: its type (None: none given), ``in:`` as written
    # (the controller expands it against ``env``) and FfDL's line_lookahead.
    metrics_type: str | None = None
    metrics_in: str | None = None
    metrics_line_lookahead: int | None = None
    # The controller cannot reach the platform's disk (another machine): STORING sends the
    # results (learner 1) and LOG_DIR (every learner) to the API instead of copying them to
    # ``results_target``.
    results_via_api: bool = False
    # Where _wml_checkpoints/ lives when there is no ``results_store``: the job's own
    # ``bucket/prefix`` or ``file:///dir`` (a store every node reads); the controller keeps
    # ``checkpoint_dir`` (default: env's CHECKPOINT_DIR) in sync with it as with the
    # results store.
    checkpoint_store: ObjectLocation | None = None
    # While the command runs, learner 1 uploads what changed in CHECKPOINT_DIR to the
    # checkpoint store (results or checkpoint store) this often; None: at the attempt's end.
    checkpoint_sync_s: float | None = None
    # The other control-plane replicas' addresses: reports fail over to them, in this
    # order, while ``api_url`` cannot be reached.
    fallback_urls: list[str] = field(default_factory=list)
    # Where reports go, in this order (the first that answers): the replicas spread their
    # learners' reports between them. Empty: ``api_url``, then ``fallback_urls``.
    report_urls: list[str] = field(default_factory=list)
    # Sample the learner's GPUs through NVML this often (None or 0: never), loading
    # ``nvml_library`` first when given (``ffdl.learner.gpu_sampler``).
    gpu_sample_s: float | None = None
    nvml_library: str | None = None
    # The PEM text of the CA that signed the API's certificate, when the system's trust store
    # does not hold it (``ffdl.core.tls``); None: the trust store verifies it.
    ca_pem: str | None = None


def learner_log_dir(spec: LearnerSpec) -> str | None:
    """The learner's LOG_DIR on the host: what the controller writes, reads and uploads."""
    return spec.log_dir or spec.env.get("LOG_DIR")


def learner_checkpoint_dir(spec: LearnerSpec) -> str | None:
    """The CHECKPOINT_DIR the controller saves to and restores into its store, if any."""
    if spec.checkpoint_dir or spec.checkpoint_store is None:
        return spec.checkpoint_dir
    return spec.env.get("CHECKPOINT_DIR")


def report_targets(spec: LearnerSpec) -> list[str]:
    """The API addresses a learner reports to, in the order it tries them."""
    return list(dict.fromkeys(spec.report_urls or [spec.api_url, *spec.fallback_urls]))


def checkpoint_location(spec: LearnerSpec) -> ObjectLocation | None:
    """The store that holds the job's _wml_checkpoints/: its results store, else its
    checkpoint store."""
    return spec.results_store or spec.checkpoint_store


def host_path(spec: LearnerSpec, path: str) -> str:
    """A path as the learner's command sees it (e.g. ``$LOG_DIR/tb``), as the host has it."""
    seen, host = spec.env.get("LOG_DIR"), spec.log_dir
    if seen and host:
        inside = os.path.normpath(path)
        if inside == seen or inside.startswith(seen.rstrip("/") + "/"):
            return host + inside[len(seen) :]
    return path


@dataclass
class LearnerResult:
    """How a learner attempt ended, as reported last and left in ``result.json``."""

    status: str
    exit_code: int | None = None
    error_code: str | None = None
    reason: str | None = None
    time: float | None = None


def spec_to_dict(spec: LearnerSpec) -> dict[str, Any]:
    return asdict(spec)


def _require(document: dict[str, Any], name: str, kinds: type | tuple[type, ...]) -> Any:
    if name not in document:
        raise SpecError(f"spec field {name!r} is missing")
    value = document[name]
    # bool is an int subclass, but a flag where a number belongs is a mistake, not a 1.
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise SpecError(f"spec field {name!r} has the wrong type: {type(value).__name__}")
    return value


def _optional_str(document: dict[str, Any], name: str) -> str | None:
    value = document.get(name)
    if value is not None and not isinstance(value, str):
        raise SpecError(f"spec field {name!r} must be a string or null")
    return value


def _number(document: dict[str, Any], name: str, default: float) -> float:
    if document.get(name) is None:
        return default
    value = _require(document, name, (int, float))
    if value <= 0:
        raise SpecError(f"spec field {name!r} must be positive")
    return float(value)


def _object_location(raw: Any, name: str) -> ObjectLocation | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise SpecError(f"spec field {name!r} must be an object or null")
    root, connection = raw.get("root"), raw.get("connection")
    if isinstance(root, str) and root.startswith(FILE_URL):
        directory = root[len(FILE_URL) :]
        if not os.path.isabs(directory) or ".." in directory.split("/"):
            raise SpecError(f"spec field '{name}.root' must be file:// and an absolute path")
    elif not isinstance(root, str) or not root.strip("/"):
        raise SpecError(f"spec field '{name}.root' must be a bucket name")
    if not isinstance(connection, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in connection.items()
    ):
        raise SpecError(f"spec field '{name}.connection' must map strings to strings")
    return ObjectLocation(root=root, connection=dict(connection))


def _data_mounts(raw: Any) -> list[DataMount]:
    if not isinstance(raw, list):
        raise SpecError("spec field 'data' must be a list")
    mounts = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise SpecError(f"spec field 'data[{index}]' must be an object")
        kind, source, target = (entry.get(key) for key in ("kind", "source", "target"))
        if not (isinstance(kind, str) and isinstance(source, str) and isinstance(target, str)):
            raise SpecError(f"spec field 'data[{index}]' needs string kind, source and target")
        if kind not in DATA_MOUNT_KINDS:
            raise SpecError(f"spec field 'data[{index}].kind' must be one of {DATA_MOUNT_KINDS}")
        store = _object_location(entry.get("store"), f"data[{index}].store")
        if kind == OBJECT_STORE_KIND and store is None:
            raise SpecError(f"spec field 'data[{index}].store' is required for kind s3")
        local_source = kind == OBJECT_STORE_KIND or os.path.isabs(source)
        if not (local_source and os.path.isabs(target)):
            raise SpecError(f"spec field 'data[{index}]' needs absolute source and target")
        mounts.append(DataMount(kind=kind, source=source, target=target, store=store))
    return mounts


def _string_list(raw: Any, name: str) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise SpecError(f"spec field {name!r} must be a list of strings")
    if not all(os.path.isabs(item) for item in raw):
        raise SpecError(f"spec field {name!r} must hold absolute paths")
    return list(raw)


def _sandbox(raw: Any) -> SandboxSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise SpecError("spec field 'sandbox' must be an object or null")
    uid = _require(raw, "uid", int)
    gid = _require(raw, "gid", int)
    if uid <= 0 or gid <= 0:
        raise SpecError("spec field 'sandbox.uid'/'sandbox.gid' must not be root")
    network = raw.get("network", NETWORK_NONE)
    if not isinstance(network, str) or not (
        network in (NETWORK_NONE, NETWORK_HOST) or network.startswith(NETNS_PREFIX)
    ):
        raise SpecError("spec field 'sandbox.network' must be none, host or netns:NAME")
    volumes = raw.get("volumes") or []
    if not isinstance(volumes, list) or not all(
        isinstance(v, list) and len(v) == 2 and all(isinstance(p, str) for p in v) for v in volumes
    ):
        raise SpecError("spec field 'sandbox.volumes' must be a list of [source, target]")
    memory = raw.get("memory_bytes")
    cpus = raw.get("cpus")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int)):
        raise SpecError("spec field 'sandbox.memory_bytes' must be an integer or null")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float)):
        raise SpecError("spec field 'sandbox.cpus' must be a number or null")
    return SandboxSpec(
        uid=uid,
        gid=gid,
        read_only=_string_list(raw.get("read_only") or [], "sandbox.read_only"),
        read_write=_string_list(raw.get("read_write") or [], "sandbox.read_write"),
        volumes=[list(v) for v in volumes],
        network=network,
        gpu_devices=_string_list(raw.get("gpu_devices") or [], "sandbox.gpu_devices"),
        memory_bytes=memory,
        cpus=float(cpus) if cpus is not None else None,
        cgroup=str(raw.get("cgroup") or ""),
        cgroup_parent=str(raw.get("cgroup_parent") or ""),
        privileged=bool(raw.get("privileged", True)),
        binds=_pairs(raw.get("binds") or [], "sandbox.binds"),
        hostname=str(raw.get("hostname") or "learner"),
        hosts=_host_entries(raw.get("hosts") or []),
        hidden=_string_list(raw.get("hidden") or [], "sandbox.hidden"),
        programs=_pairs(raw.get("programs") or [], "sandbox.programs"),
    )


def _pairs(raw: Any, name: str) -> list[list[str]]:
    if not isinstance(raw, list) or not all(
        isinstance(v, list) and len(v) == 2 and all(isinstance(p, str) for p in v) for v in raw
    ):
        raise SpecError(f"spec field {name!r} must be a list of [source, target]")
    if not all(os.path.isabs(p) for v in raw for p in v):
        raise SpecError(f"spec field {name!r} must hold absolute paths")
    return [list(v) for v in raw]


def _host_entries(raw: Any) -> list[list[str]]:
    if not isinstance(raw, list) or not all(
        isinstance(v, list) and len(v) >= 2 and all(isinstance(p, str) and p.strip() for p in v)
        for v in raw
    ):
        raise SpecError("spec field 'sandbox.hosts' must be a list of [address, name, ...]")
    if any(any(c.isspace() for c in p) for v in raw for p in v):
        raise SpecError("spec field 'sandbox.hosts' must not hold white space")
    return [list(v) for v in raw]


def _runtime(raw: Any) -> RuntimeSpec | None:
    try:
        return runtime_from_dict(raw)
    except ValueError as exc:
        raise SpecError(f"spec field 'runtime': {exc}") from exc


def spec_from_dict(document: dict[str, Any]) -> LearnerSpec:
    """Validate a decoded spec document; raise ``SpecError`` naming the first bad field."""
    if not isinstance(document, dict):
        raise SpecError("the spec must be a JSON object")
    env = _require(document, "env", dict)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise SpecError("spec field 'env' must map strings to strings")
    groups = document.get("metric_groups") or {}
    if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
        raise SpecError("spec field 'metric_groups' must map names to objects")
    learner = _require(document, "learner", int)
    num_learners = _require(document, "num_learners", int)
    if not 1 <= learner <= num_learners:
        raise SpecError("spec field 'learner' must be between 1 and num_learners")
    api_url = _require(document, "api_url", str)
    if not api_url.startswith(("http://", "https://")):
        raise SpecError("spec field 'api_url' must be an http(s) URL")
    return LearnerSpec(
        training_id=_require(document, "training_id", str),
        learner=learner,
        num_learners=num_learners,
        attempt=_require(document, "attempt", int),
        api_url=api_url,
        job_token=_require(document, "job_token", str),
        command=_require(document, "command", str),
        workdir=_require(document, "workdir", str),
        env=dict(env),
        data=_data_mounts(document.get("data") or []),
        results_source=_optional_str(document, "results_source"),
        results_target=_optional_str(document, "results_target"),
        emetrics_file=_optional_str(document, "emetrics_file"),
        metric_groups=dict(groups),
        state_dir=_require(document, "state_dir", str),
        sandbox=_sandbox(document.get("sandbox")),
        halt_grace_s=_number(document, "halt_grace_s", 10.0),
        heartbeat_s=_number(document, "heartbeat_s", 2.0),
        report_deadline_s=_number(document, "report_deadline_s", 600.0),
        results_store=_object_location(document.get("results_store"), "results_store"),
        checkpoint_dir=_optional_str(document, "checkpoint_dir"),
        code_archive=_optional_str(document, "code_archive"),
        runtime=_runtime(document.get("runtime")),
        log_dir=_optional_str(document, "log_dir"),
        metrics_type=_optional_str(document, "metrics_type"),
        metrics_in=_optional_str(document, "metrics_in"),
        metrics_line_lookahead=_optional_count(document, "metrics_line_lookahead"),
        results_via_api=_flag(document, "results_via_api"),
        checkpoint_store=_object_location(document.get("checkpoint_store"), "checkpoint_store"),
        checkpoint_sync_s=_optional_number(document, "checkpoint_sync_s"),
        fallback_urls=_urls(document, "fallback_urls"),
        report_urls=_urls(document, "report_urls"),
        gpu_sample_s=_optional_number(document, "gpu_sample_s"),
        nvml_library=_optional_str(document, "nvml_library"),
        ca_pem=_optional_str(document, "ca_pem"),
    )


def _urls(document: dict[str, Any], name: str) -> list[str]:
    value = document.get(name) or []
    if not isinstance(value, list) or not all(
        isinstance(url, str) and url.startswith(("http://", "https://")) for url in value
    ):
        raise SpecError(f"spec field {name!r} must be a list of http(s) URLs")
    return list(value)


def _flag(document: dict[str, Any], name: str) -> bool:
    value = document.get(name, False)
    if not isinstance(value, bool):
        raise SpecError(f"spec field {name!r} must be true or false")
    return value


def _optional_number(document: dict[str, Any], name: str) -> float | None:
    if document.get(name) is None:
        return None
    return _number(document, name, 0.0)


def _optional_count(document: dict[str, Any], name: str) -> int | None:
    if document.get(name) is None:
        return None
    value = _require(document, name, int)
    if value < 1:
        raise SpecError(f"spec field {name!r} must be at least 1")
    return int(value)


def load_spec(path: str | os.PathLike[str]) -> LearnerSpec:
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read spec {os.fspath(path)}: {exc}") from exc
    return spec_from_dict(document)


def write_private_json(path: str | os.PathLike[str], document: Any) -> None:
    """Write JSON atomically with mode 0600: readers see the old file or the new, whole."""
    target = Path(path)
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def dump_spec(spec: LearnerSpec, path: str | os.PathLike[str]) -> None:
    write_private_json(path, spec_to_dict(spec))


def _erased(connection: Any) -> Any:
    if not isinstance(connection, dict):
        return connection
    return {
        key: ERASED if is_secret_key(str(key)) and value else value
        for key, value in connection.items()
    }


def erase_spec_secrets(path: str | os.PathLike[str]) -> bool:
    """Overwrite the object-store secrets in a spec file with ``erased`` (the controller
    holds them in memory from then on). True when there were any."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(document, dict):
        return False
    before = json.dumps(document, sort_keys=True)
    for mount in document.get("data") or []:
        if isinstance(mount, dict) and isinstance(mount.get("store"), dict):
            mount["store"]["connection"] = _erased(mount["store"].get("connection"))
    for name in ("results_store", "checkpoint_store"):
        if isinstance(document.get(name), dict):
            document[name]["connection"] = _erased(document[name].get("connection"))
    if json.dumps(document, sort_keys=True) == before:
        return False
    write_private_json(path, document)
    return True


def rebase_spec(spec: LearnerSpec, old_home: str, new_home: str) -> LearnerSpec:
    """A copy of ``spec`` whose paths under ``old_home`` (the control plane's home) lie
    under ``new_home`` (a node's work root) instead.

    Moved: every path field, each data mount's target, every env value (each part of a
    ``:``-separated one, such as PATH), the runtime's paths and the sandbox's. Kept as they
    are: a data mount's source and a sandbox volume's source (the operator's paths, which
    must exist on the node as written) and store roots (shared by every node).
    """
    old = old_home.rstrip("/") or "/"
    new = new_home.rstrip("/") or "/"

    def move(path: str) -> str:
        if path == old:
            return new
        if old != "/" and path.startswith(old + "/"):
            return new + path[len(old) :]
        return path

    def maybe(path: str | None) -> str | None:
        return move(path) if path is not None else None

    rebased = copy.deepcopy(spec)
    rebased.workdir = move(spec.workdir)
    rebased.state_dir = move(spec.state_dir)
    rebased.log_dir = maybe(spec.log_dir)
    rebased.checkpoint_dir = maybe(spec.checkpoint_dir)
    rebased.results_source = maybe(spec.results_source)
    rebased.results_target = maybe(spec.results_target)
    rebased.emetrics_file = maybe(spec.emetrics_file)
    rebased.code_archive = maybe(spec.code_archive)
    rebased.metrics_in = maybe(spec.metrics_in)
    rebased.env = {
        key: ":".join(move(part) for part in value.split(":")) for key, value in spec.env.items()
    }
    for mount in rebased.data:
        mount.target = move(mount.target)
    if (runtime := rebased.runtime) is not None:
        runtime.path = move(runtime.path)
        runtime.python = move(runtime.python)
        runtime.find_links = [move(link) for link in runtime.find_links]
    if (box := rebased.sandbox) is not None:
        box.read_only = [move(path) for path in box.read_only]
        box.read_write = [move(path) for path in box.read_write]
        box.volumes = [[source, move(target)] for source, target in box.volumes]
        box.binds = [[move(source), move(target)] for source, target in box.binds]
        box.hidden = [move(path) for path in box.hidden]
        box.programs = [[move(executable), inside] for executable, inside in box.programs]
    return rebased


def write_result(state_dir: str | os.PathLike[str], result: LearnerResult) -> None:
    document = asdict(result)
    if document["time"] is None:
        document["time"] = time.time()
    write_private_json(Path(state_dir) / RESULT_FILE, document)


def read_result(state_dir: str | os.PathLike[str]) -> LearnerResult | None:
    """The result a controller left, or None when there is none (yet) or it is unreadable."""
    try:
        document = json.loads((Path(state_dir) / RESULT_FILE).read_text(encoding="utf-8"))
        return LearnerResult(
            status=str(document["status"]),
            exit_code=document.get("exit_code"),
            error_code=document.get("error_code"),
            reason=document.get("reason"),
            time=document.get("time"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
