"""The ``ffdl`` command as FfDL's scripts drive it, as a subprocess against a real server.

What is checked is what such a script reads: the model id taken from ``train``'s output the
way FfDL's Makefile and notebooks took it, the file ``download --filename`` names, and the
``--json`` records of ``loglines``, ``emetrics`` and ``logs --metrics``, whose ``--follow``
must return once the job has ended.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    ffdl_output,
    interruptible,
    manifest_yaml,
    serving,
    wait_for,
)

# FfDL's Makefile: `grep "Model ID" | cut -d " " -f 3`; the same as a regex.
MODEL_ID_LINE = re.compile(r"^Model ID: (training-[a-z0-9]+)$", re.MULTILINE)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}

STEPS = 5
JOB_CODE = f"""\
import json, os, pathlib, time

metrics = pathlib.Path(os.environ["LOG_DIR"]) / "emetrics.jsonl"
for step in range(1, {STEPS + 1}):
    print(f"step {{step}} of {STEPS}", flush=True)
    with metrics.open("a") as out:
        out.write(json.dumps({{"iteration": step, "accuracy": step / 10}}) + "\\n")
    time.sleep(1.0)
pathlib.Path(os.environ["RESULT_DIR"], "weights.bin").write_bytes(b"w")
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("cli-habits-home")
    with serving(LiveServer(home=home, config=dict(FAST_CONFIG))) as live:
        yield live


def _env(server: LiveServer) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FFDL_") and not k.startswith("DLAAS_")
    }
    env["FFDL_CONFIG"] = str(server.home / "client.json")
    return env


