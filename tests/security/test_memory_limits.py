"""The manifest's memory, held by each mechanism the platform has, through a real sandboxed
platform: a learner's cgroup (cgroup v1 on CI, v2 where the host delegates memory) and,
with cgroups turned off, the controller's watchdog.

Both must let a learner reserve far more address space than its limit without touching it,
as CUDA does at start (an address-space limit broke every GPU job this way), and both must
kill a learner that really holds more than its limit, with the same reason.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.live import FAST_CONFIG, LiveServer, ffdl_output, manifest_yaml, serving

# Reserves 64 GiB of address space as CUDA's start does (PROT_NONE, MAP_NORESERVE: nothing
# is committed), touches TOUCH MiB, then holds it for a while, as a training job would.
RESERVE_AND_TOUCH = """
import mmap, os, time
MAP_NORESERVE, PROT_NONE = 0x4000, 0  # Linux's values: Python 3.11's mmap names neither
reserved = mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE | MAP_NORESERVE, prot=PROT_NONE)
print("reserved 64 GiB", flush=True)
held = bytes([1]) * (int(os.environ.get("TOUCH", "0")) << 20)
print(f"touched {len(held) >> 20} MiB", flush=True)
time.sleep(float(os.environ.get("HOLD_S", "0")))
print("done", flush=True)
"""
LIMIT = "256MiB"


@pytest.fixture(scope="module", params=["cgroup", "watchdog"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    config = {**FAST_CONFIG, "learner_cgroups": request.param == "cgroup"}
    home = tmp_path_factory.mktemp(f"memory-{request.param}") / "home"
    with serving(LiveServer(home=home, config=config)) as live:
        yield live


def _mechanism(server: LiveServer) -> str:
    limits: dict[str, Any] = server.client.get("/health").json()["learner_limits"]
    return str(limits["memory"])


def _job(server: LiveServer, touch_mib: int, hold_s: float) -> str:
    command = f"TOUCH={touch_mib} HOLD_S={hold_s} python probe.py"
    manifest = manifest_yaml(command, memory=LIMIT, gpus=0)
    return server.submit_ok(manifest, {"probe.py": RESERVE_AND_TOUCH})


def _lines(server: LiveServer, job_id: str) -> list[str]:
    return [str(item["line"]) for item in server.loglines(job_id)]


def test_the_health_endpoint_names_the_mechanism(server: LiveServer) -> None:
    mechanism = _mechanism(server)
    if server.config["learner_cgroups"]:
        assert mechanism in ("cgroup v1", "cgroup v2"), mechanism
    else:
        assert mechanism == "watchdog"


def test_ffdl_status_says_what_holds_learners(server: LiveServer) -> None:
    shown = " ".join(ffdl_output(server, "status", columns=200).split())
    assert f"Learner limits ({_mechanism(server)}):" in shown, shown


def test_a_learner_may_reserve_address_space_and_use_what_it_is_given(server: LiveServer) -> None:
    job_id = _job(server, touch_mib=100, hold_s=1.0)
    server.wait_status(job_id, {"COMPLETED"}, timeout=90)
    lines = _lines(server, job_id)
    assert "reserved 64 GiB" in lines and "touched 100 MiB" in lines and "done" in lines
    # The learner's log says which mechanism held its memory.
    mechanism = _mechanism(server)
    said = next(line for line in lines if "memory limit of 256 MiB" in line)
    if mechanism == "watchdog":
        assert "watchdog" in said, said
    else:
        assert f"held by {mechanism}" in said, said


def test_a_learner_holding_more_than_its_memory_is_killed_with_the_reason(
    server: LiveServer,
) -> None:
    job_id = _job(server, touch_mib=512, hold_s=60.0)
    model = server.wait_status(job_id, {"FAILED"}, timeout=90)
    status = model["training"]["training_status"]
    assert "learner 1 exceeded its memory limit of 256 MiB" in status["status_message"], status
    assert "done" not in _lines(server, job_id)


def test_ffdl_up_refuses_a_cgroup_parent_that_does_not_exist(tmp_path: Path) -> None:
    home = tmp_path / "home"
    flags = ["--home", str(home), "--port", "1", "--cgroup-parent", "/no/such/cgroup"]
    done = subprocess.run(
        [sys.executable, "-m", "ffdl.cli.main", "up", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("ffdl: cgroup_parent /sys/fs/cgroup/"), done.stderr
    assert "/no/such/cgroup does not exist" in message, done.stderr
    assert not home.exists()
