"""A learner's files through the API, for a controller on a machine that cannot reach the
platform's disk (the Ray backend's nodes).

``fetch_code`` downloads the job's code archive (``GET /v1/internal/jobs/{id}/code``);
``upload_results`` zips a learner's results (learner 1) and its LOG_DIR, without following
links, and sends them (``PUT /v1/internal/jobs/{id}/learners/{n}/results``): the API
unpacks them into the job's results location, results at the top and the log directory
under ``logs/learner-N/``, exactly where the local backend's STORING step copies them. Both
authenticate with the job token and retry a lost connection or a 502/503/504 for up to
``RETRY_FOR_S``, backing off: long enough to outlast a restart of the control plane, as
the learner's reports do.

Standard library only (``http.client``), because it runs in the controller's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import time
import zipfile
from collections.abc import Callable
from typing import IO, TYPE_CHECKING
from urllib.parse import quote, urlsplit

from ffdl.learner.staging import (
    MEGABYTE,
    PROGRESS_INTERVAL_S,
    CopyStats,
    StagingStopped,
    open_planned,
    plan_tree,
    progress_line,
)

if TYPE_CHECKING:
    import http.client

# Where a learner's LOG_DIR goes in the results: logs/learner-N/.
RESULT_LOGS_DIR = "logs"
ZIP_TYPE = "application/zip"
TIMEOUT_S = 60.0
# An upload's answer comes once the API has unpacked it all: allow for a large one.
UPLOAD_TIMEOUT_S = 600.0
# Retries back off from RETRY_AFTER_S, doubling up to MAX_RETRY_AFTER_S, until RETRY_FOR_S
# have passed since the first try.
RETRY_FOR_S = 120.0
RETRY_AFTER_S = 1.0
MAX_RETRY_AFTER_S = 15.0
# Answers that say the API is restarting or behind a proxy that lost it: worth a retry.
RETRY_STATUSES = frozenset({502, 503, 504})
CHUNK_BYTES = 1 << 20


class RemoteFileError(Exception):
    """A transfer with the API failed; the message names the URL and the HTTP status (or
    the connection's error)."""


class _Retry(Exception):
    """A failure worth another try; its message is the one to raise if none is left."""


def code_url(api_url: str, training_id: str) -> str:
    return f"{api_url.rstrip('/')}/v1/internal/jobs/{quote(training_id, safe='')}/code"


def results_url(api_url: str, training_id: str, learner: int) -> str:
    job = quote(training_id, safe="")
    return f"{api_url.rstrip('/')}/v1/internal/jobs/{job}/learners/{learner}/results"


def _connect(url: str, timeout_s: float, ca_pem: str | None) -> http.client.HTTPConnection:
    import http.client

    from ffdl.core.tls import client_context

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteFileError(f"unusable API URL {url!r}")
    if parts.scheme == "https":
        return http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=timeout_s, context=client_context(ca_pem=ca_pem)
        )
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)


def _target(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _refusal(method: str, url: str, status: int, body: bytes) -> Exception:
    """The error for an answer other than 200: ``_Retry`` for a status worth retrying."""
    try:
        description = json.loads(body).get("description")
    except (ValueError, AttributeError):
        description = None
    detail = description if isinstance(description, str) else body[:200].decode(errors="replace")
    message = f"{method} {url}: HTTP {status}" + (f": {detail}" if detail.strip() else "")
    return _Retry(message) if status in RETRY_STATUSES else RemoteFileError(message)


def _with_retries(method: str, url: str, once: Callable[[], int]) -> int:
    """Run ``once`` until it returns, retrying a lost connection or a retryable status until
    ``RETRY_FOR_S`` have passed."""
    import http.client

    started = time.monotonic()
    delay = RETRY_AFTER_S
    tries = 0
    while True:
        tries += 1
        try:
            return once()
        except _Retry as exc:
            problem = str(exc)
        except (OSError, http.client.HTTPException) as exc:
            problem = f"{method} {url}: {type(exc).__name__}: {exc}"
        waited = time.monotonic() - started
        if waited + delay > RETRY_FOR_S:
            raise RemoteFileError(f"{problem} (tried {tries} times over {waited:.0f} s)")
        time.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_AFTER_S)


def fetch_code(
    api_url: str,
    job_token: str,
    training_id: str,
    destination: str,
    *,
    timeout_s: float = TIMEOUT_S,
    ca_pem: str | None = None,
) -> int:
    """Download the job's code archive to ``destination`` (written under a temporary name
    beside it, renamed when whole); return its size in bytes. ``RemoteFileError`` names the
    URL and the HTTP status when the API refuses (401 bad token, 404, 410 job ended)."""
    url = code_url(api_url, training_id)
    directory = os.path.dirname(os.path.abspath(destination))
    os.makedirs(directory, exist_ok=True)

    def once() -> int:
        connection = _connect(url, timeout_s, ca_pem)
        try:
            connection.request("GET", _target(url), headers=_auth(job_token))
            response = connection.getresponse()
            if response.status != 200:
                raise _refusal("GET", url, response.status, response.read())
            fd, partial = tempfile.mkstemp(prefix=".fetching-", dir=directory)
            try:
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(response, out, CHUNK_BYTES)
                    size = out.tell()
                declared = response.getheader("Content-Length")
                if declared is not None and declared.isdigit() and int(declared) != size:
                    raise _Retry(f"GET {url}: {size} of {declared} bytes arrived")
                os.replace(partial, destination)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(partial)
                raise
            return size
        finally:
            connection.close()

    return _with_retries("GET", url, once)


