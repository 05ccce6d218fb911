"""The controller as the platform runs it: a real subprocess on a spec file, reporting over
real HTTP to the recording stand-in, running real commands."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ffdl.learner.attempt_lock import ALREADY_RUNNING_EXIT
from ffdl.learner.runtime import RuntimeSpec
from ffdl.learner.spec import DataMount, LearnerSpec, dump_spec

from .test_recording_api import TOKEN, RecordingApi, api, wait_until

__all__ = ["api"]

FAST = {"heartbeat_s": 0.2, "halt_grace_s": 5.0, "report_deadline_s": 30.0}


def make_spec(tmp_path: Path, api_url: str, command: str, **changes: Any) -> LearnerSpec:
    job = tmp_path / "job"
    dirs = {name: job / name for name in ("code", "data", "results", "logs", "checkpoints")}
    for directory in dirs.values():
        directory.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "MODEL_DIR": str(dirs["code"]),
        "DATA_DIR": str(dirs["data"]),
        "RESULT_DIR": str(dirs["results"]),
        "LOG_DIR": str(dirs["logs"]),
        "CHECKPOINT_DIR": str(dirs["checkpoints"]),
        "LEARNER_ID": "1",
        "NUM_LEARNERS": "1",
        "TRAINING_ID": "job-1",
        "PYTHON": sys.executable,
    }
    spec = LearnerSpec(
        training_id="job-1",
        learner=1,
        num_learners=1,
        attempt=0,
        api_url=api_url,
        job_token=TOKEN,
        command=command,
        workdir=str(dirs["code"]),
        env=env,
        data=[],
        results_source=str(dirs["results"]),
        results_target=None,
        emetrics_file=None,
        metric_groups={},
        state_dir=str(tmp_path / "state" / "attempt-0"),
        **FAST,
    )
    return dataclasses.replace(spec, **changes)


class ControllerRun:
    """One controller process, started as the local backend starts it."""

    def __init__(self, spec: LearnerSpec, tmp_path: Path) -> None:
        self.spec = spec
        self.state_dir = Path(spec.state_dir)
        spec_path = tmp_path / f"spec-{spec.attempt}.json"
        dump_spec(spec, spec_path)
        with open(tmp_path / f"controller-{spec.attempt}.out", "wb") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ffdl.learner.controller", str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self, timeout_s: float = 20.0) -> int:
        return self.process.wait(timeout_s)

    def result(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((self.state_dir / "result.json").read_text())
        return document

    def training_log(self) -> str:
        path = Path(self.spec.env["LOG_DIR"]) / "training-log.txt"
        return path.read_text() if path.exists() else ""

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    runs: list[ControllerRun] = []

    def start(spec: LearnerSpec) -> ControllerRun:
        runs.append(ControllerRun(spec, tmp_path))
        return runs[-1]

    yield start
    for run in runs:
        run.kill()


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie waiting to be reaped counts as ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def pid_printed(api: RecordingApi, label: str) -> int:
    wait_until(lambda: any(t.startswith(label) for t in api.log_texts()), what=label)
    return int(next(t for t in api.log_texts() if t.startswith(label)).split()[-1])


def test_happy_path_reports_every_phase_in_order(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    command = (
        'echo first; echo "to stderr" >&2; echo third; '
        'printf "no newline at the end"; echo model > "$RESULT_DIR/model.txt"'
    )
    store = tmp_path / "store"
    run = launch(make_spec(tmp_path, api.url, command, results_target=str(store)))

    assert run.wait() == 0
    assert api.statuses() == ["DOWNLOADING", "PROCESSING", "STORING", "COMPLETED"]
    final = api.final_status()
    assert final is not None
    assert (final["exit_code"], final["error_code"]) == (0, None)
    assert api.log_texts("stdout") == ["first", "third", "no newline at the end"]
    assert api.log_texts("stderr") == ["to stderr"]
    assert "[ffdl] storing results: 1/1 files, 0.0/0.0 MB" in api.log_texts("ffdl")
    seqs = [item["seq"] for item in api.items()]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] == 1
    storing_seq = next(i["seq"] for i in api.items("status") if i["status"] == "STORING")
    assert all(i["seq"] < storing_seq for i in api.items("log") if i["stream"] != "ffdl")
    assert api.violations == []
    assert (store / "model.txt").read_text() == "model\n"
    assert run.result()["status"] == "COMPLETED"
    assert run.result()["exit_code"] == 0
    assert not (run.state_dir / "controller.pid").exists()
    assert oct((run.state_dir / "result.json").stat().st_mode & 0o777) == "0o600"
    mirrored = run.training_log().splitlines()
    assert [line for line in mirrored if line != "to stderr"] == [
        "first",
        "third",
        "no newline at the end",
    ]


def test_a_second_controller_of_one_attempt_leaves_it_to_the_first(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    spec = make_spec(tmp_path, api.url, "echo started; sleep 30")
    first = launch(spec)
    wait_until(lambda: "started" in api.log_texts("stdout"), what="the first command")
    second = launch(spec)
    assert second.wait() == ALREADY_RUNNING_EXIT
    assert first.process.poll() is None, "the first controller runs on"
    assert not (first.state_dir / "result.json").exists()
    assert api.log_texts("stdout") == ["started"], "one command"
    first.kill()
    # Its lock died with it: the attempt can be run again.
    rerun = launch(dataclasses.replace(spec, command="echo again"))
    assert rerun.wait() == 0
    assert (rerun.result()["status"], rerun.result()["exit_code"]) == ("COMPLETED", 0)


def test_data_is_staged_and_reused_on_the_next_attempt(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    source = tmp_path / "bucket"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_text("alpha\n")
    (source / "sub" / "b.bin").write_bytes(b"\x00" * 2_500_000)
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "v.txt").write_text("from the volume\n")
    staged = tmp_path / "job" / "data" / "bucket"
    mounted = tmp_path / "job" / "data" / "mounts" / "vol"
    mounts = [
        DataMount(kind="local", source=str(source), target=str(staged)),
        DataMount(kind="mount_volume", source=str(volume), target=str(mounted)),
    ]
    command = f"cat {staged}/a.txt {mounted}/v.txt; wc -c < {staged}/sub/b.bin"
    spec = make_spec(tmp_path, api.url, command, data=mounts)

    assert launch(spec).wait() == 0
    assert api.log_texts("stdout") == ["alpha", "from the volume", "2500000"]
    assert "[ffdl] staging data: 2/2 files, 2.5/2.5 MB" in api.log_texts("ffdl")
    assert mounted.is_symlink() and os.readlink(mounted) == str(volume)
    changed_at = (staged / "sub" / "b.bin").stat().st_ctime_ns

    again = dataclasses.replace(spec, attempt=1, state_dir=str(tmp_path / "state" / "a1"))
    assert launch(again).wait() == 0
    assert api.final_status() == api.items("status")[-1]
    assert [s["status"] for s in api.items("status")][-1] == "COMPLETED"
    assert (staged / "sub" / "b.bin").stat().st_ctime_ns == changed_at


def test_missing_data_source_fails_with_s302(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    missing = tmp_path / "no-such-bucket"
    marker = tmp_path / "command-ran"
    spec = make_spec(
        tmp_path,
        api.url,
        f"touch {marker}",
        data=[DataMount(kind="local", source=str(missing), target=str(tmp_path / "d"))],
    )
    run = launch(spec)

    assert run.wait() == 0
    assert api.statuses() == ["DOWNLOADING", "FAILED"]
    final = api.final_status()
    assert final is not None
    assert final["error_code"] == "S302"
    assert str(missing) in final["reason"]
    assert run.result()["error_code"] == "S302"
    assert not marker.exists()


def test_missing_volume_fails_with_s302(tmp_path: Path, api: RecordingApi, launch: Any) -> None:
    missing = tmp_path / "no-such-volume"
    target = str(tmp_path / "mnt")
    spec = make_spec(
        tmp_path,
        api.url,
        "true",
        data=[DataMount(kind="mount_volume", source=str(missing), target=target)],
    )
    assert launch(spec).wait() == 0
    final = api.final_status()
    assert final is not None
    assert (final["status"], final["error_code"]) == ("FAILED", "S302")
    assert str(missing) in final["reason"]


def test_nonzero_exit_fails_with_c201_and_the_last_lines(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    command = 'for i in 1 2 3 4 5 6 7; do echo "line $i"; done; echo; echo "Error: boom"; exit 3'
    run = launch(make_spec(tmp_path, api.url, command))

    assert run.wait() == 0
    final = api.final_status()
    assert final is not None
    assert (final["status"], final["error_code"], final["exit_code"]) == ("FAILED", "C201", 3)
    assert final["reason"] == (
        "learner 1 exited with code 3; last lines: line 4 | line 5 | line 6 | line 7 | Error: boom"
    )
    assert run.result()["reason"] == final["reason"]


def test_exit_by_signal_reports_the_negative_signal_number(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    run = launch(make_spec(tmp_path, api.url, f"echo {'y' * 600}; kill -9 $$"))

    assert run.wait() == 0
    final = api.final_status()
    assert final is not None
    assert (final["error_code"], final["exit_code"]) == ("C201", -9)
    assert len(final["reason"]) < 600


def test_regex_groups_and_the_emetrics_file_become_metrics(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    emetrics = tmp_path / "job" / "logs" / "emetrics.jsonl"
    lines = [
        {"time": 5.0, "group": "train", "iteration": 3, "samples": 64, "values": {"loss": 0.25}},
        {"step": 4, "loss": 0.2, "note": "flat"},
    ]
    writes = "; ".join(f"echo '{json.dumps(line)}' >> {emetrics}" for line in lines)
    command = f"echo 'Iter 10: accuracy = 0.5'; {writes}; echo 'not json' >> {emetrics}"
    groups = {
        "test": {
            "regex": r"Iter (?P<iter>\d+): accuracy = (?P<acc>[0-9.]+)",
            "meta": {"time": "$ts"},
            "scalars": {"accuracy": "$acc"},
            "etimes": {"iteration": "$iter", "timestamp": "$ts"},
        }
    }
    spec = make_spec(tmp_path, api.url, command, emetrics_file=str(emetrics), metric_groups=groups)

    assert launch(spec).wait() == 0
    found = [(m["group"], m["iteration"], m["values"]) for m in api.items("emetric")]
    assert found == [
        ("test", 10, {"accuracy": 0.5}),
        ("train", 3, {"loss": 0.25, "samples": 64.0}),
        ("train", 4, {"loss": 0.2}),
    ]
    assert api.items("emetric")[1]["time"] == 5.0
    assert any("malformed line 3" in text for text in api.log_texts("ffdl"))
    assert api.statuses()[-1] == "COMPLETED"


def test_sigterm_halts_the_command_gracefully(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    command = "trap 'echo got TERM; exit 143' TERM; echo ready; while true; do sleep 0.05; done"
    run = launch(make_spec(tmp_path, api.url, command))
    wait_until(lambda: "ready" in api.log_texts(), what="the command to start")

    run.process.send_signal(signal.SIGTERM)

    assert run.wait() == 0
    assert "got TERM" in api.log_texts("stdout")
    final = api.final_status()
    assert final is not None
    assert (final["status"], final["reason"], final["exit_code"]) == ("HALTED", "halted", 143)
    assert run.result()["status"] == "HALTED"


def test_a_command_ignoring_sigterm_is_killed_after_the_grace(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    command = "trap '' TERM; echo pid $$; while true; do sleep 0.05; done"
    run = launch(make_spec(tmp_path, api.url, command, halt_grace_s=0.6))
    pid = pid_printed(api, "pid")

    signalled_at = time.monotonic()
    run.process.send_signal(signal.SIGINT)

    assert run.wait() == 0
    assert time.monotonic() - signalled_at >= 0.6
    final = api.final_status()
    assert final is not None
    assert (final["status"], final["exit_code"]) == ("HALTED", -9)
    assert not process_alive(pid)


def test_controller_imports_nothing_heavy(tmp_path: Path) -> None:
    probe = (
        "import json, sys, ffdl.learner.controller; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('httpx', 'pydantic', 'fastapi', 'sqlalchemy') "
        "or m.startswith('ffdl.server'))))"
    )
    imported = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=30
    )
    assert json.loads(imported.stdout) == []

    started = time.monotonic()
    shown = subprocess.run(
        [sys.executable, "-m", "ffdl.learner.controller", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shown.returncode == 0
    assert "spec" in shown.stdout
    assert time.monotonic() - started < 2.0


def test_without_a_sandbox_the_runtimes_paths_are_said_to_be_missing(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    # Providing /opt/conda/bin/python would mean writing into the host's /opt: not done.
    placed = {"/opt/conda/bin/python": "python"}
    runtime = RuntimeSpec(name="torch", python=sys.executable, paths=placed)
    run = launch(make_spec(tmp_path, api.url, "echo ran", runtime=runtime))

    assert run.wait() == 0
    assert api.final_status() is not None and api.statuses()[-1] == "COMPLETED"
    assert (
        "[ffdl] runtime torch: not provided, learners are not sandboxed (--no-sandbox): "
        "/opt/conda/bin/python" in api.log_texts("ffdl")
    )
    assert api.log_texts("stdout") == ["ran"]


def test_a_bad_spec_is_reported_as_s101(tmp_path: Path, api: RecordingApi) -> None:
    spec_path = tmp_path / "spec.json"
    state_dir = tmp_path / "state"
    spec_path.write_text(
        json.dumps(
            {
                "training_id": "job-1",
                "learner": 1,
                "attempt": 0,
                "api_url": api.url,
                "job_token": TOKEN,
                "state_dir": str(state_dir),
                "report_deadline_s": 10,
            }
        )
    )
    finished = subprocess.run(
        [sys.executable, "-m", "ffdl.learner.controller", str(spec_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert finished.returncode == 0
    final = api.final_status()
    assert final is not None
    assert (final["status"], final["error_code"]) == ("FAILED", "S101")
    assert final["reason"] == "bad learner spec: spec field 'env' is missing"
    result = json.loads((state_dir / "result.json").read_text())
    assert (result["status"], result["error_code"]) == ("FAILED", "S101")


def test_long_lines_are_split_and_bad_bytes_replaced(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    command = (
        "head -c 40000 /dev/zero | tr '\\0' a; echo; "
        "for i in $(seq 1 10000); do printf '\\303\\251'; done; echo; "
        "printf 'bad \\377 byte\\r\\n'"
    )
    assert launch(make_spec(tmp_path, api.url, command)).wait() == 0

    texts = api.log_texts("stdout")
    assert [len(text) for text in texts[:3]] == [16384, 16384, 40000 - 2 * 16384]
    assert set("".join(texts[:3])) == {"a"}
    accented = texts[3:-1]
    assert all(len(text.encode()) <= 16384 for text in accented)
    assert "".join(accented) == "\u00e9" * 10000
    assert texts[-1] == "bad \ufffd byte"
