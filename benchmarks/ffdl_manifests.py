"""How many of FfDL's own manifests ffdl accepts unchanged, and how many run to completion.

Given a directory of FfDL manifest files (``--manifests DIR``), this starts moto's S3 server
and an ffdl platform, both on 127.0.0.1, configured as an operator migrating from FfDL would:

- a runtime on the platform's environment for every framework the manifests name, with
  ``/opt/conda/bin/python`` (where FfDL's learner images had their interpreter) provided in
  the sandbox as its interpreter (``paths``);
- given a wheelhouse (``--wheels DIR``, an operator's directory of wheels), for each
  framework version whose commands install packages first (``pip install keras``), a
  runtime built from it offline (``find_links``, ``no_index``) that already has them, as
  that version's FfDL image had (with TensorBoard where its manifests write summaries);
- every object-store endpoint the manifests name (FfDL's in-cluster
  ``http://s3.default.svc.cluster.local``, IBM Cloud hosts...) aliased to the S3 server
  (``object_store_endpoint_aliases``), public endpoints off, so that no name a manifest
  writes is ever resolved or reached;
- virtual nodes as large as the largest learner any manifest asks for;
- a host-mount path a manifest names allowed in ``store_paths`` (created for the run and
  removed afterwards, only if it did not exist).

It then places what each manifest needs: its buckets (training data and results) in the S3
server with FfDL's ``test``/``test`` credentials (the S3 server accepts any), a stand-in file
for every ``$DATA_DIR/...`` path the command names, and stand-in code for every script the
command runs (``*.py``, ``*.sh``, ``keras-test/mnist_cnn.py``, a script under ``$DATA_DIR``):
a few lines that read FfDL's environment (``int(float(GPU_COUNT))``, ``LEARNER_ID``, the
directories), check that the data files are there, write TensorBoard scalars where the
manifest's metrics are ``tensorboard``, run the command a wrapper script wraps, and write a
result file. Each manifest file is submitted byte for byte. A command that needs what cannot
exist here (the ``caffe`` binary) fails: that is the true result, and the table says why.

    python benchmarks/ffdl_manifests.py --manifests DIR

Prints one row per manifest (accepted, or the 400's description; the final status, with the
reason when not COMPLETED), then ``accepted unchanged: N/T`` and ``ran to completion: M/T``.
Must run as root: the learners' sandbox then gives every job a network namespace of its own,
so a command's ``pip install`` cannot reach beyond the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
import yaml

from _server import FAST_CONFIG, LiveServer, moto_process  # isort: skip

from ffdl.core.errors import FfdlError
from ffdl.core.manifest import Manifest, parse_manifest

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "HALTED"}
# FfDL's development object store took these; the S3 server here accepts any.
REGION = "us-east-1"
DATA_PATH = re.compile(r"\$\{?DATA_DIR\}?/([^\s;'\"&|()<>`]*)")
SCRIPT = re.compile(r"(?<![\w/.$}-])((?:\$\{?MODEL_DIR\}?/|\./)?[\w][\w./-]*\.(?:py|sh))(?![\w.])")
OTHER_CODE = re.compile(r"(?<![\w/.$}-])([\w][\w./-]*\.(?:prototxt|cfg|json|yaml|yml))(?![\w.])")
SOURCED = re.compile(r"(?:^|[;&|]|\s)(?:\.|source)\s+([\w./-]+)")
PYTHONS = ("python", "python3")
PIP_INSTALL = re.compile(r"\bpip3? install ((?:[\w.-]+\s*)+)")
# FfDL's learner images had their interpreter here; commands call it by this path.
IMAGE_PATHS = {"/opt/conda/bin/python": "python"}
# Loaded first by the server's interpreter: records every name it looks up (DNS audit).
DNS_AUDIT = """
import os, sys

def _audit(event, args):
    if event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"):
        with open(os.environ["BENCH_DNS_LOG"], "a") as log:
            log.write(f"{args[0]}\\n")

if os.environ.get("BENCH_DNS_LOG"):
    sys.addaudithook(_audit)
