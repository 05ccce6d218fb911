"""What the learner sandbox costs: command start latency and training throughput.

Two measurements, each side by side in one run:

- start latency: the time from starting a learner's command to its first line of output,
  for ``python -c "print('up')"`` run bare (``/bin/bash -c``, as with ``--no-sandbox``)
  and through the full sandbox chain the controller uses (cgroup, bwrap, setpriv), in
  ``STARTS`` alternating pairs; medians and the difference (goal: under +100 ms);
- training throughput: ``workloads/synthetic_cnn.py`` as an ffdl job on two live servers
  of the same configuration, one sandboxed (the default) and one with ``sandbox: false``,
  ``RUNS`` alternating pairs; medians of the samples/s the script measures itself and
  their ratio (goal: at least 0.99).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _server import LiveServer, manifest_yaml, median, wait_for

from ffdl.learner.cgroups import LearnerCgroup
from ffdl.learner.sandbox import SandboxSpec, sandbox_argv, write_identity_files
from ffdl.server.services.sandboxing import python_paths

STARTS = 20
RUNS = 5
STEPS = "400"
WORKLOAD = Path(__file__).resolve().parent / "workloads" / "synthetic_cnn.py"
FIRST_LINE_COMMAND = f"{sys.executable} -c \"print('up')\""


def _time_to_first_line(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - started
    proc.wait()
    if line.strip() != b"up":
        raise RuntimeError(f"unexpected first line {line!r} from {argv[:3]}")
    return elapsed


def _sandboxed_start(tmp: Path, index: int) -> float:
    """One start through the chain the controller builds, cgroup creation included."""
    privileged = os.geteuid() == 0
    work = tmp / f"job-{index}"
    work.mkdir()
    uid = 250_000 if privileged else os.getuid()
    os.chown(work, uid, uid if privileged else os.getgid())
    spec = SandboxSpec(
        uid=uid,
        gid=uid if privileged else os.getgid(),
        read_only=python_paths(tmp / "home"),
        read_write=[str(work)],
        memory_bytes=1024 * 1024 * 1024,
        cpus=1.0,
        cgroup=f"ffdl-bench-{os.getpid()}-{index}",
        privileged=privileged,
    )
    started = time.perf_counter()
    cgroup = LearnerCgroup.create(spec.cgroup, spec.memory_bytes, spec.cpus) if privileged else None
    identity = write_identity_files(tmp / f"identity-{index}", spec, str(work))
    argv = sandbox_argv(
        spec, FIRST_LINE_COMMAND, str(work), identity, cgroup.procs_files if cgroup else ()
    )
    setup = time.perf_counter() - started
    try:
        return setup + _time_to_first_line(argv, tmp)
    finally:
        if cgroup is not None:
            cgroup.remove()


def start_latency(tmp: Path) -> tuple[float, float]:
    bare: list[float] = []
    boxed: list[float] = []
    _time_to_first_line(["/bin/bash", "-c", FIRST_LINE_COMMAND], tmp)  # warm the caches
    _sandboxed_start(tmp, -1)
    for index in range(STARTS):
        bare.append(_time_to_first_line(["/bin/bash", "-c", FIRST_LINE_COMMAND], tmp))
        boxed.append(_sandboxed_start(tmp, index))
    return median(bare), median(boxed)


def _job_throughput(server: LiveServer, manifest: str, code: dict[str, str]) -> float:
    job_id = server.submit_ok(manifest, code)

    def ended() -> dict[str, Any] | None:
        model = server.model(job_id)
        status = model["training"]["training_status"]["status"]
        return model if status in {"COMPLETED", "FAILED", "CANCELLED"} else None

    model: dict[str, Any] = wait_for(ended, timeout=900, interval=0.5, what=f"{job_id} to end")
    if model["training"]["training_status"]["status"] != "COMPLETED":
        raise RuntimeError(f"{job_id} did not complete: {model['training']}")
    for item in server.loglines(job_id):
        if item["line"].startswith("RESULT "):
            return float(json.loads(item["line"][len("RESULT ") :])["samples_per_s"])
    raise RuntimeError(f"{job_id} printed no RESULT line")


def throughput(tmp: Path) -> tuple[float, float]:
    threads = min(2, os.cpu_count() or 1)
    code = {"synthetic_cnn.py": WORKLOAD.read_text()}
    manifest = manifest_yaml(
        f"BENCH_STEPS={STEPS} python synthetic_cnn.py",
        name="sandbox-overhead",
        gpus=1,
        cpus=threads,
        memory="4GiB",
    )
    config = {"nodes": [{"name": "n", "gpus": 1, "cpus": threads, "memory": "8GiB"}]}
    boxed_server = LiveServer(home=tmp / "boxed", config=dict(config))
    bare_server = LiveServer(home=tmp / "bare", config={**config, "sandbox": False})
    boxed: list[float] = []
    bare: list[float] = []
    for server in (boxed_server, bare_server):
        server.start()
    try:
        _job_throughput(boxed_server, manifest, code)  # not counted: warms the caches
        for run in range(RUNS):
            bare.append(_job_throughput(bare_server, manifest, code))
            boxed.append(_job_throughput(boxed_server, manifest, code))
            print(
                f"  run {run + 1}/{RUNS}: no sandbox {bare[-1]:,.0f} samples/s, "
                f"sandbox {boxed[-1]:,.0f} samples/s",
                flush=True,
            )
    finally:
        for server in (boxed_server, bare_server):
            server.stop()
            server.kill_learners()
    return median(bare), median(boxed)


def main() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.chmod(tmp, 0o755)
        bare_start, boxed_start = start_latency(tmp)
        bare_rate, boxed_rate = throughput(tmp)
    mode = "as root: own uid, cgroup" if os.geteuid() == 0 else "unprivileged: user namespace"
    print(f"learner sandbox ({mode}); medians")
    print(f"  {'':34}{'bare':>12}{'sandbox':>12}{'difference':>14}")
    print(
        f"  {'start to first line (ms)':34}{bare_start * 1000:>12.1f}"
        f"{boxed_start * 1000:>12.1f}{(boxed_start - bare_start) * 1000:>+13.1f}ms"
    )
    print(
        f"  {'training samples/s':34}{bare_rate:>12,.0f}{boxed_rate:>12,.0f}"
        f"{boxed_rate / bare_rate:>13.3f}x"
    )
    return {
        "bare_start_ms": bare_start * 1000,
        "sandbox_start_ms": boxed_start * 1000,
        "bare_samples_per_s": bare_rate,
        "sandbox_samples_per_s": boxed_rate,
        "throughput_ratio": boxed_rate / bare_rate,
    }


if __name__ == "__main__":
    main()
