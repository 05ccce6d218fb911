"""Backing up and restoring a SQLite platform database, while the platform runs or not.

``backup`` copies the live database with SQLite's online backup API in one step: it reads
one consistent moment of the database inside a read transaction (in WAL mode the
platform's writers go on meanwhile) and writes it to a new file. A plain file copy could
catch a page half written, or miss what still sits in the write-ahead log.

``restore`` puts such a copy in place of a home's database. It first checks the copy (a
SQLite file that passes ``PRAGMA quick_check`` and holds ffdl's tables), and refuses:
while a replica of the platform is running on the target, and when the target already
holds jobs, unless forced. It then replaces the database whole: written beside it, then
renamed over it, so the two are never mixed.

A backup holds the database only. The jobs' files (``HOME/jobs``: code archives, results,
checkpoints, logs) and ``HOME/secret.key`` (job tokens and stored credentials are sealed
with it) go with it, copied separately (docs/operator/backups.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

# Tables every ffdl database has, from the first schema on.
_REQUIRED_TABLES = ("jobs", "log_lines", "metrics", "events", "alembic_version")


class BackupError(Exception):
    """A backup or restore that cannot be done; the message names the file and why."""


@dataclass(frozen=True, slots=True)
class DatabaseSummary:
    """What a platform database holds, as a backup or restore reports it."""

    jobs: int
    log_lines: int
    metrics: int
    revision: str
    size_bytes: int

    def describe(self) -> str:
        return (
            f"{self.jobs:,} jobs, {self.log_lines:,} log lines, {self.metrics:,} metrics "
            f"(schema {self.revision}, {self.size_bytes / 2**20:,.1f} MiB)"
        )


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection]:
    if not path.is_file():
        raise BackupError(f"{path}: no such file")
    if not os.access(path, os.R_OK):
        raise BackupError(f"{path}: not readable")
    connection = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        yield connection
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"{path}: not a SQLite database ({exc})") from None
    finally:
        connection.close()


def summarize(path: Path, *, check: bool = False) -> DatabaseSummary:
    """What the ffdl database at ``path`` holds; with ``check``, SQLite's integrity check
    runs first. Raises ``BackupError`` for anything that is not a readable ffdl database."""
    with _read_only(path) as connection:
        if check:
            verdict = connection.execute("PRAGMA quick_check").fetchone()
            if verdict is None or verdict[0] != "ok":
                raise BackupError(f"{path}: damaged ({verdict[0] if verdict else 'no answer'})")
        tables = {
            row[0]
            for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        missing = [name for name in _REQUIRED_TABLES if name not in tables]
        if missing:
            raise BackupError(f"{path}: not an ffdl database (no {', '.join(missing)} table)")
        revision = connection.execute("SELECT version_num FROM alembic_version").fetchone()

        def count(table: str) -> int:
            return int(connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

        return DatabaseSummary(
            jobs=count("jobs"),
            log_lines=count("log_lines"),
            metrics=count("metrics"),
            revision=str(revision[0]) if revision else "none",
            size_bytes=path.stat().st_size,
        )


def backup(source: Path, target: Path, *, force: bool = False) -> DatabaseSummary:
    """Copy the database at ``source`` (running or not) to ``target``; what the copy holds.
    An existing ``target`` is replaced only with ``force``."""
    summarize(source)
    if target.exists() and not force:
        raise BackupError(f"{target}: exists; choose another file, or replace it with --force")
    if not target.parent.is_dir():
        raise BackupError(f"{target.parent}: no such directory")
    partial = _copy_beside(source, target, ".partial")
    os.replace(partial, target)
    return summarize(target, check=True)


def _copy_beside(source: Path, target: Path, suffix: str) -> Path:
    """``source`` copied to a new file beside ``target``, not yet in its place: one step of
    SQLite's backup API (one read transaction, so a copy of one moment), in a single file
    whatever journal mode the source has. The replicas it saw running belong to the
    platform it was taken from: in the copy they are stopped, or a restore would take them
    for running ones."""
    partial = target.with_name(f".{target.name}{suffix}")
    partial.unlink(missing_ok=True)
    with _read_only(source) as connection:
        copy = sqlite3.connect(partial)
        try:
            connection.backup(copy, pages=-1)
            copy.execute("PRAGMA journal_mode=DELETE")
            with copy, contextlib.suppress(sqlite3.OperationalError):  # no replicas table yet
                copy.execute("UPDATE replicas SET stopped_at = seen_at WHERE stopped_at IS NULL")
        except sqlite3.Error as exc:
            partial.unlink(missing_ok=True)
            raise BackupError(f"{target}: could not be written ({exc})") from None
        finally:
            copy.close()
    return partial


def running_replicas(path: Path, *, alive_within: timedelta) -> list[str]:
    """The replicas of the platform seen on the database at ``path`` lately and not
    stopped, as ``id (pid P on HOST)``, leaving out those of this host whose process is
    gone (killed); empty when there is none (or no database)."""
    if not path.exists():
        return []
    since = (datetime.now(UTC).replace(tzinfo=None) - alive_within).isoformat(" ")
    with _read_only(path) as connection:
        try:
            rows = connection.execute(
                "SELECT id, pid, host FROM replicas WHERE stopped_at IS NULL AND seen_at >= ?",
                (since,),
            ).fetchall()
        except sqlite3.OperationalError:
            return []  # a schema from before replicas were recorded
    here = socket.gethostname()
    return [
        f"{replica} (pid {pid} on {host})"
        for replica, pid, host in rows
        if host != here or _process_exists(int(pid))
    ]


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: it exists
    return True


def restore(
    backup_file: Path, target: Path, *, force: bool = False, alive_within: timedelta
) -> DatabaseSummary:
    """Replace the database at ``target`` with the copy ``backup_file``; what it holds now.

    Refused, changing nothing: a copy that is not a sound ffdl database, a target a
    running platform uses, and a target that holds jobs (unless ``force``).
    """
    restored = summarize(backup_file, check=True)
    running = running_replicas(target, alive_within=alive_within)
    if running:
        raise BackupError(
            f"{target}: the platform is running on it ({', '.join(running)}); stop it first"
        )
    if target.exists() and not force:
        held = summarize(target).jobs
        if held:
            raise BackupError(
                f"{target}: already holds {held:,} jobs; restoring replaces them all "
                "(nothing is merged): use --force to do that"
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = _copy_beside(backup_file, target, ".restoring")
    # The old database's write-ahead log and index belong to it alone: left beside the
    # restored file, SQLite would replay them into it.
    for suffix in ("-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    os.replace(partial, target)
    return restored