def ffdl(
    server: LiveServer, *args: str, cwd: Path, merged: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the CLI; ``merged`` sends stderr into stdout, as ``2>&1 | tee`` scripts do."""
    return subprocess.run(
        [sys.executable, "-m", "ffdl.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True,
        env=_env(server),
        cwd=cwd,
        timeout=180,
        check=False,
    )


def model_id_of(output: str) -> str:
    """The model id exactly as FfDL's scripts took it from ``train``'s output."""
    cut = [line.split(" ")[2] for line in output.splitlines() if "Model ID" in line]
    assert len(cut) == 1, output
    match = MODEL_ID_LINE.search(output)
    assert match is not None, output
    assert match.group(1) == cut[0]
    return cut[0]


def test_init_train_download(server: LiveServer, tmp_path: Path) -> None:
    created = ffdl(server, "init", "proj", "--type", "custom", "--version", "1", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    again = ffdl(server, "init", "proj", cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr

    # An unknown field makes the server warn: the warning must not disturb the parsed lines.
    manifest = tmp_path / "proj" / "manifest.yml"
    manifest.write_text(manifest.read_text() + "size: medium\n")
    run = ffdl(server, "train", "proj/manifest.yml", "proj", cwd=tmp_path, merged=True)
    assert run.returncode == 0, run.stdout
    lines = run.stdout.splitlines()
    assert lines[:3] == [
        "Deploying model with manifest 'manifest.yml' and model files in 'proj'...",
        lines[1],
        "OK",
    ]
    model_id = model_id_of(run.stdout)
    assert lines[1].split()[-1] == model_id  # a notebook's out[1]
    assert any("unknown manifest field ignored: size" in line for line in lines[3:])

    final = server.wait_status(model_id, {"COMPLETED"}, timeout=120)
    assert final["training"]["training_status"]["status"] == "COMPLETED"
    logs = ffdl(server, "logs", model_id, cwd=tmp_path)
    assert "training with data from" in logs.stdout

    got = ffdl(
        server, "download", model_id, "--trainedmodel", "--filename", "mine.zip", cwd=tmp_path
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines()[-2:] == ["Downloaded file: mine.zip", "OK"]
    with zipfile.ZipFile(tmp_path / "mine.zip") as archive:
        assert archive.read("model.txt") == b"trained\n"
    assert not (tmp_path / f"{model_id}-trainedmodel.zip").exists()

    definition = ffdl(server, "download", model_id, "--definition", cwd=tmp_path)
    assert definition.returncode == 0, definition.stderr
    with zipfile.ZipFile(tmp_path / f"{model_id}-definition.zip") as archive:
        assert "train.py" in archive.namelist()


def test_a_default_init_project_trains_here_as_written(server: LiveServer, tmp_path: Path) -> None:
    created = ffdl(server, "init", "first", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    run = ffdl(
        server, "train", "--follow", "first/manifest.yml", "first", cwd=tmp_path, merged=True
    )
    assert run.returncode == 0, run.stdout
    # No warning: the framework and version init wrote have a runtime here.
    assert "Warning" not in run.stdout, run.stdout
    assert "epoch 20/20" in run.stdout and "model saved to" in run.stdout
    model_id = model_id_of(run.stdout)
    model = server.model(model_id)
    runtime = model["framework"]["runtime"]
    assert runtime == f"pytorch-{model['framework']['version']}"
    shown = " ".join(ffdl(server, "show", model_id, cwd=tmp_path).stdout.split())
    assert f"runs on {runtime}" in shown, shown
    progress = model["progress"]
    assert (progress["epoch"], progress["total_epochs"]) == (20, 20), progress
    got = ffdl(server, "download", model_id, "--trainedmodel", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    with zipfile.ZipFile(tmp_path / f"{model_id}-trainedmodel.zip") as archive:
        assert "model.pt" in archive.namelist()


def test_follow_commands_print_json_and_end_with_the_job(
    server: LiveServer, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(JOB_CODE)
    manifest = tmp_path / "manifest.yml"
    manifest.write_text(
        manifest_yaml("python train.py", name="habits", evaluation_metrics={"type": "emetrics"})
    )
    run = ffdl(server, "train", str(manifest), str(code), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    model_id = model_id_of(run.stdout)

    # All three follow the job at once, from its start to its end.
    commands = {
        "loglines": ["loglines", model_id, "--follow", "--json"],
        "emetrics": ["emetrics", model_id, "--follow", "--json"],
        "metrics": ["logs", model_id, "--metrics", "--json", "--follow"],
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "ffdl.cli.main", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(server),
            cwd=tmp_path,
        )
        for name, args in commands.items()
    }
    outputs: dict[str, str] = {}
    try:
        # The followers were started while the job still ran (it takes STEPS seconds).
        assert server.status(model_id) not in TERMINAL
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, f"{name}: {err}"
            outputs[name] = out
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # Each returned by itself, and only once the job had ended.
    assert server.status(model_id) == "COMPLETED"

    lines = [json.loads(text) for text in outputs["loglines"].splitlines()]
    steps = [item["line"] for item in lines if item["line"].startswith("step ")]
    assert steps == [f"step {i} of {STEPS}" for i in range(1, STEPS + 1)]
    rindexes = [int(item["meta"]["rindex"]) for item in lines]
    assert rindexes == sorted(set(rindexes))
    assert all(item["meta"]["training_id"] == model_id for item in lines)

    records = [json.loads(text) for text in outputs["emetrics"].splitlines()]
    iterations = [int(r["etimes"]["iteration"]["value"]) for r in records]
    assert iterations == list(range(1, STEPS + 1))
    assert float(records[-1]["values"]["accuracy"]["value"]) == pytest.approx(STEPS / 10)

    metric_data = [json.loads(text) for text in outputs["metrics"].splitlines()]
    assert [m["iteration"] for m in metric_data] == list(range(1, STEPS + 1))
    assert metric_data[0]["Values"]["accuracy"] == pytest.approx(0.1)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", metric_data[0]["timestamp"])

    # Without --follow: one page as the API pages it, in the plain text form.
    page = ffdl(server, "loglines", model_id, "--pagesize", "2", cwd=tmp_path)
    assert page.returncode == 0, page.stderr
    assert len(page.stdout.splitlines()) == 2
    rindex, millis, _ = page.stdout.splitlines()[0].split(" ", 2)
    assert int(rindex) == rindexes[0] and int(millis) > 0


def test_loglines_and_emetrics_print_every_record_unless_a_page_is_asked_for(
    server: LiveServer, tmp_path: Path
) -> None:
    records = 25
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import json, os, pathlib\n"
        "metrics = pathlib.Path(os.environ['LOG_DIR']) / 'emetrics.jsonl'\n"
        f"for step in range(1, {records + 1}):\n"
        "    print(f'line {step}', flush=True)\n"
        "    with metrics.open('a') as out:\n"
        "        out.write(json.dumps({'iteration': step, 'loss': 1 / step}) + '\\n')\n"
    )
    manifest = tmp_path / "manifest.yml"
    manifest.write_text(
        manifest_yaml("python train.py", name="pages", evaluation_metrics={"type": "emetrics"})
    )
    model_id = model_id_of(ffdl(server, "train", str(manifest), str(code), cwd=tmp_path).stdout)
    server.wait_status(model_id, {"COMPLETED"}, timeout=120)

    lines = ffdl(server, "loglines", model_id, cwd=tmp_path)
    assert lines.returncode == 0 and lines.stderr == "", lines.stderr
    printed = [line.split(" ", 2)[-1] for line in lines.stdout.splitlines()]
    assert [p for p in printed if p.startswith("line ")] == [
        f"line {step}" for step in range(1, records + 1)
    ]
    metrics = ffdl(server, "emetrics", model_id, "--json", cwd=tmp_path)
    assert metrics.returncode == 0, metrics.stderr
    assert len(metrics.stdout.splitlines()) == records

    page = ffdl(server, "emetrics", model_id, "--json", "--pagesize", "10", cwd=tmp_path)
    assert len(page.stdout.splitlines()) == 10
    assert "one page of 10 records; the next: --pos 10" in page.stderr
    last = ffdl(server, "emetrics", model_id, "--json", "--pos", "20", cwd=tmp_path)
    assert len(last.stdout.splitlines()) == 5 and last.stderr == ""


def test_train_follow_shows_each_status_once_before_its_output_and_one_outcome(
    server: LiveServer, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('starting', flush=True)\nprint('done', flush=True)\n")
    manifest = tmp_path / "manifest.yml"
    manifest.write_text(manifest_yaml("python train.py", name="follow-order", gpus=0))
    run = ffdl(server, "train", "--follow", str(manifest), str(code), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    statuses = [line.split()[2] for line in lines if line.startswith("── status ")]
    assert statuses == ["QUEUED", "PENDING", "DOWNLOADING", "PROCESSING", "STORING", "COMPLETED"], (
        lines
    )
    assert lines.index("starting") > next(
        i for i, line in enumerate(lines) if line.startswith("── status PROCESSING")
    ), lines
    assert lines[-1].startswith("── status COMPLETED"), lines
    assert sum("COMPLETED" in line for line in lines) == 1, lines


def test_ctrl_c_stops_following_and_says_the_job_goes_on(
    server: LiveServer, tmp_path: Path
) -> None:
    job_id = server.submit_ok(
        manifest_yaml("python -c \"import time; print('up', flush=True); time.sleep(60)\"", gpus=0)
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "ffdl.cli.main", "logs", job_id, "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(server),
        cwd=tmp_path,
        preexec_fn=interruptible,
    )
    assert follower.stdout is not None
    # The platform's own lines come first; the command's line says it runs.
    while (line := follower.stdout.readline()) and line.strip() != "up":
        assert line.startswith("[ffdl]"), line
    follower.send_signal(signal.SIGINT)
    _out, err = follower.communicate(timeout=30)
    assert follower.returncode == 130
    assert err.strip().splitlines()[-1] == (
        f"stopped following; {job_id} is still running; ffdl logs {job_id} -f to follow again"
    )
    assert server.status(job_id) == "PROCESSING"
    assert server.client.delete(f"/v1/models/{job_id}").status_code == 200


def test_draining_the_only_node_says_its_jobs_wait_and_their_reason_names_the_drain(
    server: LiveServer, tmp_path: Path
) -> None:
    job_id = server.submit_ok(
        manifest_yaml('python -c "import time; time.sleep(120)"', gpus=1, cpus=1)
    )
    server.wait_status(job_id, {"PROCESSING"}, timeout=60)
    drained = ffdl(server, "drain", "node-a", "--reason", "kernel upgrade", cwd=tmp_path)
    try:
        assert drained.returncode == 0, drained.stderr
        assert drained.stdout.strip() == (
            "Draining node-a: no other node is in service, so its 1 job halts with a "
            "checkpoint and waits in the queue until it returns; `ffdl undrain node-a` to "
            "return it"
        )

        def waiting_reason() -> str:
            return str((server.model(job_id).get("queue") or {}).get("reason") or "")

        # Halted and back in the queue, where the scheduler says why it waits.
        reason = wait_for(
            lambda: (r := waiting_reason()).startswith("node node-a is drained; ") and r,
            timeout=60,
            what="the drain as the queued job's reason",
        )
        assert server.status(job_id) == "QUEUED"
        assert "needs 1 CPU slot" in reason, reason
    finally:
        assert ffdl(server, "undrain", "node-a", cwd=tmp_path).returncode == 0
    server.wait_status(job_id, {"PROCESSING"}, timeout=60)
    assert server.client.delete(f"/v1/models/{job_id}").status_code == 200


def test_metrics_text_keeps_values_apart(server: LiveServer) -> None:
    code = (
        "import json, os\n"
        "with open(os.path.join(os.environ['LOG_DIR'], 'emetrics.jsonl'), 'a') as out:\n"
        "    out.write(json.dumps({'iteration': 1, 'accuracy': 0.9993041057759221,"
        " 'loss': 0.25}) + '\\n')\n"
    )
    manifest = manifest_yaml("python m.py", gpus=0, evaluation_metrics={"type": "emetrics"})
    job_id = server.submit_ok(manifest, {"m.py": code})
    server.wait_status(job_id, {"COMPLETED"}, timeout=60)
    shown = ffdl_output(server, "logs", job_id, "--metrics", columns=80)
    assert "accuracy: 0.999304" in shown and "0.999304     loss: 0.25" in shown, shown
