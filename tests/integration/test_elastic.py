"""Elastic jobs on declared virtual nodes with real learner processes: rescale, drain, shrink."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for

TWO_NODES = [
    {"name": "node-a", "gpus": 2, "cpus": 8, "memory": "16GiB", "gpu_type": "cpu"},
    {"name": "node-b", "gpus": 2, "cpus": 8, "memory": "16GiB", "gpu_type": "cpu"},
]

# Every learner steps; the chief reports samples and checkpoints, all honour should_stop.
ELASTIC_STEPS = """
import os, sys, time
from ffdl.sdk.api import context, load_checkpoint, report, save_checkpoint, should_stop

ctx = context()
restored = load_checkpoint()
step = 0 if restored is None else restored[1]["step"]
print(f"learner {ctx.learner_id}/{ctx.num_learners} gpus={os.environ['FFDL_GPUS']} "
      f"batch={os.environ.get('FFDL_BATCH_SIZE')} start={step}", flush=True)
while step < TOTAL:
    step += 1
    time.sleep(0.05)
    if ctx.learner_id == 1:
        report(step=step, samples=step * 64)
        save_checkpoint({"step": step}, step, keep=2)
    if should_stop():
        sys.exit(0)
print(f"learner {ctx.learner_id} finished at {step}", flush=True)
"""


def elastic_job(total_steps: int, **extra: Any) -> tuple[str, dict[str, str]]:
    manifest = manifest_yaml(
        "python steps.py",
        elastic={"gpus": {"min": 1, "max": 4}, "batch_size": {"min": 64, "max": 256}},
        **extra,
    )
    return manifest, {"steps.py": ELASTIC_STEPS.replace("TOTAL", str(total_steps))}


def elastic_config(min_rescale_interval_s: float) -> dict[str, Any]:
    return {
        **FAST_CONFIG,
        "nodes": TWO_NODES,
        "autoscaler_interval_s": 0.5,
        "min_rescale_interval_s": min_rescale_interval_s,
        # What a restart costs here: about a second, not the default's half minute, so a
        # job seconds old is charged as the optimizer would charge one of its real age.
        "restart_cost_s": 1.0,
        "halt_grace_s": 5,
    }


@pytest.fixture
def elastic_server(tmp_path: Path) -> Any:
    # A job keeps a new size for an hour, so the autoscaler does not undo what a test asks.
    with serving(LiveServer(home=tmp_path / "home", config=elastic_config(3600))) as live:
        yield live


def _starts(server: LiveServer, job_id: str) -> list[tuple[int, int, int]]:
    """(num_learners, FFDL_GPUS, start step) for every learner-1 start line."""
    found = []
    for item in server.loglines(job_id):
        m = re.match(r"learner 1/(\d+) gpus=(\d+) batch=\S+ start=(\d+)", item["line"])
        if m:
            found.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
    return found


def _at(event: dict[str, Any]) -> float:
    """When an event of a job's history happened, in seconds."""
    return datetime.fromisoformat(event["time"]).timestamp()


def _reported_steps(server: LiveServer, job_id: str) -> int:
    response = server.client.get(f"/v1/logs/{job_id}/emetrics", params={"pos": -1})
    records = response.json()["models"]
    return int(records[-1]["etimes"]["iteration"]["value"]) if records else 0


