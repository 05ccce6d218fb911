"""What FfDL's learner environment adds for a job's code, and the runtime it runs on.

FfDL's learners set ``GPU_COUNT`` (per learner, formatted ``"%f"``: ``"1.000000"``, so code
does ``int(float(os.environ["GPU_COUNT"]))``), ``LEARNER_NAME_PREFIX`` (learner N is host
``<prefix>-<N-1>``, also reachable as ``<prefix>-<N-1>.<prefix>``), ``TRAINING_COMMAND``
(the command on one line), ``RESULT_BUCKET_DIR`` (``$RESULT_BUCKET_DIR/$TRAINING_ID`` is the
results), ``LOG_DIR`` (``$JOB_STATE_DIR/logs``; TensorBoard files go to ``$LOG_DIR/tb``) and
``DOWNWARD_API_POD_NAME``/``_NAMESPACE``. This module owns those values, ffdl's batch
variables for elastic jobs (global batch, micro-batch, accumulation steps), the learner host
names and addresses in the sandbox, and turning the job's resolved runtime into the learner
spec's ``RuntimeSpec``, its PATH, its pip settings, the paths its sandbox binds and the
programs it places there. Nothing of the control plane (tokens, the API's address, the
platform home, an index's credentials) is ever among the variables.
"""

from __future__ import annotations

import os
import re
import site
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ffdl.core.jobdirs import JobDirs
from ffdl.core.manifest import ElasticSpec, Manifest
from ffdl.core.resources import Placement
from ffdl.elastic.accumulation import job_layout, running_batch
from ffdl.learner.runtime import PLATFORM, PYTHON, RuntimeSpec
from ffdl.learner.sandbox import NETWORK_HOST, SYSTEM_PATHS, SandboxSpec
from ffdl.server.platform import Platform
from ffdl.server.services.runtimes import effective_runtimes, resolve, runtime_digest
from ffdl.server.store.models import Job

# FfDL's learners ran in the Kubernetes namespace its operator configured; "default" unless
# changed. Code reads it only to name things.
POD_NAMESPACE = "default"
_NEWLINES = re.compile(r"\r?\n")


def learner_name_prefix(job_id: str) -> str:
    """FfDL named a job's learners ``learner-<id>-0`` ...; here the id is the job's."""
    suffix = job_id.removeprefix("training-")
    cleaned = re.sub(r"[^a-z0-9-]+", "-", suffix.lower()).strip("-") or "job"
    return f"learner-{cleaned}"[:50].rstrip("-")


def learner_host_name(job_id: str, learner: int) -> str:
    return f"{learner_name_prefix(job_id)}-{learner - 1}"


def learner_address(learner: int) -> str:
    """Learner N's own loopback address (127.1.0.N), where its host names point."""
    return f"127.1.{learner // 256}.{learner % 256}"


def host_entries(job_id: str, num_learners: int) -> list[list[str]]:
    """/etc/hosts entries for every learner of the job: short and FfDL's dotted name."""
    prefix = learner_name_prefix(job_id)
    entries = []
    for learner in range(1, num_learners + 1):
        name = learner_host_name(job_id, learner)
        entries.append([learner_address(learner), name, f"{name}.{prefix}"])
    return entries


def ffdl_variables(
    job_id: str,
    manifest: Manifest,
    learner: int,
    num_learners: int,
    dirs: JobDirs,
    *,
    sandboxed: bool,
) -> dict[str, str]:
    """FfDL's learner variables that the platform's base environment does not already set."""
    # The sandbox binds (without one, a link gives) the learner's own logs at
    # $JOB_STATE_DIR/logs; learners sharing one filesystem keep their own directories.
    shared = sandboxed or dirs.state_logs.is_symlink()
    log_dir = dirs.state_logs if shared else dirs.logs(learner)
    return {
        "GPU_COUNT": f"{float(manifest.gpus):f}",
        "LEARNER_NAME_PREFIX": learner_name_prefix(job_id),
        "TRAINING_COMMAND": _NEWLINES.sub(" ", manifest.framework.command),
        "RESULT_BUCKET_DIR": str(dirs.result_bucket),
        "LOG_DIR": str(log_dir),
        "DOWNWARD_API_POD_NAME": learner_host_name(job_id, learner),
        "DOWNWARD_API_POD_NAMESPACE": POD_NAMESPACE,
    }


