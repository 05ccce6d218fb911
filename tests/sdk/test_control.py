"""Tests for halting: SIGTERM and the halt file, observed by real training-like processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ffdl.sdk.api import should_stop

# A stand-in for a training loop: polls should_stop() and exits 0 once it flips.
POLLING_LOOP_SCRIPT = """
import os, signal, sys, time
from pathlib import Path
from ffdl.sdk.api import should_stop

ready_file, chain_previous = Path(sys.argv[1]), sys.argv[2] == "chain"
previous_calls = []
if chain_previous:
    signal.signal(signal.SIGTERM, lambda signum, frame: previous_calls.append(signum))
if should_stop():
    sys.exit(3)
ready_file.touch()
while not should_stop():
    time.sleep(0.005)
print(f"stopped; previous handler calls: {previous_calls}", flush=True)
"""


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def start_polling_loop(tmp_path: Path, *, chain: bool) -> tuple[subprocess.Popen[str], Path]:
    state_dir = tmp_path / "state"
    environment = {**os.environ, "JOB_STATE_DIR": str(state_dir)}
    ready_file = tmp_path / "ready"
    process = subprocess.Popen(
        [sys.executable, "-c", POLLING_LOOP_SCRIPT, str(ready_file), "chain" if chain else "-"],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: ready_file.exists() or process.poll() is not None, 30, "the loop to start")
    assert process.poll() is None, process.communicate()[1]
    return process, state_dir


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        stdout, stderr = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail("the loop did not stop within 30s")
    assert process.returncode == 0, stderr
    return process.returncode, stdout


@pytest.mark.parametrize("chain", [False, True], ids=["default-handler", "chained-handler"])
def test_sigterm_makes_should_stop_true_and_the_loop_exits_zero(
    tmp_path: Path, chain: bool
) -> None:
    process, _ = start_polling_loop(tmp_path, chain=chain)

    process.send_signal(signal.SIGTERM)
    _, stdout = finish(process)

    expected_previous_calls = [int(signal.SIGTERM)] if chain else []
    assert f"stopped; previous handler calls: {expected_previous_calls}" in stdout


def test_halt_file_makes_should_stop_true(tmp_path: Path) -> None:
    process, state_dir = start_polling_loop(tmp_path, chain=False)
    assert process.poll() is None, "keeps looping while nobody asked for a halt"

    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "halt").touch()
    _, stdout = finish(process)

    assert "stopped; previous handler calls: []" in stdout


def test_should_stop_off_the_main_thread_checks_the_halt_file_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("JOB_STATE_DIR", str(tmp_path))
    handler_before = signal.getsignal(signal.SIGTERM)
    answers: list[bool] = []

    def poll_twice() -> None:
        answers.append(should_stop())
        (tmp_path / "halt").touch()
        answers.append(should_stop())

    worker = threading.Thread(target=poll_twice)
    worker.start()
    worker.join(timeout=30)

    assert answers == [False, True]
    assert signal.getsignal(signal.SIGTERM) == handler_before
