"""A learner's files through the API, for controllers that cannot reach the platform's disk
(``ffdl.learner.remote_files`` is their side): the job's code archive going out, and each
learner's results and logs coming back.

Both answer to the job's token only, and only while the job has not ended: a finished job's
results are final. An upload is a zip, streamed into a temporary file under the jobs
directory (``receive_upload``, at most ``max_archive_bytes``), then checked whole before
anything is written: the entry count and unpacked size (``max_archive_files``,
``max_unpacked_bytes``), names that stay inside, no links, and what the learner may write:
learner 1 the results tree and ``logs/learner-1/``, learner N only ``logs/learner-N/``. It is
unpacked into a fresh directory beside the job's results location, then its entries are
moved in (merging directories, replacing files), so a refused or interrupted upload leaves
nothing behind and a repeated one leaves the same files.

The results location is where the local backend's STORING step puts them: the job's
``results_location`` when it is a host path, else the job's own results directory (where
downloads read them).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import threading
import zipfile
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sqlalchemy import select

from ffdl.core.archive import check_members, extract_members
from ffdl.core.errors import (
    ArchiveError,
    AuthError,
    ConflictError,
    Gone,
    NotFound,
    PayloadTooLarge,
)
from ffdl.core.jobdirs import JobDirs
from ffdl.core.limits import MAX_COUNT, bounded_int
from ffdl.core.status import JobStatus, is_terminal
from ffdl.server.platform import Platform
from ffdl.server.store.models import Job, Learner

# What the user reads in a refusal: the upload, as ``model_definition`` names a submit's.
WHAT = "the results upload"
# Where a learner's LOG_DIR goes in the results (the controller's RESULT_LOGS_DIR).
RESULT_LOGS_DIR = "logs"
_LEARNER_DIR = re.compile(r"learner-\d+")
# Uploads of a job's learners may arrive together; their moves into the one results
# directory take turns (they are renames: short).
_MOVES = threading.Lock()


@dataclass(frozen=True, slots=True)
class StoredFiles:
    files: int
    bytes: int

    def to_json(self) -> dict[str, int]:
        return {"files": self.files, "bytes": self.bytes}


def check_learner_access(
    platform: Platform, job_id: str, token: str | None, learner: int | None = None
) -> None:
    """The job token is the job's (401), the job (and learner) exist (404) and the job has
    not ended (410)."""
    if token is None or not platform.job_tokens.verify(job_id, token):
        raise AuthError("invalid job token")
    if learner is not None:
        bounded_int(learner, "learner", 1, MAX_COUNT)
    with platform.store.read() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        if learner is not None:
            found = session.scalars(
                select(Learner.index).where(Learner.job_id == job_id, Learner.index == learner)
            ).first()
            if found is None:
                raise NotFound(f"no learner {learner} in {job_id}")
        if is_terminal(JobStatus(job.status)):
            raise Gone(f"{job_id} has ended ({job.status}); its files are final")


def code_archive(platform: Platform, job_id: str, token: str | None) -> Path:
    """The job's code archive as submitted (``model.zip``), for its learners."""
    check_learner_access(platform, job_id, token)
    path = JobDirs.of(platform.settings.jobs_dir, job_id).archive
    if not path.is_file():
        raise NotFound(f"the code archive of {job_id} is no longer stored")
    return path


async def receive_upload(
    platform: Platform, chunks: AsyncIterator[bytes], declared: str | None
) -> Path:
    """Write a request body into a new temporary file (the caller removes it); 413 past
    ``max_archive_bytes``, whether declared by Content-Length or found while reading."""
    limit = platform.settings.max_archive_bytes
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"{WHAT} is {declared} bytes; the limit is {limit}")
    fd, name = tempfile.mkstemp(
        prefix=".results-upload-", suffix=".zip", dir=platform.settings.jobs_dir
    )
    try:
        with os.fdopen(fd, "wb") as out:
            received = 0
            async for chunk in chunks:
                received += len(chunk)
                if received > limit:
                    raise PayloadTooLarge(f"{WHAT} exceeds {limit} bytes")
                # Local disk writes of a chunk at a time: short enough for the event loop.
                out.write(chunk)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        raise
    return Path(name)


def results_directory(platform: Platform, job_id: str) -> Path:
    """Where the job's results are kept: its host results location, else its own."""
    with platform.store.read() as session:
        job = session.get(Job, job_id)
        location = job.results_location if job is not None else None
    if location and "://" not in location:
        return Path(location)
    return JobDirs.of(platform.settings.jobs_dir, job_id).results


def store_results(platform: Platform, job_id: str, learner: int, upload: Path) -> StoredFiles:
    """Check the uploaded zip whole, then unpack it into the job's results location."""
    settings = platform.settings
    try:
        archive = zipfile.ZipFile(upload)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"{WHAT} is not a valid zip archive: {exc}") from exc
    with archive:
        infos = check_members(
            archive,
            what=WHAT,
            max_files=settings.max_archive_files,
            max_unpacked_bytes=settings.max_unpacked_bytes,
        )
        for info in infos:
            _check_learner_entry(info.filename, learner)
        target = results_directory(platform, job_id)
        if target.is_symlink():
            raise ConflictError(f"the results location {target} is a link; nothing was stored")
        target.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f".{target.name}.upload-", dir=target.parent))
        try:
            try:
                files, size = extract_members(archive, infos, fresh, WHAT)
            except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
                raise ArchiveError(f"{WHAT} is corrupt: {exc}") from exc
            with _MOVES:
                # The job may have ended while the upload arrived.
                _check_not_ended(platform, job_id)
                _move_in(fresh, target)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
    return StoredFiles(files=files, bytes=size)


def _check_not_ended(platform: Platform, job_id: str) -> None:
    with platform.store.read() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        if is_terminal(JobStatus(job.status)):
            raise Gone(f"{job_id} has ended ({job.status}); its files are final")


def _check_learner_entry(name: str, learner: int) -> None:
    """Learner 1 sends the results and its own logs; learner N only ``logs/learner-N/``."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    own = f"learner-{learner}"
    in_logs = bool(parts) and parts[0] == RESULT_LOGS_DIR
    if learner == 1:
        others = in_logs and len(parts) > 1 and parts[1] != own
        allowed = not (others and _LEARNER_DIR.fullmatch(parts[1]))
    else:
        allowed = in_logs and (len(parts) == 1 or parts[1] == own)
    if not allowed:
        raise ArchiveError(
            f"{WHAT} of learner {learner} holds {name!r}: learner {learner} may send "
            + ("its results and logs/learner-1/" if learner == 1 else f"only logs/{own}/")
        )


def _move_in(source: Path, target: Path) -> None:
    """Move the entries of ``source`` into ``target``: directories merge, anything else
    replaces what is there (a link is replaced, never followed)."""
    for entry in os.scandir(source):
        destination = target / entry.name
        try:
            there = os.lstat(destination)
        except FileNotFoundError:
            there = None
        is_directory = entry.is_dir(follow_symlinks=False)
        if there is not None and stat.S_ISDIR(there.st_mode):
            if is_directory:
                _move_in(Path(entry.path), destination)
                continue
            shutil.rmtree(destination)
        elif there is not None and is_directory:
            destination.unlink()
        os.replace(entry.path, destination)