def batch_variables(
    manifest: Manifest, gpus: int, batch_size: int | None, gpu_type: str | None = None
) -> dict[str, str]:
    """The global batch a learner runs (``FFDL_BATCH_SIZE``) and, for an elastic job with
    per-GPU limits, how each GPU runs its share: ``FFDL_MICRO_BATCH_SIZE`` samples per
    forward/backward, ``FFDL_ACCUMULATION_STEPS`` of them per optimizer step.

    An elastic job with a batch range starts at its minimum, the batch the optimizer values
    it against, until the autoscaler chooses another.
    """
    told = _batch_told(manifest.elastic, gpus, batch_size, gpu_type)
    if told is None:
        return {}
    variables = {"FFDL_BATCH_SIZE": str(told["batch_size"])}
    if told["micro_batch_size"] is not None:
        variables["FFDL_MICRO_BATCH_SIZE"] = str(told["micro_batch_size"])
        variables["FFDL_ACCUMULATION_STEPS"] = str(told["accumulation_steps"])
    return variables


def in_place_batch(
    manifest: dict[str, Any],
    gpus: int,
    batch_size: int | None,
    placement: list[dict[str, Any]] | None = None,
) -> dict[str, int | None] | None:
    """The batch the running learners of a job that takes a new batch while it runs
    (``elastic.rebatch_in_place``) should use now, as report answers carry it: the same
    values ``batch_variables`` starts them with. None for any other job."""
    raw = manifest.get("elastic")
    if not isinstance(raw, dict) or raw.get("rebatch_in_place") is not True:
        return None
    gpu_type = Placement.from_json(placement or []).gpu_type
    return _batch_told(ElasticSpec.model_validate(raw), gpus, batch_size, gpu_type)


def _batch_told(
    elastic: ElasticSpec | None, gpus: int, batch_size: int | None, gpu_type: str | None
) -> dict[str, int | None] | None:
    batch = running_batch(elastic, batch_size)
    if batch is None:
        return None
    planned = job_layout(elastic, batch, gpus, gpu_type)
    return {
        "batch_size": batch,
        "micro_batch_size": planned.micro_batch if planned is not None else None,
        "accumulation_steps": planned.steps if planned is not None else 1,
    }


def place_learner(
    sandbox: SandboxSpec, job_id: str, learner: int, num_learners: int, dirs: JobDirs
) -> None:
    """Name the learner and its peers in its sandbox and bind its logs at LOG_DIR."""
    sandbox.hostname = learner_host_name(job_id, learner)
    sandbox.hosts = host_entries(job_id, num_learners)
    sandbox.binds.append([str(dirs.logs(learner)), str(dirs.state_logs)])
    sandbox.read_only.append(str(dirs.result_bucket))


# -- runtimes ----------------------------------------------------------------------------


def job_runtime(platform: Platform, job_id: str, manifest: Manifest) -> RuntimeSpec:
    """Resolve the job's runtime again (config may have changed since submit), note its
    name on the job, and describe it for the learner spec.

    A framework that lost every runtime raises the same ManifestError as at submit.
    """
    settings = platform.settings
    resolved = resolve(
        effective_runtimes(settings.runtimes), manifest.framework.name, manifest.framework.version
    ).runtime
    with platform.store.write() as session:
        job = session.get(Job, job_id)
        if job is not None and job.runtime != resolved.label:
            job.runtime = resolved.label
    python = os.path.abspath(sys.executable)
    if not resolved.built:
        return RuntimeSpec(
            name=resolved.label, environment=PLATFORM, python=python, paths=dict(resolved.paths)
        )
    digest = runtime_digest(resolved, python)
    return RuntimeSpec(
        name=resolved.label,
        environment=PYTHON,
        path=str(settings.runtimes_dir / digest[:24]),
        python=python,
        digest=digest,
        requirements=list(resolved.requirements),
        find_links=list(resolved.find_links),
        index_url=resolved.index_url,
        extra_index_urls=list(resolved.extra_index_urls),
        no_index=resolved.no_index,
        paths=dict(resolved.paths),
    )


