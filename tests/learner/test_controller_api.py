"""The controller against an API that goes away, fails, loses answers, or asks it to stop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ffdl.learner.reporter import BATCH_MAX_ITEMS

from .test_controller import launch, make_spec, pid_printed, process_alive
from .test_recording_api import RecordingApi, api, wait_until

__all__ = ["api", "launch"]


def assert_delivered_once_in_order(api: RecordingApi, expected: list[str]) -> None:
    assert api.log_texts("stdout") == expected
    seqs = [item["seq"] for item in api.items()]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert api.violations == []


def test_lines_written_while_the_api_is_down_arrive_once_and_in_order(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    resume = tmp_path / "resume"
    command = (
        'for i in $(seq 1 50); do echo "line $i"; done; '
        f"while [ ! -e {resume} ]; do sleep 0.02; done; "
        'for i in $(seq 51 100); do echo "line $i"; done'
    )
    run = launch(make_spec(tmp_path, api.url, command))
    wait_until(lambda: "line 50" in api.log_texts(), what="the first half")

    api.stop()
    resume.touch()
    wait_until(lambda: "line 100" in run.training_log(), what="the second half to be written")
    controller_log = run.state_dir / "controller.log"
    wait_until(
        lambda: "report delivery failing" in controller_log.read_text(),
        what="a failed delivery",
    )
    assert "line 51" not in api.log_texts()
    api.start()

    assert run.wait() == 0
    assert_delivered_once_in_order(api, [f"line {i}" for i in range(1, 101)])
    assert api.statuses()[-1] == "COMPLETED"


def test_503s_and_lost_answers_neither_lose_nor_repeat_lines(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    api.fail_next(503, 2)
    api.lose_responses = 2
    command = 'for i in $(seq 1 1200); do echo "line $i"; done'
    run = launch(make_spec(tmp_path, api.url, command))

    assert run.wait() == 0
    assert_delivered_once_in_order(api, [f"line {i}" for i in range(1, 1201)])
    assert api.statuses() == ["DOWNLOADING", "PROCESSING", "COMPLETED"]
    assert max(len(batch["items"]) for batch in api.batches) <= BATCH_MAX_ITEMS
    delivered_twice = sum(len(b["items"]) for b in api.batches if b["items"]) > 1203
    assert delivered_twice, "lost answers must have caused resends"


def test_cancel_in_an_answer_kills_the_command_at_once(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    command = "trap '' TERM; sleep 60 & echo child $!; echo pid $$; wait"
    run = launch(make_spec(tmp_path, api.url, command, halt_grace_s=30.0))
    child, shell = pid_printed(api, "child"), pid_printed(api, "pid")

    api.cancel = True
    cancelled_at = time.monotonic()

    assert run.wait() == 0
    assert time.monotonic() - cancelled_at < 5.0
    final = api.final_status()
    assert final is not None
    assert (final["status"], final["exit_code"]) == ("CANCELLED", -9)
    assert run.result()["status"] == "CANCELLED"
    assert not process_alive(shell)
    wait_until(lambda: not process_alive(child), what="the command's child to die")


def test_halt_in_an_answer_halts_the_command(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    command = "trap 'echo stopping; exit 0' TERM; echo ready; while true; do sleep 0.05; done"
    run = launch(make_spec(tmp_path, api.url, command))
    wait_until(lambda: "ready" in api.log_texts(), what="the command to start")

    api.halt = True

    assert run.wait() == 0
    assert "stopping" in api.log_texts("stdout")
    final = api.final_status()
    assert final is not None
    assert (final["status"], final["reason"], final["exit_code"]) == ("HALTED", "halted", 0)


def test_a_halt_after_a_clean_exit_still_completes(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    api.halt_after_status = "STORING"
    store = tmp_path / "store"
    command = 'echo done > "$RESULT_DIR/out.txt"'
    run = launch(make_spec(tmp_path, api.url, command, results_target=str(store)))

    assert run.wait() == 0
    assert api.statuses() == ["DOWNLOADING", "PROCESSING", "STORING", "COMPLETED"]
    assert (store / "out.txt").read_text() == "done\n"


def test_a_job_gone_from_the_api_stops_the_command_and_exits(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    command = "sleep 60 & echo child $!; echo pid $$; wait"
    run = launch(make_spec(tmp_path, api.url, command))
    child, shell = pid_printed(api, "child"), pid_printed(api, "pid")

    api.fail_next(404, -1)

    assert run.wait(10) == 1
    result = run.result()
    assert result["status"] == "CANCELLED"
    assert "HTTP 404" in result["reason"]
    assert not process_alive(shell)
    wait_until(lambda: not process_alive(child), what="the command's child to die")
    assert not (run.state_dir / "controller.pid").exists()


def test_an_api_away_past_the_deadline_halts_the_command(
    tmp_path: Path, api: RecordingApi, launch: Any
) -> None:
    api.stop()
    command = "echo pid $$; sleep 60"
    spec = make_spec(tmp_path, api.url, command, report_deadline_s=1.0, halt_grace_s=0.5)
    run = launch(spec)

    assert run.wait(15) == 1
    result = run.result()
    assert (result["status"], result["error_code"]) == ("FAILED", "S201")
    assert "unreachable" in result["reason"]
    shell = int(run.training_log().split()[-1])
    assert not process_alive(shell)