"""


# -- what a manifest needs ---------------------------------------------------------------


@dataclass
class Needs:
    """What one manifest file names: parsed by ffdl for sizing, never changed."""

    path: Path
    text: str
    manifest: Manifest | None
    document: dict[str, Any]
    data_paths: list[str] = field(default_factory=list)
    scripts: dict[str, bool] = field(default_factory=dict)  # path -> run as ./path
    other_code: list[str] = field(default_factory=list)
    sourced: list[str] = field(default_factory=list)

    @property
    def store(self) -> dict[str, Any]:
        stores = self.document.get("data_stores") or [{}]
        first: dict[str, Any] = stores[0] if isinstance(stores[0], dict) else {}
        return first

    @property
    def command(self) -> str:
        return self.manifest.framework.command if self.manifest else ""

    @property
    def tensorboard_in(self) -> str | None:
        metrics = self.manifest.evaluation_metrics if self.manifest else None
        if metrics is None or metrics.type != "tensorboard":
            return None
        return metrics.in_ or "$LOG_DIR/tb"


def read_needs(path: Path) -> Needs:
    text = path.read_text(encoding="utf-8")
    try:
        manifest: Manifest | None = parse_manifest(text)
    except FfdlError:
        manifest = None
    loaded = yaml.safe_load(text)
    needs = Needs(path, text, manifest, loaded if isinstance(loaded, dict) else {})
    command = needs.command
    spans: list[tuple[int, int]] = []
    for match in DATA_PATH.finditer(command):
        spans.append(match.span())
        if match.group(1) and match.group(1) not in needs.data_paths:
            needs.data_paths.append(match.group(1))
    for match in SCRIPT.finditer(command):
        if any(start <= match.start() < end for start, end in spans):
            continue  # a script that lives in the data ($DATA_DIR/...): placed with it
        raw = match.group(1)
        name = re.sub(r"^(\$\{?MODEL_DIR\}?/|\./)", "", raw)
        needs.scripts[name] = needs.scripts.get(name, False) or raw.startswith("./")
    needs.other_code = sorted(
        {m.group(1) for m in OTHER_CODE.finditer(command)} - set(needs.scripts)
    )
    needs.sourced = [m.group(1) for m in SOURCED.finditer(command) if m.group(1) != "/"]
    return needs


def endpoint_url(value: str) -> str:
    return value if "://" in value else f"https://{value}"


def is_host_name(url: str) -> bool:
    host = re.sub(r"^[a-z]+://", "", url.lower()).split("/")[0].split(":")[0]
    return bool(
        re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*", host)
    )


# -- stand-ins ---------------------------------------------------------------------------

PYTHON_STAND_IN = '''#!/usr/bin/env python3
"""Stand-in for {name}: reads FfDL's learner environment as FfDL code did, checks the data
files the command names, writes TensorBoard scalars when the manifest asks for them, runs
the command it wraps (a launcher), and writes a result file."""
import json, os, subprocess, sys

NAME, NEEDED, BOARD = {name!r}, {needed!r}, {board!r}
env = os.environ
learner, learners = int(env["LEARNER_ID"]), int(env["NUM_LEARNERS"])
gpus = int(float(env["GPU_COUNT"]))
for key in ("DATA_DIR", "RESULT_DIR", "LOG_DIR", "JOB_STATE_DIR", "MODEL_DIR",
            "LEARNER_NAME_PREFIX", "TRAINING_ID", "TRAINING_COMMAND", "RESULT_BUCKET_DIR"):
    if not env.get(key):
        sys.exit(f"{{NAME}}: FfDL variable {{key}} is not set")
missing = [p for p in NEEDED if not os.path.exists(os.path.join(env["DATA_DIR"], p))]
if missing:
    sys.exit(f"{{NAME}}: data files missing from DATA_DIR: {{missing}}")
print(f"{{NAME}}: learner {{learner}} of {{learners}}, {{gpus}} GPUs, "
      f"{{len(NEEDED)}} data paths found, args {{sys.argv[1:]}}", flush=True)
if BOARD:
    from tensorboard.summary import Writer

    writer = Writer(os.path.expandvars(BOARD))
    for step in range(1, 4):
        writer.add_scalar("accuracy", step / 3, step)
        writer.add_scalar("loss", 1.0 / step, step)
    writer.close()
rest = sys.argv[1:]
if rest and os.path.basename(rest[0]) in {pythons!r}:
    code = subprocess.call(rest)
    if code:
        sys.exit(code)
os.makedirs(env["RESULT_DIR"], exist_ok=True)
out = os.path.join(env["RESULT_DIR"], f"{{os.path.basename(NAME)}}-learner-{{learner}}.json")
with open(out, "w") as handle:
    json.dump({{"script": NAME, "learner": learner, "gpus": gpus}}, handle)
'''

SHELL_STAND_IN = """#!/bin/bash
# Stand-in for {name}: reads FfDL's learner environment, checks the data files the command
# names, writes what the command sources next, and a result file.
set -e
echo "{name}: learner $LEARNER_ID of $NUM_LEARNERS, ${{GPU_COUNT%.*}} GPUs"
for needed in {needed}; do
  [ -e "$DATA_DIR/$needed" ] || {{ echo "{name}: $needed missing from DATA_DIR"; exit 1; }}
