"""Training through ffdl against the same training run bare, on this host's GPU.

``workloads/synthetic_cnn.py`` runs once bare to warm caches and the device (not
counted), then ``--runs`` times (3) as a plain process and as many as an ffdl job,
alternating, on a live server with default settings whose local backend reports this
host's GPUs (``CUDA_VISIBLE_DEVICES`` pins the job; the bare run gets the same device,
thread count and report directory), with an ordinary memory limit (4 GiB). Without a GPU
the workload runs a small configuration on the CPU, so the figures show the platform's
fixed cost only. On a GPU host both runs must train on the GPU: a run that could not use
it (CUDA failed to start, say) stops the benchmark with its error and prints no ratio.

Printed, as medians with the ffdl/bare ratio:

- training throughput, timed by the script itself: the cost of running under a
  controller that streams its output and reports;
- wall time from start to end: bare, process start to exit; ffdl, submit to COMPLETED
  as the client sees it, split by the server's events into queue and deploy, the user's
  process, and storing the results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _server import LiveServer, manifest_yaml, median, wait_for

from ffdl.backends.gpus import detect_gpus

RUNS = 3
WORKLOAD = Path(__file__).resolve().parent / "workloads" / "synthetic_cnn.py"


def _result(lines: list[str]) -> dict[str, Any]:
    for line in lines:
        if line.startswith("RESULT "):
            parsed: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return parsed
    raise RuntimeError("the workload printed no RESULT line:\n" + "\n".join(lines[-20:]))


class NotOnTheGpu(RuntimeError):
    """A run on a GPU host that did not train on the GPU: no figure can come of it."""


def _on_the_gpu(result: dict[str, Any], gpu: bool, run: str) -> dict[str, Any]:
    if gpu and result.get("device") in (None, "cpu"):
        raise NotOnTheGpu(f"the {run} run trained on {result.get('device')}, not the GPU")
    return result


def _bare(tmp: Path, threads: int, gpu: bool) -> dict[str, Any]:
    logs = tmp / "bare-logs"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": str(threads),
        "LOG_DIR": str(logs),
        "CUDA_VISIBLE_DEVICES": "0" if gpu else "",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "BENCH_DEVICE": "cuda" if gpu else "",
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(WORKLOAD)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise NotOnTheGpu(f"the bare run exited {done.returncode}:\n{done.stderr[-2000:]}")
    return {**_on_the_gpu(_result(done.stdout.splitlines()), gpu, "bare"), "wall_s": wall}


def _event_time(model: dict[str, Any], target: str) -> datetime:
    return next(
        datetime.fromisoformat(e["time"])
        for e in model["events"]
        if e["learner"] is None and e["to"] == target
    )


def _platform(server: LiveServer, manifest: str, code: dict[str, str], gpu: bool) -> dict[str, Any]:
    submitted = time.time()
    job_id = server.submit_ok(manifest, code)

    def ended() -> dict[str, Any] | None:
        model = server.model(job_id)
        status = model["training"]["training_status"]["status"]
        return model if status in {"COMPLETED", "FAILED", "CANCELLED"} else None

    # Polled slowly so that the benchmark takes little CPU from the job; the end is read
    # from the server's COMPLETED event (same host, same clock), not from the poll.
    model: dict[str, Any] = wait_for(ended, timeout=900, interval=0.5, what=f"{job_id} to end")
    status = model["training"]["training_status"]["status"]
    lines = [i["line"] for i in server.loglines(job_id)]
    if status != "COMPLETED":
        tail = "\n".join(lines[-20:])
        raise NotOnTheGpu(f"{job_id} ended {status}: {model['training']}\n{tail}")
    queued, processing = _event_time(model, "QUEUED"), _event_time(model, "PROCESSING")
    storing, completed = _event_time(model, "STORING"), _event_time(model, "COMPLETED")
    return {
        **_on_the_gpu(_result(lines), gpu, "ffdl"),
        "wall_s": completed.timestamp() - submitted,
        "to_processing_s": (processing - queued).total_seconds(),
        "processing_s": (storing - processing).total_seconds(),
        "storing_s": (completed - storing).total_seconds(),
        "pinned": model["placement"][0]["gpu_ids"],
    }


def main(runs: int = RUNS) -> dict[str, float]:
    gpus = detect_gpus()
    threads = min(4, os.cpu_count() or 1)
    code = {"synthetic_cnn.py": WORKLOAD.read_text()}
    command = "BENCH_DEVICE=cuda python synthetic_cnn.py" if gpus else "python synthetic_cnn.py"
    manifest = manifest_yaml(command, name="gpu-overhead", gpus=1, cpus=threads, memory="4GiB")
    bare: list[dict[str, Any]] = []
    platform: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = LiveServer(home=tmp / "home", config={})
        server.start()
        try:
            _bare(tmp, threads, bool(gpus))  # not counted: warms caches and the device
            for run in range(runs):
                bare.append(_bare(tmp, threads, bool(gpus)))
                platform.append(_platform(server, manifest, code, bool(gpus)))
                b, p = bare[-1], platform[-1]
                print(
                    f"  run {run + 1}/{runs}: bare {b['samples_per_s']:,.0f} samples/s in "
                    f"{b['wall_s']:.2f} s; ffdl {p['samples_per_s']:,.0f} samples/s in "
                    f"{p['wall_s']:.2f} s (pinned to {p['pinned']})",
                    flush=True,
                )
        finally:
            server.stop()
            server.kill_learners()

    def mid(rows: list[dict[str, Any]], key: str) -> float:
        return median([float(r[key]) for r in rows])

    result = {
        "bare_samples_per_s": mid(bare, "samples_per_s"),
        "ffdl_samples_per_s": mid(platform, "samples_per_s"),
        "bare_wall_s": mid(bare, "wall_s"),
        "ffdl_wall_s": mid(platform, "wall_s"),
        "ffdl_to_processing_s": mid(platform, "to_processing_s"),
        "ffdl_processing_s": mid(platform, "processing_s"),
        "ffdl_storing_s": mid(platform, "storing_s"),
    }
    first = bare[0]
    print(
        f"training on {first['device']}: {first['steps']} steps × batch {first['batch']}, "
        f"medians of {runs} runs each"
    )
    print(f"  {'':28}{'bare':>12}{'ffdl':>12}{'ffdl/bare':>12}")
    throughput = (result["bare_samples_per_s"], result["ffdl_samples_per_s"])
    wall = (result["bare_wall_s"], result["ffdl_wall_s"])
    print(
        f"  {'training samples/s':28}{throughput[0]:>12,.0f}{throughput[1]:>12,.0f}"
        f"{throughput[1] / throughput[0]:>12.3f}"
    )
    print(
        f"  {'wall, start to end (s)':28}{wall[0]:>12.2f}{wall[1]:>12.2f}{wall[1] / wall[0]:>12.3f}"
    )
    print(
        f"  ffdl's wall: queue+deploy {result['ffdl_to_processing_s']:.2f} s, user process "
        f"{result['ffdl_processing_s']:.2f} s, storing {result['ffdl_storing_s']:.2f} s; "
        f"fixed cost {wall[1] - wall[0]:+.2f} s per job"
    )
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="runs of each kind (3)")
    try:
        main(parser.parse_args().runs)
    except NotOnTheGpu as exc:
        raise SystemExit(f"no figures: {exc}") from None
