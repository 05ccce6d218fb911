"""A job's GPUs sampled by its controller through NVML (the stand-in library, set to known
figures) and followed through the API, the CLI and the idle flag, on a real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.gpu_sampling.standin import Gpu, build, set_figures
from tests.integration.live import FAST_CONFIG, ffdl_output, manifest_yaml, running_server, wait_for


def test_sampled_gpus_reach_the_api_the_cli_and_the_idle_flag(tmp_path: Path) -> None:
    library = build(tmp_path / "nvml")
    # Learner 1 gets GPUs 0 and 1 of node-a: 60 % and 80 %, 1000 and 3000 MiB.
    set_figures(library, [Gpu(60, 1000), Gpu(80, 3000), Gpu(0, 0), Gpu(0, 0)])
    config = {
        "nvml_library": str(library),
        "gpu_sample_s": 0.3,
        "gpu_idle_after_s": 1.0,
        "nodes": [{**FAST_CONFIG["nodes"][0], "gpu_type": "standin-gpu"}],
    }
    with running_server(tmp_path / "home", **config) as server:
        job_id = server.submit_ok(manifest_yaml('python -c "import time; time.sleep(120)"', gpus=2))

        def sampled() -> dict[str, Any] | None:
            use = server.model(job_id).get("gpu_utilization")
            return use if use and use["measured_s"] >= 1.0 else None

        use = wait_for(sampled, timeout=60, what="GPU samples of the job")
        assert use["average"] == 70.0 and use["latest"] == 70.0 and use["memory_mb"] == 4000.0
        assert use["idle_flagged"] is False
        series = server.client.get(f"/v1/models/{job_id}/gpu").json()
        last = series["samples"][-1]
        assert last["util"] == 70.0 and last["node"] == "node-a" and last["power_w"] == 600.0
        assert [g["index"] for g in last["gpus"]] == [0, 1]
        assert "70% average" in ffdl_output(server, "show", job_id, columns=200)
        nodes = server.client.get("/v1/nodes").json()["nodes"]
        assert nodes[0]["gpus_busy"] == 1.4
        # ``ffdl nodes`` at 80 columns: allocated beside really busy, nothing cut to "…".
        table = ffdl_output(server, "nodes")
        row = next(line for line in table.splitlines() if "node-a" in line)
        assert "2/4" in row and "1.4" in row, table
        assert "…" not in table and max(len(line) for line in table.splitlines()) <= 80

        set_figures(library, [Gpu(0, 1000), Gpu(1, 3000), Gpu(0, 0), Gpu(0, 0)])

        def flagged() -> dict[str, Any] | None:
            model = server.model(job_id)
            return model if (model.get("gpu_utilization") or {}).get("idle_flagged") else None

        model = wait_for(flagged, timeout=30, what="the job flagged for idle GPUs")
        idle = [e["reason"] for e in model["events"] if e["reason"].startswith("GPUs idle")]
        assert len(idle) == 1 and idle[0].endswith("(node-a GPUs 0, 1)"), idle
        assert "flagged: GPUs idle" in ffdl_output(server, "show", job_id, columns=200)
        assert server.client.delete(f"/v1/models/{job_id}").status_code in (200, 202)
