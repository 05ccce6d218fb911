"""A controller as it runs on a machine of its own: checkpoints kept in a shared store while
the command runs and restored by the next attempt, results refused by the API, and a
command that never outlives its controller. Real controller subprocesses, reporting over
real HTTP to the recording stand-in."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from ffdl.learner.spec import ObjectLocation

from .test_controller import launch, make_spec, pid_printed, process_alive
from .test_recording_api import RecordingApi, api, wait_until

__all__ = ["api", "launch"]

SAVE_CHECKPOINT = (
    '"$PYTHON" -c "from ffdl.sdk.checkpoint import save_checkpoint; '
    "save_checkpoint(b'weights at step 7', 7)\""
)
LOAD_CHECKPOINT = (
    '"$PYTHON" -c "from ffdl.sdk.checkpoint import load_checkpoint; print(load_checkpoint())"'
)
# A save under way, as the SDK names it until it renames it whole.
PARTIAL = ".ckpt-somehost-4242-0123456789abcdef.tmp"


def test_checkpoints_reach_the_store_while_the_command_runs_and_come_back(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    store = tmp_path / "shared" / "ckpt" / "job-1"
    store.parent.mkdir(parents=True)
    release = tmp_path / "release"
    command = (
        f"{SAVE_CHECKPOINT}; "
        f'echo half-written > "$CHECKPOINT_DIR/{PARTIAL}"; '
        "echo saved; "
        f"while [ ! -e {release} ]; do sleep 0.05; done"
    )
    spec = make_spec(
        tmp_path,
        api.url,
        command,
        checkpoint_store=ObjectLocation(f"file://{store}", {}),
        checkpoint_sync_s=0.2,
    )
    run = launch(spec)
    stored = store / "_wml_checkpoints" / "ckpt-000000007.pt"

    wait_until(stored.exists, what="the checkpoint to reach the store")

    # The command has not ended: the checkpoint went there while it ran.
    assert run.process.poll() is None and not release.exists()
    # The line printed before the wait arrives in its own time: reports are batched, and
    # a sync may reach the store first.
    wait_until(lambda: "saved" in api.log_texts("stdout"), what="the command's line")
    assert run.process.poll() is None
    release.touch()
    assert run.wait() == 0
    assert api.statuses()[-1] == "COMPLETED"
    # A save under way is never stored, and nothing half copied is left in the store.
    assert sorted(p.name for p in stored.parent.iterdir()) == ["ckpt-000000007.pt"]
    assert any("synced checkpoints to file://" in t for t in api.log_texts("ffdl"))

    # The next attempt, on a machine with an empty CHECKPOINT_DIR, resumes from the store.
    checkpoints = Path(spec.env["CHECKPOINT_DIR"])
    shutil.rmtree(checkpoints)
    checkpoints.mkdir()
    again = dataclasses.replace(
        spec, attempt=1, state_dir=str(tmp_path / "state" / "a1"), command=LOAD_CHECKPOINT
    )
    assert launch(again).wait() == 0
    assert "(7, b'weights at step 7')" in api.log_texts("stdout")
    assert any("restored 1 checkpoint files" in t for t in api.log_texts("ffdl"))


def test_a_failing_checkpoint_store_is_told_and_never_fails_the_attempt(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the store's directory should be")
    release = tmp_path / "release"
    command = f"{SAVE_CHECKPOINT}; while [ ! -e {release} ]; do sleep 0.05; done"
    spec = make_spec(
        tmp_path,
        api.url,
        command,
        checkpoint_store=ObjectLocation(f"file://{blocked}/job-1", {}),
        checkpoint_sync_s=0.1,
    )
    run = launch(spec)

    wait_until(
        lambda: any("syncing checkpoints to file://" in t for t in api.log_texts("ffdl")),
        what="the sync's failure to be told",
    )
    release.touch()

    assert run.wait() == 0
    assert api.statuses()[-1] == "COMPLETED"
    told = [t for t in api.log_texts("ffdl") if "syncing checkpoints" in t]
    # Told once while it keeps failing, not at every try.
    assert len(told) == 1


def test_results_the_api_refuses_fail_the_learner_with_s303(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    # The stand-in answers reports only: a results upload (model.txt and the training
    # log) gets 501.
    command = 'echo model > "$RESULT_DIR/model.txt"'
    run = launch(make_spec(tmp_path, api.url, command, results_via_api=True))

    assert run.wait() == 0
    final = api.final_status()
    assert final is not None
    assert (final["status"], final["error_code"]) == ("FAILED", "S303")
    assert "/v1/internal/jobs/job-1/learners/1/results: HTTP 501" in final["reason"]
    assert "[ffdl] storing results: 2/2 files, 0.0/0.0 MB" in api.log_texts("ffdl")


def test_the_command_dies_with_a_killed_controller(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    run = launch(make_spec(tmp_path, api.url, "echo pid $$; sleep 60; echo never"))
    shell = pid_printed(api, "pid")
    assert process_alive(shell)

    # The controller alone, as an agent that dies takes it: not its process group.
    os.kill(run.process.pid, signal.SIGKILL)
    run.process.wait(5)

    wait_until(lambda: not process_alive(shell), what="the command to die with its controller")