done
{sourced}
mkdir -p "$RESULT_DIR"
echo "$LEARNER_ID" > "$RESULT_DIR/$(basename {name})-learner-$LEARNER_ID.txt"
"""

# What FfDL's setup scripts left for the command to source: the launch parameters.
SOURCED_ENV = """cat > {target} <<EOF
export node_rank=$((LEARNER_ID - 1))
export master_node=$LEARNER_NAME_PREFIX-0
export NUM_GPUS=${{GPU_COUNT%.*}}
EOF"""


def python_stand_in(name: str, needs: Needs) -> str:
    return PYTHON_STAND_IN.format(
        name=name, needed=needs.data_paths, board=needs.tensorboard_in, pythons=PYTHONS
    )


def shell_stand_in(name: str, needs: Needs) -> str:
    needed = " ".join(f"'{p}'" for p in needs.data_paths if "'" not in p) or "''"
    needed_loop = needed if needed != "''" else ""
    sourced = "\n".join(SOURCED_ENV.format(target=target) for target in needs.sourced)
    return SHELL_STAND_IN.format(name=name, needed=needed_loop, sourced=sourced)


def stand_in(name: str, needs: Needs) -> str:
    return shell_stand_in(name, needs) if name.endswith(".sh") else python_stand_in(name, needs)


def code_archive(needs: Needs) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        entries = {
            name: (stand_in(name, needs), executable) for name, executable in needs.scripts.items()
        }
        for name in needs.other_code:
            entries[name] = (f"# stand-in for {name}\n", False)
        if not entries:
            entries["README"] = ("no code named by the command\n", False)
        for name, (text, executable) in entries.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            mode = 0o755 if executable or name.endswith(".sh") else 0o644
            info.external_attr = (0o100000 | mode) << 16
            archive.writestr(info, text)
    return buffer.getvalue()


def data_objects(needs: Needs) -> dict[str, bytes]:
    """Stand-in files for the data paths the command names (a directory gets one file)."""
    objects: dict[str, bytes] = {}
    for path in needs.data_paths:
        if path.endswith("/"):
            objects[f"{path}part-00000"] = b"stand-in data\n"
        elif path.endswith((".py", ".sh")):
            objects[path] = stand_in(path, needs).encode()
        else:
            objects[path] = f"stand-in data for {path}\n".encode()
    return objects


# -- the S3 server and the platform ------------------------------------------------------


def s3_client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name=REGION,
    )


def place_object_data(endpoint: str, all_needs: list[Needs]) -> None:
    client = s3_client(endpoint)
    made: set[str] = set()
    for needs in all_needs:
        store = needs.store
        if needs.manifest is None or store.get("type") not in ("mount_cos", "s3_datastore", "s3"):
            continue
        for section in ("training_data", "training_results"):
            container = str((store.get(section) or {}).get("container") or "")
            if not container:
                continue
            bucket, _, prefix = container.partition("/")
            if bucket not in made:
                client.create_bucket(Bucket=bucket)
                made.add(bucket)
            if section == "training_data":
                for key, body in data_objects(needs).items():
                    full = f"{prefix.rstrip('/')}/{key}" if prefix else key
                    client.put_object(Bucket=bucket, Key=full, Body=body)


@contextlib.contextmanager
def host_paths(all_needs: list[Needs], wanted: bool) -> Iterator[list[str]]:
    """Create the host-mount paths the manifests name (only those that do not exist yet),
    with their data; remove them afterwards."""
    created: list[Path] = []
    allowed: list[str] = []
    try:
        for needs in all_needs:
            store = needs.store
            root = str((store.get("connection") or {}).get("path") or "")
            if not wanted or store.get("type") not in ("mount_volume", "local") or not root:
                continue
            base = Path(root)
            if not base.is_absolute():
                continue
            if not base.exists():
                base.mkdir(parents=True)
                created.append(base)
            elif base not in created:
                print(f"note: {base} exists already; its data is not placed or removed")
                continue
            allowed.append(str(base))
            for section in ("training_data", "training_results"):
                container = str((store.get(section) or {}).get("container") or "")
                if container:
                    (base / container).mkdir(parents=True, exist_ok=True)
            data = str((store.get("training_data") or {}).get("container") or "")
            for key, body in data_objects(needs).items():
                target = base / data / key
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(body)
        yield sorted(set(allowed))
    finally:
        for path in created:
            shutil.rmtree(path, ignore_errors=True)


def declared_runtimes(all_needs: list[Needs], wheels: Path | None) -> list[dict[str, Any]]:
    """The runtimes an FfDL operator declares for these manifests: the platform's
    environment for every framework, with FfDL's image interpreter path; and, given a
    wheelhouse, for each framework version whose commands install packages first (``pip
    install keras``), a runtime built offline from it that already has them, as that
    version's FfDL image did (with TensorBoard where its manifests write summaries)."""
    parsed = [n.manifest for n in all_needs if n.manifest is not None]
    frameworks = sorted({m.framework.name.lower() for m in parsed})
    runtimes: list[dict[str, Any]] = [
        {"framework": name, "environment": "platform", "paths": IMAGE_PATHS} for name in frameworks
    ]
    if wheels is None:
        return runtimes
    installing: dict[tuple[str, str], set[str]] = {}
    for manifest in parsed:
        for match in PIP_INSTALL.finditer(manifest.framework.command):
            key = (manifest.framework.name.lower(), manifest.framework.version or "*")
            installing.setdefault(key, set()).update(match.group(1).split())
    for needs in all_needs:
        if needs.manifest is None or needs.tensorboard_in is None:
            continue
        declared = needs.manifest.framework
        summarised = (declared.name.lower(), declared.version or "*")
        if summarised in installing:
            installing[summarised].add("tensorboard")
    for (framework, version), packages in sorted(installing.items()):
        runtimes.append(
            {
                "framework": framework,
                "version": version,
                "requirements": sorted(packages),
                "find_links": [str(wheels)],
                "no_index": True,
                "paths": IMAGE_PATHS,
            }
        )
    return runtimes