def _wait_learners(server: LiveServer, job_id: str, count: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        model = server.model(job_id)
        status = model["training"]["training_status"]["status"]
        if status == "PROCESSING" and len(model["learners"]) == count:
            return model
        assert status not in {"FAILED", "CANCELLED", "COMPLETED"}, model["training"]
        return None

    result: dict[str, Any] = wait_for(ready, timeout=60, interval=0.1, what=f"{count} learners")
    return result


def test_user_rescales_up_then_down_and_training_continues(elastic_server: LiveServer) -> None:
    server = elastic_server
    manifest, files = elastic_job(250)
    job_id = server.submit_ok(manifest, files)
    _wait_learners(server, job_id, 1)
    wait_for(lambda: _reported_steps(server, job_id) >= 3, what="first steps")

    response = server.client.patch(f"/v1/models/{job_id}", json={"gpus": 3})
    assert response.status_code == 202, response.text
    model = _wait_learners(server, job_id, 3)
    assert {lr["node"] for lr in model["learners"]} == {"node-a", "node-b"}
    rescale_events = [e for e in model["events"] if e["to"] == "RESCALING"]
    assert rescale_events and "1→3" in rescale_events[-1]["reason"]
    wait_for(lambda: any(n == 3 for n, _, _ in _starts(server, job_id)), what="3-learner run")
    resumed_at = _reported_steps(server, job_id)
    wait_for(lambda: _reported_steps(server, job_id) > resumed_at + 3, what="progress on 3")

    assert server.client.patch(f"/v1/models/{job_id}", json={"gpus": 1}).status_code == 202
    _wait_learners(server, job_id, 1)
    server.wait_status(job_id, {"COMPLETED"}, timeout=120)

    starts = _starts(server, job_id)
    assert [(n, g) for n, g, _ in starts] == [(1, 1), (3, 3), (1, 1)]
    assert starts[0][2] == 0 and 0 < starts[1][2] < starts[2][2] < 250, starts

    refused = server.client.patch(f"/v1/models/{job_id}", json={"gpus": 8})
    assert refused.status_code == 409


def test_scale_rejects_out_of_range_and_non_elastic(elastic_server: LiveServer) -> None:
    server = elastic_server
    manifest, files = elastic_job(200)
    job_id = server.submit_ok(manifest, files)
    bad = server.client.patch(f"/v1/models/{job_id}", json={"gpus": 9})
    assert bad.status_code == 400 and bad.json()["detail"]["field"] == "gpus"
    fixed = server.submit_ok(manifest_yaml("python -c 'pass'"))
    refused = server.client.patch(f"/v1/models/{fixed}", json={"gpus": 2})
    assert refused.status_code == 400 and "not elastic" in refused.json()["description"]
    server.client.delete(f"/v1/models/{job_id}")


def test_high_priority_arrival_shrinks_an_elastic_job_instead_of_preempting(
    tmp_path: Path,
) -> None:
    with serving(LiveServer(home=tmp_path / "home", config=elastic_config(1))) as server:
        manifest, files = elastic_job(2000, priority=10)
        elastic_id = server.submit_ok(manifest, files)
        grown = _wait_learners(server, elastic_id, 4)  # idle GPUs: the autoscaler grows it
        assert any(e["to"] == "RESCALING" for e in grown["events"])

        urgent = server.submit_ok(
            manifest_yaml("python -c 'import time; time.sleep(3)'", learners=2, priority=90)
        )
        server.wait_status(urgent, {"PROCESSING", "STORING", "COMPLETED"}, timeout=90)
        model = server.model(elastic_id)
        assert model["training"]["training_status"]["status"] != "HALTED"
        assert not any(e["to"] == "HALTING" for e in model["events"]), "was preempted"
        shrinks = [e for e in model["events"] if e["to"] == "RESCALING" and "4→" in e["reason"]]
        assert shrinks, [e["reason"] for e in model["events"]]
        server.client.delete(f"/v1/models/{elastic_id}")


def test_elastic_schedule_resizes_the_job_at_the_given_epoch(elastic_server: LiveServer) -> None:
    server = elastic_server
    manifest = manifest_yaml(
        "python steps.py",
        elastic={
            "gpus": {"min": 1, "max": 4},
            "batch_size": {"min": 64, "max": 256},
            "schedule": [{"at_epoch": 0, "gpus": 1}, {"at_epoch": 30, "gpus": 3}],
        },
    )
    job_id = server.submit_ok(manifest, {"steps.py": ELASTIC_STEPS.replace("TOTAL", "400")})
    _wait_learners(server, job_id, 1)
    wait_for(lambda: _reported_steps(server, job_id) >= 30, timeout=60, what="epoch 30")
    model = _wait_learners(server, job_id, 3)
    rescales = [e for e in model["events"] if e["to"] == "RESCALING"]
    assert rescales and "1→3" in rescales[-1]["reason"], [e["reason"] for e in model["events"]]
    wait_for(lambda: len(_starts(server, job_id)) >= 2, what="the restart on 3 learners")
    starts = _starts(server, job_id)
    assert [n for n, _, _ in starts][:2] == [1, 3] and starts[1][2] >= 30, starts
    server.client.delete(f"/v1/models/{job_id}")


def test_the_autoscaler_keeps_each_gpus_share_inside_the_manifests_local_limits(
    tmp_path: Path,
) -> None:
    # Left alone, the optimizer would grow the batch to 1024 on the 4 free GPUs (256 per GPU);
    # at most 128 per GPU fit, so on 4 GPUs the batch stays at 512 or below.
    limits = {
        "gpus": {"min": 1, "max": 4},
        "batch_size": {"min": 64, "max": 1024},
        "local_batch_size": {"min": 64, "max": 128},
    }
    with serving(LiveServer(home=tmp_path / "home", config=elastic_config(1))) as server:
        manifest = manifest_yaml("python steps.py", elastic=limits)
        job_id = server.submit_ok(manifest, {"steps.py": ELASTIC_STEPS.replace("TOTAL", "600")})
        grown = _wait_learners(server, job_id, 4)  # idle GPUs: the autoscaler grows it
        assert any(e["to"] == "RESCALING" for e in grown["events"])
        wait_for(lambda: len(_starts(server, job_id)) >= 2, timeout=30, what="a second start")
        shapes = [
            (int(m.group(1)), int(m.group(2)))
            for item in server.loglines(job_id)
            if (m := re.match(r"learner 1/\d+ gpus=(\d+) batch=(\d+)", item["line"]))
        ]
        assert shapes[0] == (1, 64) and shapes[-1][0] == 4, shapes
        assert all(64 * gpus <= batch <= 128 * gpus for gpus, batch in shapes), shapes
        server.client.delete(f"/v1/models/{job_id}")

        # A user's pin is checked against the same limits: 64 per GPU exactly, 64..128 in all.
        narrow = {
            **limits,
            "batch_size": {"min": 64, "max": 128},
            "local_batch_size": {"min": 64, "max": 64},
        }
        pinned = server.submit_ok(manifest_yaml("python -c 'pass'", elastic=narrow))
        refused = server.client.patch(f"/v1/models/{pinned}", json={"gpus": 4})
        assert refused.status_code == 400, refused.text
        assert "choose 1..2" in refused.json()["description"]
        server.client.delete(f"/v1/models/{pinned}")


def test_a_job_left_waiting_too_long_takes_turns_with_a_running_one(tmp_path: Path) -> None:
    # Two elastic jobs that each need the node's two GPUs: without a bound on waiting, the
    # second would wait until the first ended.
    config = {
        **elastic_config(3600),
        "nodes": [{"name": "node-a", "gpus": 2, "cpus": 8, "memory": "16GiB", "gpu_type": "cpu"}],
        # A job that waited 4 s stops one that has had its GPUs for a turn of 8 s.
        "fairness_after_s": 4,
        "fairness_turn_s": 8,
    }
    both_gpus = {"gpus": {"min": 2, "max": 2}, "batch_size": {"min": 64, "max": 64}}
    # The first sleeps 12 s in all, more than one 8-s turn, so it must yield; the second ends
    # well within its turn, so there is one swap however slow the machine (a turn is counted
    # from the start, so on a busy machine the learners' start eats into each one).
    long_steps = ELASTIC_STEPS.replace("TOTAL", "60").replace("sleep(0.05)", "sleep(0.2)")
    short_steps = ELASTIC_STEPS.replace("TOTAL", "10")
    with serving(LiveServer(home=tmp_path / "home", config=config)) as server:
        first = server.submit_ok(
            manifest_yaml("python steps.py", learners=2, elastic=both_gpus),
            {"steps.py": long_steps},
        )
        _wait_learners(server, first, 2)
        second = server.submit_ok(
            manifest_yaml("python steps.py", learners=2, elastic=both_gpus),
            {"steps.py": short_steps},
        )
        server.wait_status(second, {"PROCESSING"}, timeout=60)
        assert server.status(first) not in {"COMPLETED", "PROCESSING"}, "the first yielded"
        stops = [e for e in server.model(first)["events"] if e["to"] == "HALTING"]
        assert stops and "waited too long" in stops[0]["reason"], stops

        for job_id in (second, first):
            server.wait_status(job_id, {"COMPLETED"}, timeout=120)
        # It had its whole turn first, and then sat out a turn as long before it resumed.
        history = server.model(first)["events"]
        runs = [_at(e) for e in history if e["to"] == "PROCESSING" and e["learner"] is None]
        stopped = _at(stops[0])
        assert stopped - runs[0] >= 8.0, (runs, stopped)
        assert runs[1] - stopped >= 8.0 - 0.5, (runs, stopped)
        # The first resumed from its checkpoint instead of starting over.
        resumed = [start for _, _, start in _starts(server, first)]
        assert resumed[0] == 0 and max(resumed) > 0, resumed
        assert _reported_steps(server, first) == 60


# Reads its batch again at every epoch, as a training loop that rebatches in place does.
REBATCHING = """
import os, sys, time
from ffdl.sdk.api import context, report, should_stop

first = context()
me, batch = first.learner_id, first.batch_size
print(f"learner {me} start batch={batch} attempt={os.environ['FFDL_ATTEMPT']}", flush=True)
step = 0
for epoch in range(1, 400):
    now = context()
    if now.batch_size != batch:
        batch = now.batch_size
        print(f"learner {me} epoch {epoch} batch={batch} micro={now.micro_batch_size} "
              f"steps={now.accumulation_steps}", flush=True)
    for _ in range(5):
        step += 1
        time.sleep(0.02)
        if me == 1:
            report(step=step, samples=step * batch)
    if should_stop():
        sys.exit(0)
    if batch != first.batch_size and epoch % 10 == 0:
        break
print(f"learner {me} done", flush=True)
"""


def test_a_job_that_rebatches_in_place_takes_a_new_batch_without_a_restart(
    elastic_server: LiveServer,
) -> None:
    # Two GPUs, held there; the optimizer raises the batch from 64 to 512 (256 a GPU, run as
    # 2 micro-batches of 128). The job's size is held for an hour, which keeps its GPUs but
    # not its batch.
    limits = {
        "gpus": {"min": 2, "max": 2},
        "batch_size": {"min": 64, "max": 512},
        "local_batch_size": {"min": 16, "max": 128},
        "accumulate_gradients": True,
        "rebatch_in_place": True,
    }
    manifest = manifest_yaml("python steps.py", learners=2, elastic=limits)
    job_id = elastic_server.submit_ok(manifest, {"steps.py": REBATCHING})
    model = elastic_server.wait_status(job_id, {"COMPLETED"}, timeout=120)
    lines = [item["line"] for item in elastic_server.loglines(job_id)]
    starts = sorted(line for line in lines if re.match(r"learner \d start", line))
    assert starts == ["learner 1 start batch=64 attempt=1", "learner 2 start batch=64 attempt=1"]
    for learner in (1, 2):
        changes = [line for line in lines if re.match(rf"learner {learner} epoch \d+ batch=", line)]
        assert changes and changes[-1].endswith("batch=512 micro=128 steps=2"), lines
    events = [str(e.get("reason", "")) for e in model["events"]]
    assert any("rebatch 64→512 in place on 2 GPUs" in e for e in events), events
    assert not any(e["to"] == "RESCALING" for e in model["events"]), model["events"]
    assert any("[ffdl] batch now 512" in line for line in lines), lines

    # Without a batch range there is nothing to change in place: refused, naming the field.
    refused = elastic_server.submit(
        manifest_yaml(
            "python steps.py", elastic={"gpus": {"min": 1, "max": 2}, "rebatch_in_place": True}
        ),
        {"steps.py": REBATCHING},
    )
    assert refused.status_code == 400, refused.text
    assert "elastic.rebatch_in_place" in refused.text
