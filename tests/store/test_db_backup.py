"""``ffdl db backup`` and ``ffdl db restore`` through the real command line: a live platform
on SQLite backed up while a job runs, restored into a fresh home where every record is back
and the running job restarts from its checkpoint, and what each command refuses."""

from __future__ import annotations

import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from ffdl.cli.main import app
from tests.integration.live import LiveServer, serving, wait_for
from tests.integration.steps_job import steps_job


def ffdl(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def _records(server: LiveServer, job_id: str) -> tuple[list[str], list[Any]]:
    lines = [item["line"] for item in server.loglines(job_id)]
    metrics = server.client.get(f"/v1/logs/{job_id}/emetrics").json()["models"]
    return lines, metrics


def _database_bytes(home: Path) -> bytes:
    return (home / "ffdl.db").read_bytes()


def test_a_backup_taken_while_a_job_runs_restores_into_a_fresh_home(tmp_path: Path) -> None:
    first_home, second_home = tmp_path / "first", tmp_path / "second"
    saved = tmp_path / "platform-backup.db"
    with serving(LiveServer(home=first_home)) as first:
        manifest, files = steps_job(3, pause=0.05)
        finished = first.submit_ok(manifest, files)
        first.wait_status(finished, {"COMPLETED"}, timeout=60)
        manifest, files = steps_job(100, pause=0.1, max_restarts=2)
        running = first.submit_ok(manifest, files)
        wait_for(
            lambda: "step 5" in _records(first, running)[0], timeout=60, what="the job running"
        )

        made = ffdl("db", "backup", str(saved), "--home", str(first_home))
        assert made.exit_code == 0, made.output
        assert re.search(r"backed up .* in [\d.]+ s: 2 jobs, [\d,]+ log lines", made.stdout)
        assert "secret.key" in made.stdout and str(first_home / "jobs") in made.stdout
        finished_records = _records(first, finished)

        # The file is there now: a second backup does not overwrite it.
        before = saved.read_bytes()
        again = ffdl("db", "backup", str(saved), "--home", str(first_home))
        assert again.exit_code == 1 and f"{saved}: exists" in again.stderr
        assert saved.read_bytes() == before

    # The first platform is gone, its learners killed with it. A fresh home gets the
    # backup, and what the backup said goes with it: the jobs' files and secret.key (and
    # the administrator's client.json, to sign in as before).
    second_home.mkdir()
    # As docs/operator/backups.md says: links, modes and owners kept (the learners' sandbox
    # users own their directories).
    for name in ("jobs", "secret.key", "client.json"):
        subprocess.run(["cp", "-a", str(first_home / name), str(second_home / name)], check=True)
    restored = ffdl("db", "restore", str(saved), "--home", str(second_home))
    assert restored.exit_code == 0, restored.output
    assert "2 jobs" in restored.stdout

    with serving(LiveServer(home=second_home)) as second:
        assert _records(second, finished) == finished_records
        # The job that ran is restarted as after a crash, from its newest checkpoint.
        model = second.wait_status(running, {"COMPLETED"}, timeout=120)
        lines = _records(second, running)[0]
        resumed = [
            int(m.group(1)) for line in lines if (m := re.match(r"learner 1/1 start=(\d+)", line))
        ]
        assert resumed[0] == 0 and resumed[-1] > 0, resumed
        assert model["training"]["training_status"]["status"] == "COMPLETED"

        # Not while the platform runs on it, even forced: nothing changes.
        busy = ffdl("db", "restore", str(saved), "--home", str(second_home), "--force")
        assert busy.exit_code == 1 and "the platform is running on it" in busy.stderr

    held = _database_bytes(second_home)
    refused = ffdl("db", "restore", str(saved), "--home", str(second_home))
    assert refused.exit_code == 1
    assert "already holds 2 jobs" in refused.stderr and "--force" in refused.stderr
    assert _database_bytes(second_home) == held

    forced = ffdl("db", "restore", str(saved), "--home", str(second_home), "--force")
    assert forced.exit_code == 0, forced.output


def test_a_file_that_is_no_ffdl_database_is_refused_naming_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert ffdl("db", "upgrade", "--home", str(home)).exit_code == 0
    held = _database_bytes(home)

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all, " * 100)
    cases = {
        other: f"{other}: not an ffdl database (no jobs, log_lines",
        garbage: f"{garbage}: not a SQLite database",
        tmp_path / "missing.db": f"{tmp_path / 'missing.db'}: no such file",
    }
    for path, reason in cases.items():
        result = ffdl("db", "restore", str(path), "--home", str(home), "--force")
        assert result.exit_code == 1, result.output
        assert reason in result.stderr, result.stderr
        assert _database_bytes(home) == held


def test_postgresql_is_backed_up_with_its_own_tools(tmp_path: Path) -> None:
    url = "postgresql+psycopg://ffdl:secret@127.0.0.1:9/ffdl"
    for command in ("backup", "restore"):
        result = ffdl("db", command, str(tmp_path / "x.db"), "--database-url", url)
        assert result.exit_code == 1
        assert "pg_dump" in result.stderr and "secret" not in result.stderr