def platform_config(
    all_needs: list[Needs], moto: str, store_paths: list[str], wheels: Path | None
) -> dict[str, Any]:
    parsed = [n.manifest for n in all_needs if n.manifest is not None]
    aliases: dict[str, str] = {}
    for needs in all_needs:
        connection = needs.store.get("connection") or {}
        for key in ("auth_url", "endpoint", "endpoint_url"):
            value = str(connection.get(key) or "").strip()
            if value and is_host_name(endpoint_url(value)):
                aliases[endpoint_url(value)] = moto
    gpus = max([m.resources.gpus for m in parsed] or [1])
    cpus = max([m.resources.cpus for m in parsed] or [1.0])
    memory = max([m.resources.memory_mb for m in parsed] or [1024])
    learners = max([m.learners for m in parsed] or [1])
    nodes = [
        {"name": f"node-{i}", "gpus": gpus, "cpus": cpus, "memory": f"{memory}MiB"}
        for i in range(max(4, learners))
    ]
    return {
        **FAST_CONFIG,
        "sandbox": True,
        "nodes": nodes,
        "runtimes": declared_runtimes(all_needs, wheels),
        "object_store_endpoints": [moto],
        "object_store_public_endpoints": False,
        "object_store_endpoint_aliases": aliases,
        "store_paths": store_paths,
    }


