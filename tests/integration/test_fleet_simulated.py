"""The short fleet run: the real platform with a few hundred simulated learners.

The learners are played on the wire by the load-testing harness (``ffdl.loadtest``), the
``simulated`` backend hands them over; the long run is ``make fleet``. Every job must end,
and every line a simulated learner had acknowledged must be stored once, in its order.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ffdl.server.settings import Settings
from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    free_port,
    serving,
    serving_replicas,
    wait_for,
)
from tests.postgres import PostgresServer

LINE = re.compile(r"^simulated line (\d+)$")


@pytest.fixture(scope="module")
def harnesses() -> Iterator[list[str]]:
    """Two harness processes, as a load test with more learners than one process can
    play runs them."""
    ports = [free_port(), free_port()]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "ffdl.loadtest.harness", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        for port in ports
    ]
    urls = [f"http://127.0.0.1:{port}" for port in ports]

    def up() -> bool:
        try:
            return all(httpx.get(f"{url}/stats", timeout=2).status_code == 200 for url in urls)
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=30, what="the harnesses")
        yield urls
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def harness(harnesses: list[str]) -> str:
    return harnesses[0]


def simulated_config(harness_url: str | list[str], **overrides: Any) -> dict[str, Any]:
    section = {
        "harness_url": harness_url,
        "duration_s": 4.0,
        "lines_per_s": 5.0,
        "metrics_per_s": 1.0,
        "report_every_s": 0.5,
        "node_count": 64,
        "gpus_per_node": 8,
        "racks": 5,
        **overrides,
    }
    config = {key: value for key, value in FAST_CONFIG.items() if key != "nodes"}
    return {**config, "backend": "simulated", "sandbox": False, "simulated": section}


def manifest(name: str, learners: int, gpus: int, command: str = "simulate") -> str:
    document: dict[str, Any] = {
        "name": name,
        "version": "1.0",
        "learners": learners,
        "gpus": gpus,
        "cpus": 1,
        "memory": "1GiB",
        "framework": {"name": "custom", "version": "1", "command": command},
    }
    return yaml.safe_dump(document)


def test_a_few_hundred_simulated_learners_lose_nothing_and_every_job_ends(
    tmp_path: Path, harnesses: list[str]
) -> None:
    # Both harnesses: each job's learners are played by one of them, chosen by its id.
    server = LiveServer(home=tmp_path / "home", config=simulated_config(harnesses))
    with serving(server):
        health = server.client.get("/health").json()
        assert health["learners"] == "simulated"
        assert "simulated" in health["warning"]
        assert len(server.client.get("/v1/nodes").json()["nodes"]) == 64

        # (learners, GPUs each): 208 learners over 80 jobs, all fitting at once.
        sizes = [(2, 1), (4, 2), (2, 4), (1, 8), (4, 1)]
        jobs = [
            server.submit_ok(manifest(f"sim-{n}", *sizes[n % len(sizes)]), {"x.py": "pass"})
            for n in range(80)
        ]
        learners = sum(sizes[n % len(sizes)][0] for n in range(80))
        assert learners >= 200

        # A simulated learner honours a halt (a rescale is a halt and a new launch too).
        long_job = server.submit_ok(
            manifest("sim-long", 1, 1, "simulate duration_s=600"), {"x.py": "pass"}
        )
        jobs.append(long_job)
        server.wait_status(long_job, {"PROCESSING"}, timeout=60)
        halted = server.client.patch(f"/v1/models/{long_job}", json={"status": "halt"})
        assert halted.status_code == 202, halted.text
        server.wait_status(long_job, {"HALTED"}, timeout=60)

        def all_ended() -> bool:
            page = server.client.get("/v1/models", params={"limit": 500}).json()["models"]
            states = [m["training"]["training_status"]["status"] for m in page]
            done = [s for m, s in zip(page, states, strict=True) if m["model_id"] != long_job]
            return len(states) == len(jobs) and all(s == "COMPLETED" for s in done)

        wait_for(all_ended, timeout=150, interval=0.5, what="every simulated job COMPLETED")
        each = [httpx.get(f"{url}/stats", timeout=10).json() for url in harnesses]
        for stats in each:
            assert stats["backlog_items"] == 0 and stats["refused_items"] == 0
            # A report the server failed to store is retried until it is; it must not happen.
            assert not [code for code in stats["answers"] if int(code) >= 500], stats["answers"]
            assert stats["learners"].get("running", 0) == 0
            # Both harnesses took a fair part of the learners (81 jobs, split by a hash).
            assert stats["learners"].get("exited", 0) >= learners / 4, stats["learners"]
        played = sum(sum(stats["learners"].values()) for stats in each)
        assert played == learners + 1, "every learner played once, by one harness"

        stored = 0
        for job_id in jobs:
            by_learner: dict[int, list[int]] = defaultdict(list)
            for item in server.loglines(job_id):
                match = LINE.match(item["line"])
                if match is not None:
                    by_learner[int(item["meta"]["learner"])].append(int(match.group(1)))
            for numbers in by_learner.values():
                assert numbers == list(range(1, len(numbers) + 1)), (job_id, numbers[:20])
            stored += sum(len(numbers) for numbers in by_learner.values())
        # Lines of the learners of this run only: the harnesses are the module's.
        acknowledged = sum(stats["lines_acked"] for stats in each)
        assert stored == acknowledged, (stored, each)
        assert stored >= learners * 10, "every learner reported lines for its 4 s"


def _reports_served(replica: LiveServer) -> int:
    served = 0
    for family in text_string_to_metric_families(replica.client.get("/metrics").text):
        if family.name != "ffdl_api_request_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_count") and sample.labels["route"].endswith("/reports"):
                served += int(sample.value)
    return served


def test_three_replicas_share_the_learners_reports(
    tmp_path: Path, harness: str, postgres: PostgresServer
) -> None:
    config = {**simulated_config(harness), "database_url": postgres.create_database()}
    with serving_replicas(tmp_path / "home", config, 3) as replicas:
        first = replicas[0]
        jobs = [first.submit_ok(manifest(f"spread-{n}", 1, 1), {"x.py": "pass"}) for n in range(24)]

        def all_completed() -> bool:
            page = first.client.get("/v1/models", params={"limit": 100}).json()["models"]
            return len(page) == len(jobs) and all(
                m["training"]["training_status"]["status"] == "COMPLETED" for m in page
            )

        wait_for(all_completed, timeout=120, interval=0.5, what="every job COMPLETED")
        served = [_reports_served(replica) for replica in replicas]
        # One replica deploys every learner; each learner is given one replica to report to
        # first, by its name, so every replica takes about a third of the reports.
        assert all(count >= sum(served) / 8 for count in served), served


def _start(home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ffdl.server.main", "--home", str(home), "--port", "9"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_simulated_backend_needs_its_section_and_sane_rates(tmp_path: Path) -> None:
    settings = Settings.load(tmp_path, backend="simulated")
    with pytest.raises(ValueError, match=r"needs a `simulated:` section"):
        settings.backend_config()

    home = tmp_path / "home"
    home.mkdir()
    config = simulated_config("http://127.0.0.1:9", lines_per_s=-1)
    del config["simulated"]["metrics_per_s"]
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    started = _start(home)
    assert started.returncode != 0
    assert "simulated.lines_per_s: Input should be greater than or equal to 0" in started.stderr
    assert "simulated.metrics_per_s: Field required" in started.stderr
    assert not (home / "ffdl.db").exists(), "nothing is made for a configuration refused"

    (home / "config.yaml").write_text(
        yaml.safe_dump(simulated_config(["http://127.0.0.1:9", "ftp://127.0.0.1:10"]))
    )
    started = _start(home)
    assert started.returncode != 0
    assert "harness_url must be http://HOST:PORT, got 'ftp://127.0.0.1:10'" in started.stderr
    assert not (home / "ffdl.db").exists()