def _auth(job_token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {job_token}"}


def upload_results(
    api_url: str,
    job_token: str,
    training_id: str,
    learner: int,
    results_dir: str | None,
    log_dir: str | None,
    progress: Callable[[str], None],
    *,
    scratch: str | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    timeout_s: float = UPLOAD_TIMEOUT_S,
    ca_pem: str | None = None,
) -> None:
    """Send ``results_dir`` (learner 1's RESULT_DIR; None for the others) and ``log_dir``
    (under ``logs/learner-N/``) to the API as one zip, built in ``scratch`` (default: the
    system's temporary directory). Links and special files are left out and named in a
    progress line. Raises ``RemoteFileError`` (the API refused, or could not be reached),
    ``StagingStopped`` (``should_stop``) or ``OSError`` (a tree could not be read)."""
    label = "storing results" if learner == 1 else "storing logs"
    trees: list[tuple[str, str]] = []
    if learner == 1 and results_dir and os.path.isdir(results_dir):
        trees.append((results_dir, ""))
    elif learner == 1 and results_dir:
        progress(f"[ffdl] {label}: no results in {results_dir}")
    if log_dir and os.path.isdir(log_dir):
        trees.append((log_dir, f"{RESULT_LOGS_DIR}/learner-{learner}/"))
    if learner != 1 and not trees:
        return
    url = results_url(api_url, training_id, learner)
    with tempfile.TemporaryFile(prefix="results-", suffix=".zip", dir=scratch) as archive:
        _zip_trees(archive, trees, label, progress, should_stop)
        size = archive.tell()
        progress(f"[ffdl] {label}: sending {size / MEGABYTE:.1f} MB to the platform")

        def once() -> int:
            archive.seek(0)
            connection = _connect(url, timeout_s, ca_pem)
            try:
                headers = {
                    **_auth(job_token),
                    "Content-Type": ZIP_TYPE,
                    "Content-Length": str(size),
                }
                body = _Body(archive, should_stop)
                connection.request("PUT", _target(url), body=body, headers=headers)
                response = connection.getresponse()
                answer = response.read()
                if response.status != 200:
                    raise _refusal("PUT", url, response.status, answer)
            finally:
                connection.close()
            counts = json.loads(answer or b"{}")
            files, stored = int(counts.get("files", 0)), int(counts.get("bytes", 0))
            progress(f"[ffdl] {label}: {files} files, {stored / MEGABYTE:.1f} MB stored")
            return files

        _with_retries("PUT", url, once)


class _Body:
    """The zip as ``http.client`` reads it, in blocks: a stop request ends the send."""

    def __init__(self, source: IO[bytes], should_stop: Callable[[], bool]) -> None:
        self._source = source
        self._should_stop = should_stop

    def read(self, size: int = -1) -> bytes:
        if self._should_stop():
            raise StagingStopped()
        return self._source.read(size)


def _zip_trees(
    archive: IO[bytes],
    trees: list[tuple[str, str]],
    label: str,
    progress: Callable[[str], None],
    should_stop: Callable[[], bool],
) -> None:
    """Write each (directory, prefix in the zip) into ``archive``, regular files only."""
    planned = []
    for source, prefix in trees:
        files, directories, left_out = plan_tree(source)
        for relative in sorted(left_out):
            progress(f"[ffdl] {label}: left out {relative}: a link or special file is not copied")
        planned.append((source, prefix, files, directories))
    stats = CopyStats(
        files_total=sum(len(files) for _, _, files, _ in planned),
        bytes_total=sum(st.st_size for _, _, files, _ in planned for _, _, st in files),
    )
    last_report, reported_done = time.monotonic(), -1
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for source, prefix, files, directories in planned:
            if prefix:
                zipped.writestr(_directory_entry(prefix), b"")
            for relative in directories:
                zipped.writestr(_directory_entry(prefix + _zip_name(relative) + "/"), b"")
            root = os.path.realpath(source)
            for path, relative, planned_stat in files:
                if should_stop():
                    raise StagingStopped()
                info = zipfile.ZipInfo(prefix + _zip_name(relative), _zip_time(planned_stat))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = (stat.S_IFREG | stat.S_IMODE(planned_stat.st_mode)) << 16
                source_fd = open_planned(path, planned_stat, root)
                with (
                    os.fdopen(source_fd, "rb") as src,
                    zipped.open(info, "w", force_zip64=True) as out,
                ):
                    shutil.copyfileobj(src, out, CHUNK_BYTES)
                stats.files_done += 1
                stats.bytes_done += planned_stat.st_size
                if time.monotonic() - last_report >= PROGRESS_INTERVAL_S:
                    progress(progress_line(label, stats))
                    last_report, reported_done = time.monotonic(), stats.files_done
    if reported_done != stats.files_done:
        progress(progress_line(label, stats))


def _directory_entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = ((stat.S_IFDIR | 0o755) << 16) | 0x10  # 0x10: MS-DOS directory
    return info


def _zip_name(name: str) -> str:
    # Names that are not UTF-8 reach Python as surrogate escapes, which zip cannot encode.
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _zip_time(status: os.stat_result) -> tuple[int, int, int, int, int, int]:
    # Zip dates run from 1980 to 2107; files from outside that range get the nearest end.
    parts = time.localtime(min(max(status.st_mtime, 315_532_800.0), 4_354_819_199.0))[:6]
    year, month, day, hour, minute, second = parts
    return (max(1980, min(year, 2107)), month, day, hour, minute, second)
