"""No log line is ever dropped: a job printing a million lines through a real server gets
every one, once, in order, with the controller's memory bounded; the full log is stored
with the results; and a server stopped while a job prints loses nothing either."""

from __future__ import annotations

import io
import re
import signal
import sqlite3
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for

LINES = 1_000_000
PRINT_MILLION = "python -c \"import sys; sys.stdout.writelines(f'{i}\\n' for i in range(1000000))\""
# The bound the reporter's docstring and docs/architecture.md state for the controller's peak RSS.
CONTROLLER_RSS_BOUND_KIB = 64 * 1024
# Prints numbered lines, a few hundred at a time, until the test drops ``stop`` into
# JOB_STATE_DIR; then prints how many it printed.
PRINT_UNTIL_STOPPED = """
import os, sys, time
stop = os.path.join(os.environ["JOB_STATE_DIR"], "stop")
i = 0
while not os.path.exists(stop):
    sys.stdout.writelines(f"{n}\\n" for n in range(i, i + 500))
    sys.stdout.flush()
    i += 500
    time.sleep(0.01)
print(f"printed {i}")
"""


def stdout_lines(home: Path, job_id: str) -> list[str]:
    """The job's stdout lines as stored, in stream order, straight from the database."""
    with sqlite3.connect(home / "ffdl.db") as db:
        rows = db.execute(
            "SELECT text FROM log_lines WHERE job_id = ? AND stream = 'stdout' "
            "ORDER BY attempt, learner, seq",
            (job_id,),
        ).fetchall()
    return [text for (text,) in rows]


def ffdl_notes(home: Path, job_id: str) -> list[str]:
    with sqlite3.connect(home / "ffdl.db") as db:
        rows = db.execute(
            "SELECT text FROM log_lines WHERE job_id = ? AND stream = 'ffdl'", (job_id,)
        ).fetchall()
    return [text for (text,) in rows]


def controller_log(home: Path, job_id: str) -> str:
    (path,) = (home / "jobs" / job_id / "learners" / "1").glob("attempt-*/controller.log")
    return path.read_text()


def results_store(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A server config allowing a store, and the manifest's data_stores entry for it."""
    stores = tmp_path / "stores"
    (stores / "in").mkdir(parents=True)
    (stores / "out").mkdir()
    config = {**FAST_CONFIG, "store_paths": [str(stores)]}
    store = {
        "id": "store",
        "type": "local",
        "training_data": {"container": "in"},
        "training_results": {"container": "out"},
        "connection": {"path": str(stores)},
    }
    return config, store


# Serial: its pace is one controller's delivery rate, which other work on the machine halves.
@pytest.mark.slow
@pytest.mark.serial
def test_a_million_lines_arrive_once_in_order_in_bounded_memory(tmp_path: Path) -> None:
    config, store = results_store(tmp_path)
    home = tmp_path / "home"
    with serving(LiveServer(home=home, config=config)) as server:
        job_id = server.submit_ok(manifest_yaml(PRINT_MILLION, gpus=0, data_stores=[store]))
        server.wait_status(job_id, {"COMPLETED"}, timeout=150)

        lines = stdout_lines(home, job_id)
        assert len(lines) == LINES
        assert lines == [str(i) for i in range(LINES)]
        assert not [note for note in ffdl_notes(home, job_id) if "dropped" in note]

        found = re.search(r"peak memory (\d+) kB", controller_log(home, job_id))
        assert found is not None, controller_log(home, job_id)
        assert int(found.group(1)) < CONTROLLER_RSS_BOUND_KIB

        # The whole log is also in the trained model the user downloads.
        response = server.client.get(f"/v1/models/{job_id}/trained_model")
        assert response.status_code == 200, response.text
        with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
            stored = archive.read("logs/learner-1/training-log.txt").decode()
        assert stored.count("\n") == LINES
        assert stored.startswith("0\n1\n2\n") and stored.endswith("\n999999\n")


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_lines_printed_while_the_server_is_down_arrive_once_in_order(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    home = tmp_path / "home"
    server = LiveServer(home=home, config=dict(FAST_CONFIG))
    with serving(server):
        job_id = server.submit_ok(
            manifest_yaml("python job.py", gpus=0), {"job.py": PRINT_UNTIL_STOPPED}
        )
        wait_for(lambda: len(stdout_lines(home, job_id)) >= 2000, timeout=60, what="first lines")

        server.stop(stop_signal)
        log_dir = home / "jobs" / job_id / "logs" / "learner-1"

        def printed() -> int:
            text = (log_dir / "training-log.txt").read_text()
            return text.count("\n")

        during = printed()
        # Down long enough that the controller fails to deliver and keeps printing.
        wait_for(
            lambda: "report delivery failing" in controller_log(home, job_id),
            timeout=30,
            what="a failed delivery",
        )
        # More than the controller holds in memory: the rest goes through its disk spool.
        wait_for(lambda: printed() > during + 100_000, timeout=60, what="lines while down")
        server.start()
        (home / "jobs" / job_id / "state" / "stop").touch()
        server.wait_status(job_id, {"COMPLETED"}, timeout=90)

        lines = stdout_lines(home, job_id)
        total = int(lines[-1].removeprefix("printed "))
        assert total > during + 100_000
        assert lines == [str(i) for i in range(total)] + [f"printed {total}"]
        spooled = re.search(
            r"reports: (\d+) items went through the disk spool", controller_log(home, job_id)
        )
        assert spooled is not None and int(spooled.group(1)) > 0
        # The spool lay in the controller's own directory, never in the job's LOG_DIR; it
        # is gone once delivered.
        (spool,) = (home / "jobs" / job_id / "learners" / "1").glob("attempt-*/spool")
        assert list(spool.iterdir()) == []
        assert sorted(path.name for path in log_dir.iterdir()) == ["training-log.txt"]