def runtime_programs(runtime: RuntimeSpec) -> list[list[str]]:
    """The sandbox's programs for the runtime's ``paths``: [host executable, path inside]."""
    return [[str(runtime.executable(name)), inside] for inside, name in runtime.paths.items()]


def _no_secret(url: str) -> bool:
    parts = urlsplit(url)
    return parts.username is None and parts.password is None


def pip_settings(runtime: RuntimeSpec, sandbox: SandboxSpec | None) -> dict[str, str]:
    """pip's settings for the job's command: a built runtime's installer options, and no
    index at all where the learner has no network (the sandbox's own, or none), so that
    ``pip install`` of a package the runtime lacks fails at once instead of retrying.
    Index URLs that carry credentials are left out (they are the operator's)."""
    settings = {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if runtime.built:
        # A wheel directory is shown where it really is (``runtime_read_only``).
        links = [os.path.realpath(x) if x.startswith("/") else x for x in runtime.find_links]
        links = [link for link in links if _no_secret(link)]
        indexes = [url for url in runtime.extra_index_urls if _no_secret(url)]
        if links:
            settings["PIP_FIND_LINKS"] = " ".join(links)
        if runtime.index_url and _no_secret(runtime.index_url):
            settings["PIP_INDEX_URL"] = runtime.index_url
        if indexes:
            settings["PIP_EXTRA_INDEX_URL"] = " ".join(indexes)
        if runtime.no_index:
            settings["PIP_NO_INDEX"] = "1"
    if sandbox is not None and sandbox.network != NETWORK_HOST:
        settings["PIP_NO_INDEX"] = "1"
    return settings


def _platform_bins() -> set[str]:
    return {str(Path(sys.executable).parent), os.path.join(sys.prefix, "bin")}


def runtime_path(runtime: RuntimeSpec, learner_path: str) -> str:
    """PATH for the command: a built environment's ``bin`` first and the platform's own
    interpreter directory left out; the platform's PATH as it is otherwise."""
    if not runtime.built:
        return learner_path
    rest = [p for p in learner_path.split(os.pathsep) if p and p not in _platform_bins()]
    return os.pathsep.join([str(runtime.bin_dir), *rest])


def hidden_platform_packages(bound: list[str]) -> list[str]:
    """The platform's package directories that a built runtime's sandbox would otherwise
    show as files (inside its bound interpreter, or the always visible system)."""
    visible = [*bound, *SYSTEM_PATHS]
    hidden = []
    for directory in sorted({os.path.realpath(p) for p in site.getsitepackages()}):
        if any(directory.startswith(path.rstrip("/") + "/") for path in visible):
            hidden.append(directory)
    return hidden


def runtime_read_only(runtime: RuntimeSpec, home: Path) -> list[str] | None:
    """What a built environment's sandbox binds read-only: the environment (with its copy
    of ``ffdl.sdk``), the interpreter it was made from and its wheel directories (pip
    reads them), and not the platform's packages. None for the platform's environment
    (the sandbox binds the platform's Python)."""
    if not runtime.built:
        return None
    home_text = str(home.resolve())
    paths = [runtime.path]
    links = [link for link in runtime.find_links if os.path.isdir(link)]
    for prefix in sorted({sys.base_prefix, sys.base_exec_prefix}) + links:
        real = os.path.realpath(prefix)
        if real == "/usr" or real.startswith("/usr/"):
            continue  # the system is visible anyway
        inside = real == home_text or real.startswith(home_text + "/")
        if inside or home_text.startswith(real.rstrip("/") + "/"):
            continue  # never the platform home, nor what holds it
        if real not in paths:
            paths.append(real)
    return paths