# -- submitting and waiting --------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    accepted: bool = False
    refusal: str = ""
    job_id: str = ""
    status: str = ""
    reason: str = ""
    emetrics: int | None = None


def submit(client: httpx.Client, needs: Needs) -> Outcome:
    outcome = Outcome(needs.path.name)
    response = client.post(
        "/v1/models",
        files={
            "manifest": (needs.path.name, needs.text.encode(), "application/octet-stream"),
            "model_definition": ("model.zip", code_archive(needs), "application/zip"),
        },
    )
    if response.status_code == 201:
        outcome.accepted, outcome.job_id = True, str(response.json()["model_id"])
    else:
        try:
            outcome.refusal = str(response.json().get("description") or response.text)
        except ValueError:
            outcome.refusal = response.text
        outcome.refusal = f"{response.status_code}: {outcome.refusal}"
    return outcome


def wait_all(client: httpx.Client, outcomes: list[Outcome], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = {o.job_id: o for o in outcomes if o.accepted}
    while pending and time.monotonic() < deadline:
        listed = client.get("/v1/models", params={"limit": 1000}).json()["models"]
        for model in listed:
            outcome = pending.get(model["model_id"])
            status = model["training"]["training_status"]["status"]
            if outcome is not None and status in TERMINAL:
                outcome.status = status
                del pending[outcome.job_id]
        time.sleep(1.0)
    for outcome in pending.values():
        outcome.status = "TIMED OUT"
        outcome.reason = f"not finished after {timeout:.0f} s"


def explain(client: httpx.Client, outcome: Outcome) -> None:
    """The reason a job did not complete: the platform's status message and the last line
    the command printed; and for every job the count of its evaluation metrics."""
    model = client.get(f"/v1/models/{outcome.job_id}").json()
    status = model["training"]["training_status"]
    page = client.get(
        f"/v1/logs/{outcome.job_id}/loglines", params={"pos": -1, "pagesize": 200}
    ).json()["models"]
    said = [str(item["line"]).strip() for item in page]
    output = [line for line in said if line and not line.startswith("[ffdl]")]
    records = client.get(f"/v1/logs/{outcome.job_id}/emetrics", params={"pagesize": 1000})
    outcome.emetrics = len(records.json()["models"]) if records.status_code == 200 else None
    if outcome.status != "COMPLETED" and not outcome.reason:
        # The platform's reason without the output it quotes; the command's last line instead.
        message = str(status.get("status_message") or "").split("; last lines:")[0]
        last = output[-1] if output else ""
        outcome.reason = "; ".join(part for part in (message, last) if part)


# -- the run -----------------------------------------------------------------------------


def shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_table(outcomes: list[Outcome]) -> None:
    width = max(len(o.name) for o in outcomes)
    print(f"{'manifest':<{width}}  {'accepted':<8}  final status")
    for o in outcomes:
        if not o.accepted:
            print(f"{o.name:<{width}}  {'no':<8}  {shorten(o.refusal, 170)}")
            continue
        status = o.status
        if o.emetrics:
            status += f" ({o.emetrics} emetrics)"
        if o.status != "COMPLETED":
            status += f": {shorten(o.reason, 160)}"
        print(f"{o.name:<{width}}  {'yes':<8}  {status}")
    total = len(outcomes)
    print(f"accepted unchanged: {sum(o.accepted for o in outcomes)}/{total}")
    print(f"ran to completion: {sum(o.status == 'COMPLETED' for o in outcomes)}/{total}")


def looked_up(log: Path) -> list[str]:
    if not log.exists():
        return []
    return sorted({line.strip() for line in log.read_text().splitlines() if line.strip()})


def spec_endpoints(home: Path) -> set[str]:
    """The endpoints the learners' controllers were told to reach (from their specs)."""
    found: set[str] = set()
    for spec in home.glob("jobs/*/learners/*/*/spec.json"):
        with contextlib.suppress(OSError, ValueError):
            text = spec.read_text()
            found.update(re.findall(r'"endpoint(?:_url)?":\s*"([^"]+)"', text))
    return found


def run(
    directory: Path, timeout: float, keep: bool, use_host_paths: bool, wheels: Path | None
) -> list[Outcome]:
    all_needs = [read_needs(p) for p in sorted(directory.iterdir()) if p.is_file()]
    if not all_needs:
        raise SystemExit(f"no manifest files in {directory}")
    scratch = Path(tempfile.mkdtemp(prefix="ffdl-manifests-"))
    dns_log = scratch / "dns.log"
    (scratch / "audit").mkdir()
    (scratch / "audit" / "sitecustomize.py").write_text(DNS_AUDIT)
    # The server inherits this environment (less FFDL_ variables): the audit hook with it.
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "BENCH_DNS_LOG")}
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(scratch / "audit"), saved["PYTHONPATH"]])
    )
    os.environ["BENCH_DNS_LOG"] = str(dns_log)
    try:
        with moto_process() as moto, host_paths(all_needs, use_host_paths) as store_paths:
            place_object_data(moto, all_needs)
            config = platform_config(all_needs, moto, store_paths, wheels)
            server = LiveServer(home=scratch / "home", config=config)
            server.start()
            try:
                started = time.monotonic()
                outcomes = [submit(server.client, needs) for needs in all_needs]
                wait_all(server.client, outcomes, timeout)
                for outcome in outcomes:
                    if outcome.accepted:
                        explain(server.client, outcome)
                elapsed = time.monotonic() - started
                print_table(outcomes)
                aliased = sorted(config["object_store_endpoint_aliases"])
                print(
                    f"(run took {elapsed:.0f} s; endpoints aliased to {moto}: {', '.join(aliased)})"
                )
                names = looked_up(dns_log)
                hosts = {re.sub(r"^[a-z]+://", "", a).split("/")[0].split(":")[0] for a in aliased}
                print(f"names the server looked up: {', '.join(names) or 'none'}")
                leaked = sorted(hosts & set(names))
                if leaked:
                    print(f"WARNING: the server looked up manifest hosts: {', '.join(leaked)}")
                endpoints = spec_endpoints(server.home)
                print(f"endpoints given to the learners: {', '.join(sorted(endpoints)) or 'none'}")
                return outcomes
            finally:
                server.stop()
                server.kill_learners()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if keep:
            print(f"platform home kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifests", type=Path, required=True, help="directory of manifests")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for all the jobs")
    parser.add_argument("--keep", action="store_true", help="keep the platform's home")
    parser.add_argument(
        "--no-host-paths", action="store_true", help="do not create host-mount paths"
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        help="a directory of wheels (find_links) with what commands `pip install` first, "
        "for the runtimes of their framework versions; without it those commands find "
        "nothing to install",
    )
    args = parser.parse_args()
    if args.wheels is not None and not args.wheels.is_dir():
        raise SystemExit(f"--wheels {args.wheels}: not a directory")
    if os.geteuid() != 0:
        raise SystemExit(
            "run as root: the sandbox then gives each job its own network namespace, so a "
            "manifest's `pip install` cannot reach beyond this machine"
        )
    run(args.manifests, args.timeout, args.keep, not args.no_host_paths, args.wheels)


if __name__ == "__main__":
    main()
