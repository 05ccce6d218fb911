"""The platform home's permissions: private to the platform's own user.

The home holds the database, the platform secret and the admin's client config, and the
job directories under ``jobs/``. Only the platform's user may enter it (0700); the files
that hold secrets are 0600 whatever the umask was when they were made, SQLite's WAL and
shared-memory files included. Learners never see the home: their sandbox binds only their
own job's directories.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ffdl.server.settings import Settings

PRIVATE_FILES = ("secret.key", "client.json", "config.yaml")
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def _sqlite_file(url: str) -> Path | None:
    prefix = "sqlite:///"
    if not url.startswith(prefix) or url == prefix + ":memory:":
        return None
    return Path(url[len(prefix) :])


def secure_home(settings: Settings) -> None:
    """Make the home and jobs directories private and the secret-bearing files 0600."""
    for directory in (settings.home, settings.jobs_dir):
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
    files = [settings.home / name for name in PRIVATE_FILES]
    database = _sqlite_file(settings.db_url)
    if database is not None:
        files += [database.with_name(database.name + suffix) for suffix in SQLITE_SUFFIXES]
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path, 0o600, follow_symlinks=False)
